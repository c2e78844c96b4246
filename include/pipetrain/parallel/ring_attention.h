// Context parallelism's attention (issue 64): Ulysses' all-to-all between the sequence and the
// heads (ulysses_attention, at the end), and ring attention.
//
// Attention by chunks of the sequence, merged by their log-sum-exp: the arithmetic of ring
// attention (context parallelism, issue 64), here on one process. A query chunk's attention over
// several key chunks is computed chunk by chunk with LibTorch's flash attention for the CPU, which
// returns each row's log-sum-exp, and merged:
//
//   forward    (o, lse) of the pair (query chunk, key chunk); two partials over disjoint keys
//              merge as  lse = log(e^lse_a + e^lse_b),  o = o_a e^(lse_a - lse) + o_b e^(lse_b -
//              lse)
//   backward   each pair's flash backward given the MERGED o and lse (its D = rowsum(dO o) and its
//              probabilities exp(q k^T s - lse) are then the whole attention's): dq sums over the
//              key chunks, dk and dv over the query chunks
//
// Causal attention over chunks numbered along the sequence: a key chunk before the query chunk is
// attended whole, the same chunk causally (equal lengths, aligned), a later one not at all
// (ChunkMask). A rank of a ring holds its query chunks (two, one from each end, in the zigzag
// split that balances the causal work) and sees every key chunk pass.
//
// Packed documents (data/sequence_layout.h): with the whole row's segment ids [B, T] (-1 on
// padding), a pair's keys are also masked by document: a query attends to a key of its own
// segment only. A pair that shares no document is skipped; a query with no key in a pair adds
// nothing (its lse there is -inf), and one with no key at all (padding) gets output 0.
//
// Shapes: q, k, v [B, H, T, D] (as sdpa takes them; key/value heads equal to the query heads,
// repeated by the caller); o [B, H, T, D], lse [B, H, T] float32.
//
// Thread-safety: pure functions of their tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <tuple>
#include <vector>

#include <torch/types.h>

namespace pipetrain {
class C10dGroup;
}

namespace pipetrain::parallel {

enum class ChunkMask { kSkip, kFull, kCausal };

// Causal attention between chunks of one sequence, by their positions along it.
ChunkMask causal_chunk_mask(int64_t query_chunk, int64_t key_chunk);

struct PartialAttention {
  torch::Tensor out;  // [B, H, Tq, D]
  torch::Tensor lse;  // [B, H, Tq], float32
};

// Which keys of a pair each query may attend: the chunks' order, and with documents a bias
// [B, 1, tq, tk] in the queries' dtype, 0 where allowed and -inf elsewhere (the chunks' causal
// mask folded in; `chunks` then kFull). No bias where every key is allowed as `chunks` says.
struct PairMask {
  ChunkMask chunks = ChunkMask::kSkip;
  torch::Tensor bias;
};

// The pair (query chunk, key chunk) of rows of packed documents: `segments` int64 [B, T] are the
// whole rows' segment ids (undefined: one document a row), the chunks their columns
// [chunk x t, (chunk + 1) x t). kSkip where causal_chunk_mask skips or no query shares a
// document with a key.
PairMask pair_mask(const torch::Tensor& segments, int64_t query_chunk, int64_t key_chunk, int64_t t,
                   torch::ScalarType dtype);

// Attention of `q` over one key chunk (not kSkip). `scale`: 1/sqrt(D) when <= 0. `bias`
// (PairMask's, with kFull): a query with no allowed key gets output 0 and lse -inf.
PartialAttention attend_chunk(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, ChunkMask mask, double scale = 0,
                              const torch::Tensor& bias = {});

// `into` becomes the attention over its keys and `part`'s (undefined `into`: `part`). Rows
// whose lse is -inf in both stay output 0, lse -inf.
void merge_partial(PartialAttention& into, const PartialAttention& part);

// One pair's share of the gradients, given the merged attention of the query chunk (`whole`):
// (dq, dk, dv) to add to the chunks' sums.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> attend_chunk_backward(
    const torch::Tensor& grad_out, const torch::Tensor& q, const torch::Tensor& k,
    const torch::Tensor& v, const PartialAttention& whole, ChunkMask mask, double scale = 0,
    const torch::Tensor& bias = {});

