// Attention by document (models/document_attention.h).
#include "pipetrain/models/document_attention.h"

#include <torch/torch.h>

#include "pipetrain/base/check.h"

namespace pipetrain::models {

torch::Tensor document_causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                                        const torch::Tensor& v, const data::SequenceLayout& layout,
                                        double scale) {
  const int64_t b = q.size(0), t = q.size(2);
  PIPETRAIN_CHECK_INPUT(layout.rows() == b && layout.width() == t, "attention over [", b, " rows, ",
                        t, " tokens] was given the layout of ", layout.describe());
  const bool gqa = k.size(1) != q.size(1);
  auto attend = [&](const torch::Tensor& qs, const torch::Tensor& ks, const torch::Tensor& vs) {
    return at::scaled_dot_product_attention(qs, ks, vs, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                            /*is_causal=*/true, scale, gqa);
  };
  if (layout.one_segment_per_row()) return attend(q, k, v);
  std::vector<torch::Tensor> rows;
  rows.reserve(static_cast<size_t>(b));
  for (int64_t r = 0; r < b; ++r) {
    const torch::Tensor qr = q.narrow(0, r, 1), kr = k.narrow(0, r, 1), vr = v.narrow(0, r, 1);
    std::vector<torch::Tensor> pieces;
    int64_t start = 0;
    for (int64_t length : layout.segments(r)) {
      pieces.push_back(attend(qr.narrow(2, start, length), kr.narrow(2, start, length),
                              vr.narrow(2, start, length)));
      start += length;
    }
    if (start < t)
      pieces.push_back(torch::zeros({1, q.size(1), t - start, q.size(3)}, q.options()));
    rows.push_back(pieces.size() == 1 ? pieces[0] : torch::cat(pieces, 2));
  }
  return b == 1 ? rows[0] : torch::cat(rows, 0);
}

torch::Tensor rotary_at_positions(const torch::Tensor& table, const data::SequenceLayout& layout) {
  const torch::Tensor positions = layout.positions(table.device()).reshape({-1});
  return table.index_select(0, positions)
      .view({layout.rows(), layout.width(), table.size(1)})
      .unsqueeze(1);
}

}  // namespace pipetrain::models
