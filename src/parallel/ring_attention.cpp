// Attention by chunks merged by their log-sum-exp (pipetrain/parallel/ring_attention.h).
#include "pipetrain/parallel/ring_attention.h"

#include <chrono>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>

#include <ATen/autocast_mode.h>
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
// pair pair_mask does not skip adds its attention into `partials[a]`. `segments`: the whole
// rows' document ids, or undefined.
void attend_pairs(const std::vector<torch::Tensor>& qs, const std::vector<int64_t>& query_at,
                  const std::vector<torch::Tensor>& ks, const std::vector<torch::Tensor>& vs,
                  const std::vector<int64_t>& key_at, const torch::Tensor& segments,
                  std::vector<PartialAttention>& partials) {
  for (size_t a = 0; a < qs.size(); ++a) {
    for (size_t b = 0; b < ks.size(); ++b) {
      const PairMask mask =
          pair_mask(segments, query_at[a], key_at[b], qs[a].size(2), qs[a].scalar_type());
      if (mask.chunks != ChunkMask::kSkip)
        merge_partial(partials[a], attend_chunk(qs[a], ks[b], vs[b], mask.chunks, 0, mask.bias));
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
                           const torch::Tensor& segments, std::vector<torch::Tensor>& dq,
                           std::vector<torch::Tensor>& dk, std::vector<torch::Tensor>& dv) {
  for (size_t a = 0; a < qs.size(); ++a) {
    for (size_t b = 0; b < ks.size(); ++b) {
      const PairMask mask =
          pair_mask(segments, query_at[a], key_at[b], qs[a].size(2), qs[a].scalar_type());
      if (mask.chunks == ChunkMask::kSkip) continue;
      auto [gq, gk, gv] =
          attend_chunk_backward(gs[a], qs[a], ks[b], vs[b], wholes[a], mask.chunks, 0, mask.bias);
      dq[a].add_(gq);
      dk[b].add_(gk);
      dv[b].add_(gv);
    }
  }
}

void check_segments(const torch::Tensor& segments, const torch::Tensor& q, int64_t width) {
  PIPETRAIN_CHECK_INPUT(
      !segments.defined() || (segments.dim() == 2 && segments.size(0) == q.size(0) &&
                              segments.size(1) == width && segments.scalar_type() == torch::kLong),
      "attention by document takes the rows' segment ids as int64 [", q.size(0), ", ", width,
      "], got ", segments.defined() ? c10::str(segments.sizes()) : "");
}

// The query chunks' merged attentions along the sequence. A chunk that attended nothing (all
// its pairs skipped: padding only) is output 0, lse -inf.
PartialAttention joined(const std::vector<PartialAttention>& partials,
                        const std::vector<torch::Tensor>& qs) {
  std::vector<torch::Tensor> outs, lses;
  for (size_t a = 0; a < partials.size(); ++a) {
    if (partials[a].out.defined()) {
      outs.push_back(partials[a].out);
      lses.push_back(partials[a].lse);
      continue;
    }
    const torch::Tensor& q = qs[a];
    outs.push_back(torch::zeros_like(q));
    lses.push_back(torch::full({q.size(0), q.size(1), q.size(2)},
                               -std::numeric_limits<double>::infinity(),
                               q.options().dtype(torch::kFloat)));
  }
  return {torch::cat(outs, 2), torch::cat(lses, 2)};
}

// The forward's end, chunked or ring: the query chunks' attention joined, and what the backward
// takes (q, k, v, the output and its lse; the segment ids where there are documents). Returns
// the output.
torch::Tensor saved_attention(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                              const torch::Tensor& k, const torch::Tensor& v,
                              const std::vector<PartialAttention>& partials,
                              const std::vector<torch::Tensor>& qs, const torch::Tensor& segments) {
  const PartialAttention whole = joined(partials, qs);
  ctx->save_for_backward({q, k, v, whole.out, whole.lse});
  if (segments.defined()) ctx->saved_data["segments"] = segments;
  return whole.out;
}

torch::Tensor segments_of(torch::autograd::AutogradContext* ctx) {
  const auto found = ctx->saved_data.find("segments");
  return found == ctx->saved_data.end() ? torch::Tensor() : found->second.toTensor();
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
                               const torch::Tensor& k, const torch::Tensor& v, int64_t chunks,
                               const torch::Tensor* segments_given) {
    // (A pointer: Function::apply takes every tensor argument for an input, defined or not.)
    const torch::Tensor segments = *segments_given;
    std::vector<PartialAttention> partials(static_cast<size_t>(chunks));
    attend_pairs(q.chunk(chunks, 2), first(chunks), k.chunk(chunks, 2), v.chunk(chunks, 2),
                 first(chunks), segments, partials);
    ctx->saved_data["chunks"] = chunks;
    return saved_attention(ctx, q, k, v, partials, q.chunk(chunks, 2), segments);
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
                          wholes_of(saved[3], saved[4], chunks), ks, vs, first(chunks),
                          segments_of(ctx), dq, dk, dv);
    return {torch::cat(dq, 2), torch::cat(dk, 2), torch::cat(dv, 2), torch::Tensor(),
            torch::Tensor()};
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

std::mutex ring_mutex;
RingStats ring_totals;  // guarded by ring_mutex

// Waits for `pass`, adding the seconds it took to the process's ring statistics.
void timed_wait(const RingPass& pass) {
  const auto begin = std::chrono::steady_clock::now();
  if (pass.wait) pass.wait();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  const std::lock_guard<std::mutex> lock(ring_mutex);
  ring_totals.wait_seconds += seconds;
}

struct RingAttention : torch::autograd::Function<RingAttention> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v, C10dGroup* group,
                               const torch::Tensor* segments_given, bool overlap) {
    const torch::Tensor segments = *segments_given;
    const int r = group->rank(), n = group->size();
    const std::vector<torch::Tensor> qs = q.chunk(2, 2);
    std::vector<PartialAttention> partials(2);
    std::vector<torch::Tensor> held{k.contiguous(), v.contiguous()};
    for (int s = 0; s < n; ++s) {
      // Overlapped: the block goes on to the next member while this one attends to it.
      RingPass next;
      if (overlap && s + 1 < n) next = ring_pass_start(pack(held), *group);
      attend_pairs(qs, zigzag_chunks(r, n), held[0].chunk(2, 2), held[1].chunk(2, 2),
                   zigzag_chunks((r - s + n) % n, n), segments, partials);
      if (s + 1 < n) {
        if (!overlap) next = ring_pass_start(pack(held), *group);
        timed_wait(next);
        held = unpack(next.received, k);
      }
    }
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["overlap"] = overlap;
    return saved_attention(ctx, q, k, v, partials, qs, segments);
  }

  // Block b_s (member r - s's) is held at step s. Its k, v go on to the next member while this one
  // computes its gradients; the dk, dv that members before summed for it arrive meanwhile, are
  // added, and go on after the step (the last step's to the block's own member).
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto* group = reinterpret_cast<C10dGroup*>(ctx->saved_data["group"].toInt());
    const bool overlap = ctx->saved_data["overlap"].toBool();
    const torch::Tensor segments = segments_of(ctx);
    const int r = group->rank(), n = group->size();
    const std::vector<torch::Tensor> qs = saved[0].chunk(2, 2);
    const std::vector<PartialAttention> wholes = wholes_of(saved[3], saved[4], 2);
    const std::vector<torch::Tensor> gs = grads[0].contiguous().chunk(2, 2);
    std::vector<torch::Tensor> dq = zeros_like_each(qs);
    const torch::Tensor like = saved[1];
    std::vector<torch::Tensor> held{saved[1].contiguous(), saved[2].contiguous()};
    RingPass gradients;  // the dk, dv on their way: sent after step s - 1, for block b_s
    for (int s = 0; s < n; ++s) {
      RingPass next;
      if (overlap && s + 1 < n) next = ring_pass_start(pack(held), *group);
      torch::Tensor dk = torch::zeros_like(like), dv = torch::zeros_like(like);
      std::vector<torch::Tensor> dks = dk.chunk(2, 2), dvs = dv.chunk(2, 2);
      attend_pairs_backward(gs, qs, zigzag_chunks(r, n), wholes, held[0].chunk(2, 2),
                            held[1].chunk(2, 2), zigzag_chunks((r - s + n) % n, n), segments, dq,
                            dks, dvs);
      if (s > 0) {
        timed_wait(gradients);
        const std::vector<torch::Tensor> before = unpack(gradients.received, like);
        dk.add_(before[0]);
        dv.add_(before[1]);
      }
      gradients = ring_pass_start(pack({dk, dv}), *group);
      if (!overlap) timed_wait(gradients);
      if (s + 1 < n) {
        if (!overlap) next = ring_pass_start(pack(held), *group);
        timed_wait(next);
        held = unpack(next.received, like);
      }
    }
    timed_wait(gradients);
    const std::vector<torch::Tensor> home = unpack(gradients.received, like);
    return {torch::cat(dq, 2), home[0], home[1], torch::Tensor(), torch::Tensor(), torch::Tensor()};
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

PairMask pair_mask(const torch::Tensor& segments, int64_t query_chunk, int64_t key_chunk, int64_t t,
                   torch::ScalarType dtype) {
  PairMask mask;
  mask.chunks = causal_chunk_mask(query_chunk, key_chunk);
  if (!segments.defined() || mask.chunks == ChunkMask::kSkip) return mask;
  const torch::Tensor queries = segments.narrow(1, query_chunk * t, t).unsqueeze(2);
  const torch::Tensor keys = segments.narrow(1, key_chunk * t, t).unsqueeze(1);
  torch::Tensor allowed = queries.eq(keys).logical_and_(queries.ge(0));  // [B, t, t]
  if (mask.chunks == ChunkMask::kCausal) allowed = allowed.tril();
  if (!allowed.any().item<bool>()) {
    mask.chunks = ChunkMask::kSkip;  // no query shares a document with a key
    return mask;
  }
  const torch::Tensor causal_only = mask.chunks == ChunkMask::kCausal
                                        ? torch::ones({t, t}, torch::kBool).tril()
                                        : torch::Tensor();
  if (causal_only.defined() ? allowed.eq(causal_only).all().item<bool>()
                            : allowed.all().item<bool>()) {
    return mask;  // the chunks' own mask says it all
  }
  mask.chunks = ChunkMask::kFull;
  mask.bias = torch::zeros(allowed.sizes(), torch::TensorOptions().dtype(dtype))
                  .masked_fill_(allowed.logical_not(), -std::numeric_limits<double>::infinity())
                  .unsqueeze(1);
  return mask;
}

PartialAttention attend_chunk(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, ChunkMask mask, double scale,
                              const torch::Tensor& bias) {
  PIPETRAIN_CHECK_INPUT(mask != ChunkMask::kSkip, "attend_chunk of a chunk pair that is skipped");
  PIPETRAIN_CHECK_INPUT(!bias.defined() || mask == ChunkMask::kFull,
                        "attend_chunk's bias carries the causal mask itself (give kFull)");
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(
      q.contiguous(), k.contiguous(), v.contiguous(), 0.0, mask == ChunkMask::kCausal,
      bias.defined() ? std::optional<torch::Tensor>(bias.to(q.device())) : std::nullopt,
      scale_of(scale));
  if (bias.defined()) {
    // The kernel leaves a query with no allowed key at output 0 and lse 0: it adds nothing.
    const torch::Tensor none = bias.isneginf().all(-1).to(lse.device());  // [B, 1, tq]
    lse = lse.masked_fill(none, -std::numeric_limits<double>::infinity());
  }
  return {out, lse};
}

void merge_partial(PartialAttention& into, const PartialAttention& part) {
  if (!into.out.defined()) {
    into = part;
    return;
  }
  // A row neither part attends anything in keeps output 0 and lse -inf.
  const torch::Tensor most = torch::maximum(into.lse, part.lse);
  const torch::Tensor shift = most.masked_fill(most.isneginf(), 0);
  const torch::Tensor a = torch::exp(into.lse - shift);
  const torch::Tensor b = torch::exp(part.lse - shift);
  const torch::Tensor sum = a + b;
  const torch::Tensor divisor = sum.masked_fill(sum.eq(0), 1);
  into.out = (into.out * (a / divisor).unsqueeze(-1).to(into.out.scalar_type()) +
              part.out * (b / divisor).unsqueeze(-1).to(part.out.scalar_type()));
  into.lse = shift + torch::log(sum);
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> attend_chunk_backward(
    const torch::Tensor& grad_out, const torch::Tensor& q, const torch::Tensor& k,
    const torch::Tensor& v, const PartialAttention& whole, ChunkMask mask, double scale,
    const torch::Tensor& bias) {
  PIPETRAIN_CHECK_INPUT(mask != ChunkMask::kSkip,
                        "attend_chunk_backward of a chunk pair that is skipped");
  // A query with no key at all (padding): any finite lse makes its probabilities exp(-inf) = 0.
  const torch::Tensor lse = whole.lse.masked_fill(whole.lse.isneginf(), 0);
  return at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad_out.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), whole.out, lse, 0.0,
      mask == ChunkMask::kCausal,
      bias.defined() ? std::optional<torch::Tensor>(bias.to(q.device())) : std::nullopt,
      scale_of(scale));
}

