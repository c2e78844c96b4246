// Attention by chunks merged by their log-sum-exp (pipetrain/parallel/ring_attention.h).
#include "pipetrain/parallel/ring_attention.h"

#include <optional>

#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <torch/torch.h>

#include "pipetrain/base/check.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain::parallel {
namespace {

std::optional<double> scale_of(double scale) {
  return scale > 0 ? std::optional<double>(scale) : std::nullopt;
}

// Query chunks (at positions `query_at` along the sequence) over key chunks (at `key_at`): each
// pair causal_chunk_mask does not skip adds its attention into `partials[a]`.
void attend_pairs(const std::vector<torch::Tensor>& qs, const std::vector<int64_t>& query_at,
                  const std::vector<torch::Tensor>& ks, const std::vector<torch::Tensor>& vs,
                  const std::vector<int64_t>& key_at, std::vector<PartialAttention>& partials) {
  for (size_t a = 0; a < qs.size(); ++a) {
    for (size_t b = 0; b < ks.size(); ++b) {
      const ChunkMask mask = causal_chunk_mask(query_at[a], key_at[b]);
      if (mask != ChunkMask::kSkip)
        merge_partial(partials[a], attend_chunk(qs[a], ks[b], vs[b], mask));
    }
  }
}

// The same pairs' gradients, given each query chunk's merged attention (`wholes`), added into
// dq[a], dk[b] and dv[b] in place (views of a larger tensor add into it).
void attend_pairs_backward(const std::vector<torch::Tensor>& gs,
                           const std::vector<torch::Tensor>& qs,
                           const std::vector<int64_t>& query_at,
                           const std::vector<PartialAttention>& wholes,
                           const std::vector<torch::Tensor>& ks,
                           const std::vector<torch::Tensor>& vs, const std::vector<int64_t>& key_at,
                           std::vector<torch::Tensor>& dq, std::vector<torch::Tensor>& dk,
                           std::vector<torch::Tensor>& dv) {
  for (size_t a = 0; a < qs.size(); ++a) {
    for (size_t b = 0; b < ks.size(); ++b) {
      const ChunkMask mask = causal_chunk_mask(query_at[a], key_at[b]);
      if (mask == ChunkMask::kSkip) continue;
      auto [gq, gk, gv] = attend_chunk_backward(gs[a], qs[a], ks[b], vs[b], wholes[a], mask);
      dq[a].add_(gq);
      dk[b].add_(gk);
      dv[b].add_(gv);
    }
  }
}

std::vector<torch::Tensor> zeros_like_each(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> zeros;
  for (const torch::Tensor& t : tensors) zeros.push_back(torch::zeros_like(t));
  return zeros;
}

// The merged attention of each query chunk, from the saved output and log-sum-exp cut as it.
std::vector<PartialAttention> wholes_of(const torch::Tensor& out, const torch::Tensor& lse,
                                        int64_t chunks) {
  const std::vector<torch::Tensor> outs = out.chunk(chunks, 2), lses = lse.chunk(chunks, 2);
  std::vector<PartialAttention> wholes;
  for (size_t a = 0; a < outs.size(); ++a) {
    wholes.push_back({outs[a].contiguous(), lses[a].contiguous()});
  }
  return wholes;
}

std::vector<int64_t> first(int64_t n) {
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = i;
  return ids;
}

struct ChunkedCausalAttention : torch::autograd::Function<ChunkedCausalAttention> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v, int64_t chunks) {
    std::vector<PartialAttention> partials(static_cast<size_t>(chunks));
    attend_pairs(q.chunk(chunks, 2), first(chunks), k.chunk(chunks, 2), v.chunk(chunks, 2),
                 first(chunks), partials);
    std::vector<torch::Tensor> outs, lses;
    for (const PartialAttention& p : partials) {
      outs.push_back(p.out);
      lses.push_back(p.lse);
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
    std::vector<torch::Tensor> dq = zeros_like_each(qs), dk = zeros_like_each(ks),
                               dv = zeros_like_each(vs);
    attend_pairs_backward(grads[0].contiguous().chunk(chunks, 2), qs, first(chunks),
                          wholes_of(saved[3], saved[4], chunks), ks, vs, first(chunks), dq, dk, dv);
    return {torch::cat(dq, 2), torch::cat(dk, 2), torch::cat(dv, 2), torch::Tensor()};
  }
};

