// Attention by chunks merged by their log-sum-exp (pipetrain/parallel/ring_attention.h).
#include "pipetrain/parallel/ring_attention.h"

#include <optional>

#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <torch/torch.h>

#include "pipetrain/base/check.h"

namespace pipetrain::parallel {
namespace {

std::optional<double> scale_of(double scale) {
  return scale > 0 ? std::optional<double>(scale) : std::nullopt;
}

struct ChunkedCausalAttention : torch::autograd::Function<ChunkedCausalAttention> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v, int64_t chunks) {
    const std::vector<torch::Tensor> qs = q.chunk(chunks, 2);
    const std::vector<torch::Tensor> ks = k.chunk(chunks, 2);
    const std::vector<torch::Tensor> vs = v.chunk(chunks, 2);
    std::vector<torch::Tensor> outs, lses;
    for (int64_t i = 0; i < chunks; ++i) {
      PartialAttention whole;
      for (int64_t j = 0; j < chunks; ++j) {
        const ChunkMask mask = causal_chunk_mask(i, j);
        if (mask == ChunkMask::kSkip) continue;
        merge_partial(whole, attend_chunk(qs[static_cast<size_t>(i)], ks[static_cast<size_t>(j)],
                                          vs[static_cast<size_t>(j)], mask));
      }
      outs.push_back(whole.out);
      lses.push_back(whole.lse);
    }
    const torch::Tensor out = torch::cat(outs, 2);
    ctx->save_for_backward({q, k, v, out, torch::cat(lses, 2)});
    ctx->saved_data["chunks"] = chunks;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t chunks = ctx->saved_data["chunks"].toInt();
    const std::vector<torch::Tensor> qs = saved[0].chunk(chunks, 2);
    const std::vector<torch::Tensor> ks = saved[1].chunk(chunks, 2);
    const std::vector<torch::Tensor> vs = saved[2].chunk(chunks, 2);
    const std::vector<torch::Tensor> outs = saved[3].chunk(chunks, 2);
    const std::vector<torch::Tensor> lses = saved[4].chunk(chunks, 2);
    const std::vector<torch::Tensor> gs = grads[0].contiguous().chunk(chunks, 2);
    std::vector<torch::Tensor> dq(static_cast<size_t>(chunks)), dk(static_cast<size_t>(chunks)),
        dv(static_cast<size_t>(chunks));
    for (int64_t i = 0; i < chunks; ++i) {
      const auto a = static_cast<size_t>(i);
      dq[a] = torch::zeros_like(qs[a]);
      dk[a] = torch::zeros_like(ks[a]);
      dv[a] = torch::zeros_like(vs[a]);
    }
    for (int64_t i = 0; i < chunks; ++i) {
      const auto a = static_cast<size_t>(i);
      const PartialAttention whole{outs[a].contiguous(), lses[a].contiguous()};
      for (int64_t j = 0; j < chunks; ++j) {
        const ChunkMask mask = causal_chunk_mask(i, j);
        if (mask == ChunkMask::kSkip) continue;
        const auto b = static_cast<size_t>(j);
        auto [gq, gk, gv] = attend_chunk_backward(gs[a], qs[a], ks[b], vs[b], whole, mask);
        dq[a] += gq;
        dk[b] += gk;
        dv[b] += gv;
      }
    }
    return {torch::cat(dq, 2), torch::cat(dk, 2), torch::cat(dv, 2), torch::Tensor()};
  }
};

}  // namespace

ChunkMask causal_chunk_mask(int64_t query_chunk, int64_t key_chunk) {
  if (key_chunk < query_chunk) return ChunkMask::kFull;
  return key_chunk == query_chunk ? ChunkMask::kCausal : ChunkMask::kSkip;
}

PartialAttention attend_chunk(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, ChunkMask mask, double scale) {
  PIPETRAIN_CHECK_INPUT(mask != ChunkMask::kSkip, "attend_chunk of a chunk pair that is skipped");
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(
      q.contiguous(), k.contiguous(), v.contiguous(), 0.0, mask == ChunkMask::kCausal, {},
      scale_of(scale));
  return {out, lse};
}

void merge_partial(PartialAttention& into, const PartialAttention& part) {
  if (!into.out.defined()) {
    into = part;
    return;
  }
  const torch::Tensor most = torch::maximum(into.lse, part.lse);
  const torch::Tensor a = torch::exp(into.lse - most);
  const torch::Tensor b = torch::exp(part.lse - most);
  const torch::Tensor sum = a + b;
  into.out = (into.out * (a / sum).unsqueeze(-1).to(into.out.scalar_type()) +
              part.out * (b / sum).unsqueeze(-1).to(part.out.scalar_type()));
  into.lse = most + torch::log(sum);
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> attend_chunk_backward(
    const torch::Tensor& grad_out, const torch::Tensor& q, const torch::Tensor& k,
    const torch::Tensor& v, const PartialAttention& whole, ChunkMask mask, double scale) {
  PIPETRAIN_CHECK_INPUT(mask != ChunkMask::kSkip,
                        "attend_chunk_backward of a chunk pair that is skipped");
  return at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad_out.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), whole.out, whole.lse,
      0.0, mask == ChunkMask::kCausal, {}, scale_of(scale));
}

torch::Tensor chunked_causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                                       const torch::Tensor& v, int64_t chunks) {
  PIPETRAIN_CHECK_INPUT(q.dim() == 4 && k.sizes() == q.sizes() && v.sizes() == q.sizes(),
                        "chunked_causal_attention takes q, k, v of one shape [B, H, T, D], got ",
                        q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  PIPETRAIN_CHECK_INPUT(chunks >= 1 && q.size(2) % chunks == 0, "a sequence of ", q.size(2),
                        " positions does not cut into ", chunks, " chunks of equal length");
  return ChunkedCausalAttention::apply(q, k, v, chunks);
}

}  // namespace pipetrain::parallel