// Differentiable causal attention of q, k, v [B, H, T, D] computed as `chunks` query chunks over
// `chunks` key chunks (T divisible by chunks), equal to scaled_dot_product_attention(q, k, v,
// is_causal) within rounding: the computation each rank of a ring makes, for all ranks at once.
// `segments` (int64 [B, T], -1 on padding): attention within each document only, padding's
// output 0. Throws BadInput naming the sizes when T is not divisible by chunks.
torch::Tensor chunked_causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                                       const torch::Tensor& v, int64_t chunks,
                                       const torch::Tensor& segments = {});

// The zigzag split of a sequence over C members: cut into 2C chunks, member r holds chunks r and
// 2C - 1 - r (one from each end, so every member's causal work is the same).
std::vector<int64_t> zigzag_chunks(int rank, int size);

// `block` sent to the group's next member ((rank + 1) mod C) and what the previous one sent,
// of the same shape: one step of a ring (an all-to-all of one row each way).
torch::Tensor ring_pass(const torch::Tensor& block, C10dGroup& group);
// The same, started: `received` holds what the previous member sent once `wait` has returned
// (null wait: nothing to wait for, a group of one). Every member starts its passes in one order.
struct RingPass {
  torch::Tensor received;
  std::function<void()> wait;
};
RingPass ring_pass_start(const torch::Tensor& block, C10dGroup& group);

// What this process's ring passes did so far: how many, the bytes sent, and the seconds spent
// waiting for them (a pass waited for at once: all of it; one overlapped with the block's
// compute: what the compute did not cover). Thread-safe.
struct RingStats {
  int64_t passes = 0;
  int64_t bytes_sent = 0;
  double wait_seconds = 0;
};
RingStats ring_stats();

// Differentiable causal ring attention over `group` (C members): q, k, v [B, H, 2t, D] are this
// member's zigzag chunks (chunk zigzag_chunks(rank)[0], then [1], each t long) of a sequence of
// 2Ct. The key/value block travels the ring C - 1 steps while each member attends to it; the
// backward passes it again with its dk, dv, which come home after C steps. Returns this member's
// chunks of causal attention over the whole sequence. Every member calls it together.
// `overlap`: each pass starts before the member computes on the block it holds and is waited for
// after (the backward's dk, dv: sent after a step's compute, waited for after the next's); false:
// each pass waits at once, after the compute (what the overlap hides, measured by ring_stats).
// `segments` (int64 [B, 2Ct], the whole rows' segment ids; undefined: none): attention within
// each document, pairs that share none skipped (every member knows every block's columns).
torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             C10dGroup& group, const torch::Tensor& segments = {},
                             bool overlap = true);

// The attention of q, k, v [B, H, T, D] over the whole sequence (Ulysses' middle).
using WholeAttention =
    std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;

// DeepSpeed-Ulysses over `group` (C members, member r holding the r-th of C contiguous chunks of
// the sequence): differentiable all-to-alls turn q, k, v [B, H, T/C, D] into [B, H/C, T, D] (the
// whole sequence for this member's H/C heads), causal attention runs on them, and the output goes
// back to [B, H, T/C, D]. Throws BadInput naming the sizes when C does not divide the heads.
// `whole`: the attention in the middle (null: causal sdpa), e.g. by document.
torch::Tensor ulysses_attention(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, C10dGroup& group,
                                const WholeAttention& whole = nullptr);

// A model's context parallelism: the group whose members each hold a part of every sequence
// (ring: their zigzag chunks; Ulysses: a contiguous chunk), and which attention runs over it.
// ContextParallel{} (no group) is size 1: the whole sequence, plain attention.
struct ContextParallel {
  std::shared_ptr<C10dGroup> group;
  bool ulysses = false;  // false: ring
  bool overlap = true;   // ring: each pass beside the block's compute (ring_attention)
  int size() const;
  int rank() const;
  bool split() const { return size() > 1; }
  // The positions along the whole sequence of the `length` tokens this member holds, int64.
  torch::Tensor positions(int64_t length) const;
  // ring_attention or ulysses_attention of this member's q, k, v [B, H, length, D]. Packed
  // documents: the whole rows' `segments` for the ring, `whole` (attention by document over the
  // whole sequence) for Ulysses.
  torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& segments = {},
                       const WholeAttention& whole = nullptr) const;
};

}  // namespace pipetrain::parallel