// Tensors of one shape as one row, and back: what a ring pass carries.
torch::Tensor pack(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> rows;
  for (const torch::Tensor& t : tensors) rows.push_back(t.reshape({1, -1}));
  return torch::cat(rows, 1);
}
std::vector<torch::Tensor> unpack(const torch::Tensor& row, const torch::Tensor& like) {
  const int64_t n = like.numel();
  std::vector<torch::Tensor> tensors;
  for (int64_t at = 0; at < row.size(1); at += n) {
    tensors.push_back(row.narrow(1, at, n).reshape(like.sizes()));
  }
  return tensors;
}

struct RingAttention : torch::autograd::Function<RingAttention> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v, C10dGroup* group) {
    const int r = group->rank(), n = group->size();
    const std::vector<torch::Tensor> qs = q.chunk(2, 2);
    std::vector<PartialAttention> partials(2);
    std::vector<torch::Tensor> held{k.contiguous(), v.contiguous()};
    for (int s = 0; s < n; ++s) {
      attend_pairs(qs, zigzag_chunks(r, n), held[0].chunk(2, 2), held[1].chunk(2, 2),
                   zigzag_chunks((r - s + n) % n, n), partials);
      if (s + 1 < n) held = unpack(ring_pass(pack(held), *group), k);
    }
    const torch::Tensor out = torch::cat({partials[0].out, partials[1].out}, 2);
    ctx->save_for_backward({q, k, v, out, torch::cat({partials[0].lse, partials[1].lse}, 2)});
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto* group = reinterpret_cast<C10dGroup*>(ctx->saved_data["group"].toInt());
    const int r = group->rank(), n = group->size();
    const std::vector<torch::Tensor> qs = saved[0].chunk(2, 2);
    const std::vector<PartialAttention> wholes = wholes_of(saved[3], saved[4], 2);
    const std::vector<torch::Tensor> gs = grads[0].contiguous().chunk(2, 2);
    std::vector<torch::Tensor> dq = zeros_like_each(qs);
    // k, v and the dk, dv accumulated for them so far travel together; the gradients come home
    // after the n-th pass, when the block itself no longer needs to move.
    const torch::Tensor like = saved[1];
    std::vector<torch::Tensor> held{saved[1].contiguous(), saved[2].contiguous(),
                                    torch::zeros_like(like), torch::zeros_like(like)};
    for (int s = 0; s < n; ++s) {
      std::vector<torch::Tensor> dk = held[2].chunk(2, 2), dv = held[3].chunk(2, 2);
      attend_pairs_backward(gs, qs, zigzag_chunks(r, n), wholes, held[0].chunk(2, 2),
                            held[1].chunk(2, 2), zigzag_chunks((r - s + n) % n, n), dq, dk, dv);
      if (s + 1 < n) {
        held = unpack(ring_pass(pack(held), *group), like);
      } else {
        const std::vector<torch::Tensor> home =
            unpack(ring_pass(pack({held[2], held[3]}), *group), like);
        held[2] = home[0];
        held[3] = home[1];
      }
    }
    return {torch::cat(dq, 2), held[2], held[3], torch::Tensor()};
  }
};

// [B, H, t, D] with the sequence cut over the members -> [B, H/C, C t, D] with the heads cut, and
// back: equal all-to-alls of the group (the backward of each is the other).
torch::Tensor sequence_to_heads(const torch::Tensor& x, C10dGroup& group) {
  const int64_t c = group.size();
  const int64_t b = x.size(0), h = x.size(1), t = x.size(2), d = x.size(3);
  const torch::Tensor send = x.reshape({b, c, h / c, t, d}).permute({1, 0, 2, 3, 4}).contiguous();
  torch::Tensor got = torch::empty_like(send);  // [source's sequence chunk, B, H/C, t, D]
  group.all_to_all(send, got);
  return got.permute({1, 2, 0, 3, 4}).reshape({b, h / c, c * t, d});
}
torch::Tensor heads_to_sequence(const torch::Tensor& y, C10dGroup& group) {
  const int64_t c = group.size();
  const int64_t b = y.size(0), g = y.size(1), t = y.size(2) / c, d = y.size(3);
  const torch::Tensor send = y.reshape({b, g, c, t, d}).permute({2, 0, 1, 3, 4}).contiguous();
  torch::Tensor got = torch::empty_like(send);  // [source's head group, B, H/C, t, D]
  group.all_to_all(send, got);
  return got.permute({1, 0, 2, 3, 4}).reshape({b, c * g, t, d});
}