torch::Tensor chunked_causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                                       const torch::Tensor& v, int64_t chunks,
                                       const torch::Tensor& segments) {
  PIPETRAIN_CHECK_INPUT(q.dim() == 4 && k.sizes() == q.sizes() && v.sizes() == q.sizes(),
                        "chunked_causal_attention takes q, k, v of one shape [B, H, T, D], got ",
                        q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  PIPETRAIN_CHECK_INPUT(chunks >= 1 && q.size(2) % chunks == 0, "a sequence of ", q.size(2),
                        " positions does not cut into ", chunks, " chunks of equal length");
  check_segments(segments, q, q.size(2));
  return ChunkedCausalAttention::apply(q, k, v, chunks, &segments);
}

std::vector<int64_t> zigzag_chunks(int rank, int size) {
  return {rank, 2 * static_cast<int64_t>(size) - 1 - rank};
}

RingPass ring_pass_start(const torch::Tensor& block, C10dGroup& group) {
  const int n = group.size();
  if (n == 1) return {block, nullptr};
  std::vector<int64_t> send(static_cast<size_t>(n), 0), receive(static_cast<size_t>(n), 0);
  send[static_cast<size_t>((group.rank() + 1) % n)] += 1;
  receive[static_cast<size_t>((group.rank() + n - 1) % n)] += 1;
  const torch::Tensor rows = block.contiguous().reshape({1, -1});
  torch::Tensor out = torch::empty_like(rows);
  // With 2 members, next and previous are one.
  std::function<void()> wait = group.all_to_all_start(rows, send, out, receive);
  {
    const std::lock_guard<std::mutex> lock(ring_mutex);
    ++ring_totals.passes;
    ring_totals.bytes_sent += static_cast<int64_t>(rows.nbytes());
  }
  // The rows sent stay alive until the pass is waited for.
  return {out.reshape(block.sizes()), [rows, wait = std::move(wait)] { wait(); }};
}

torch::Tensor ring_pass(const torch::Tensor& block, C10dGroup& group) {
  const RingPass pass = ring_pass_start(block, group);
  timed_wait(pass);
  return pass.received;
}

RingStats ring_stats() {
  const std::lock_guard<std::mutex> lock(ring_mutex);
  return ring_totals;
}

torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             C10dGroup& group, const torch::Tensor& segments, bool overlap) {
  PIPETRAIN_CHECK_INPUT(
      q.dim() == 4 && k.sizes() == q.sizes() && v.sizes() == q.sizes() && q.size(2) % 2 == 0,
      "ring_attention takes this member's two chunks of q, k, v of one shape "
      "[B, H, 2t, D], got ",
      q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  check_segments(segments, q, q.size(2) * group.size());
  return RingAttention::apply(q, k, v, &group, &segments, overlap);
}

torch::Tensor ulysses_attention(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, C10dGroup& group,
                                const WholeAttention& whole) {
  PIPETRAIN_CHECK_INPUT(q.dim() == 4 && k.sizes() == q.sizes() && v.sizes() == q.sizes(),
                        "ulysses_attention takes q, k, v of one shape [B, H, T/C, D], got ",
                        q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  PIPETRAIN_CHECK_INPUT(q.size(1) % group.size() == 0, "Ulysses over ", group.size(),
                        " members cuts the heads between them, and ", group.size(),
                        " does not divide the ", q.size(1), " heads");
  auto to_heads = [&](const torch::Tensor& x) { return SequenceToHeads::apply(x, &group, true); };
  const torch::Tensor out = whole ? whole(to_heads(q), to_heads(k), to_heads(v))
                                  : torch::scaled_dot_product_attention(to_heads(q), to_heads(k),
                                                                        to_heads(v), {}, 0.0, true);
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
                                      const torch::Tensor& v, const torch::Tensor& segments,
                                      const WholeAttention& whole) const {
  PIPETRAIN_CHECK_INPUT(group != nullptr, "ContextParallel::attend without a group");
  if (ulysses) return ulysses_attention(q, k, v, *group, whole);
  // The flash kernel takes one dtype: autocast's where it is on (as it casts sdpa's inputs), else
  // the inputs' common one (RoPE in float32 may have promoted q and k beside a narrower v).
  const c10::DeviceType device = q.device().type();
  const torch::ScalarType dtype =
      at::autocast::is_autocast_enabled(device)
          ? at::autocast::get_autocast_dtype(device)
          : at::promote_types(at::promote_types(q.scalar_type(), k.scalar_type()), v.scalar_type());
  return ring_attention(q.to(dtype), k.to(dtype), v.to(dtype), *group, segments, overlap);
}

}  // namespace pipetrain::parallel
