// The tensors of packed rows (data/token_rows.h).
#include "pipetrain/data/token_rows.h"

#include <algorithm>

#include <torch/torch.h>

#include "pipetrain/base/error.h"

namespace pipetrain::data {

Batch make_token_batch(const std::vector<SourcedRow>& rows, const TokenRowOptions& options) {
  const int64_t t = options.seq_len;
  const auto n = static_cast<int64_t>(rows.size());
  if (n < 1 || t < 1) throw BadInput("a token batch needs rows and a sequence length >= 1");
  int64_t longest = 1;
  for (const SourcedRow& sourced : rows) {
    const int64_t ids = row_ids(sourced.row);
    if (ids > t + 1) {
      throw BadInput("a packed row holds " + std::to_string(ids) + " ids, more than --seq-len " +
                     std::to_string(t) + " + 1");
    }
    longest = std::max(longest, ids - 1);
  }
  const int64_t multiple = std::max<int64_t>(1, options.pad_multiple);
  const int64_t width = options.fixed_width ? padded_width(t, multiple, INT64_MAX)
                                            : padded_width(longest, multiple, INT64_MAX);
  torch::Tensor inputs = torch::full({n, width}, options.pad_id, torch::kInt64);
  torch::Tensor targets = torch::full({n, width}, kIgnoredTarget, torch::kInt64);
  torch::Tensor weights = torch::zeros({n}, torch::kFloat64);
  int64_t* in = inputs.data_ptr<int64_t>();
  int64_t* out = targets.data_ptr<int64_t>();
  double* weight = weights.data_ptr<double>();
  std::vector<std::vector<int64_t>> segments(static_cast<size_t>(n));
  std::vector<int64_t> ids, mask;
  std::vector<int64_t> piece_of;  // per id of the row: its piece
  for (int64_t r = 0; r < n; ++r) {
    const SourcedRow& sourced = rows[static_cast<size_t>(r)];
    const int64_t total = row_ids(sourced.row);
    ids.resize(static_cast<size_t>(total));
    mask.resize(static_cast<size_t>(total));
    piece_of.resize(static_cast<size_t>(total));
    int64_t at = 0;
    for (size_t p = 0; p < sourced.row.size(); ++p) {
      const Piece& piece = sourced.row[p];
      sourced.dataset->read(piece, ids.data() + at, mask.data() + at);
      std::fill(piece_of.begin() + at, piece_of.begin() + at + piece.length,
                static_cast<int64_t>(p));
      // As input positions: the row's last id is a target only.
      const int64_t positions = std::min(piece.length, total - 1 - at);
      if (positions > 0) segments[static_cast<size_t>(r)].push_back(positions);
      at += piece.length;
    }
    int64_t* row_in = in + r * width;
    int64_t* row_out = out + r * width;
    int64_t counted = 0;
    for (int64_t k = 0; k + 1 < total; ++k) {
      row_in[k] = ids[static_cast<size_t>(k)];
      if (piece_of[static_cast<size_t>(k)] == piece_of[static_cast<size_t>(k) + 1] &&
          mask[static_cast<size_t>(k) + 1] != 0) {
        row_out[k] = ids[static_cast<size_t>(k) + 1];
        ++counted;
      }
    }
    weight[r] = static_cast<double>(counted);
  }
  Batch batch(inputs, targets);
  batch.weights = weights;
  batch.layout =
      std::make_shared<const SequenceLayout>(std::move(segments), width, options.by_document);
  batch.pad_multiple = multiple;
  return batch;
}

}  // namespace pipetrain::data