struct SequenceToHeads : torch::autograd::Function<SequenceToHeads> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               C10dGroup* group, bool to_heads) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["to_heads"] = to_heads;
    return to_heads ? sequence_to_heads(x, *group) : heads_to_sequence(x, *group);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* group = reinterpret_cast<C10dGroup*>(ctx->saved_data["group"].toInt());
    const bool to_heads = ctx->saved_data["to_heads"].toBool();
    const torch::Tensor g = grads[0].contiguous();
    return {to_heads ? heads_to_sequence(g, *group) : sequence_to_heads(g, *group), torch::Tensor(),
            torch::Tensor()};
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

std::vector<int64_t> zigzag_chunks(int rank, int size) {
  return {rank, 2 * static_cast<int64_t>(size) - 1 - rank};
}

torch::Tensor ring_pass(const torch::Tensor& block, C10dGroup& group) {
  const int n = group.size();
  if (n == 1) return block;
  std::vector<int64_t> send(static_cast<size_t>(n), 0), receive(static_cast<size_t>(n), 0);
  send[static_cast<size_t>((group.rank() + 1) % n)] += 1;
  receive[static_cast<size_t>((group.rank() + n - 1) % n)] += 1;
  const torch::Tensor rows = block.contiguous().reshape({1, -1});
  torch::Tensor out = torch::empty_like(rows);
  group.all_to_all(rows, send, out, receive);  // with 2 members, next and previous are one
  return out.reshape(block.sizes());
}

torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             C10dGroup& group) {
  PIPETRAIN_CHECK_INPUT(
      q.dim() == 4 && k.sizes() == q.sizes() && v.sizes() == q.sizes() && q.size(2) % 2 == 0,
      "ring_attention takes this member's two chunks of q, k, v of one shape "
      "[B, H, 2t, D], got ",
      q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  return RingAttention::apply(q, k, v, &group);
}

torch::Tensor ulysses_attention(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, C10dGroup& group) {
  PIPETRAIN_CHECK_INPUT(q.dim() == 4 && k.sizes() == q.sizes() && v.sizes() == q.sizes(),
                        "ulysses_attention takes q, k, v of one shape [B, H, T/C, D], got ",
                        q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  PIPETRAIN_CHECK_INPUT(q.size(1) % group.size() == 0, "Ulysses over ", group.size(),
                        " members cuts the heads between them, and ", group.size(),
                        " does not divide the ", q.size(1), " heads");
  auto to_heads = [&](const torch::Tensor& x) { return SequenceToHeads::apply(x, &group, true); };
  const torch::Tensor out =
      torch::scaled_dot_product_attention(to_heads(q), to_heads(k), to_heads(v), {}, 0.0, true);
  return SequenceToHeads::apply(out, &group, false);
}

int ContextParallel::size() const {
  return group ? group->size() : 1;
}
int ContextParallel::rank() const {
  return group ? group->rank() : 0;
}

torch::Tensor ContextParallel::positions(int64_t length) const {
  const int64_t r = rank(), c = size();
  if (ulysses) return torch::arange(r * length, (r + 1) * length, torch::kLong);
  PIPETRAIN_CHECK_INPUT(length % 2 == 0, "ring attention holds two chunks of a sequence, and ",
                        length, " tokens do not cut into two");
  const int64_t chunk = length / 2;
  return torch::cat({torch::arange(r * chunk, (r + 1) * chunk, torch::kLong),
                     torch::arange((2 * c - 1 - r) * chunk, (2 * c - r) * chunk, torch::kLong)});
}

torch::Tensor ContextParallel::attend(const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& v) const {
  PIPETRAIN_CHECK_INPUT(group != nullptr, "ContextParallel::attend without a group");
  return ulysses ? ulysses_attention(q, k, v, *group) : ring_attention(q, k, v, *group);
}

}  // namespace pipetrain::parallel
