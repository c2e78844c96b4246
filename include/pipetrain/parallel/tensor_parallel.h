// Tensor parallelism (Megatron-LM's scheme): one layer's matrices split across the ranks of a
// tensor-parallel group, with the collectives placed so that forward and backward compute what
// the unsplit layer computes.
//
//   replicated x [.., in]
//        |  copy_to_tensor_parallel        forward: identity    backward: all-reduce (sum)
//        v
//   ColumnParallelLinear  W_r = rows r*out/tp .. of W      -> y_r [.., out/tp]  (a slice of y)
//        |  (elementwise work on the slice: SwiGLU, attention over this rank's heads)
//        v
//   RowParallelLinear     W_r = columns r*in/tp .. of W     -> partial sum [.., out]
//        |  reduce_from_tensor_parallel    forward: all-reduce  backward: identity
//        v
//   replicated y [.., out] (+ bias, added once after the sum)
//
// VocabParallelEmbedding holds rows [r*V/tp, (r+1)*V/tp) of the table: ids outside them look up
// zeros and the all-reduce adds the one rank's row. vocab_parallel_cross_entropy takes each
// rank's slice of the logits [N, V/tp] and returns the per-token loss without any rank holding
// all V logits: the max, the sum of exponentials and the target's logit are reduced over the
// group (N floats each), and the backward is local (softmax minus one-hot, on the slice).
//
// A replicated parameter (a norm's weight, a row-parallel bias) receives the same full gradient
// on every rank, because copy_to_tensor_parallel's backward sums the slices' input gradients.
// The weight gradients of split matrices are local: nothing to reduce over the group, except for
// a slice several ranks share (TensorSplit::replicas > 1: key/value heads fewer than the ranks),
// whose gradient sum_over_replicas adds up over the ranks sharing it.
//
// Sequence parallelism (TensorParallel::sequence_parallel, Megatron's): outside the split regions
// (norms, residuals, what crosses pipeline stages) each rank holds 1/tp of the sequence, dimension
// 1 of [B, T, H]. Entering a region all-gathers the sequence (backward: reduce-scatter), leaving
// it reduce-scatters the partial sums (backward: all-gather) instead of all-reducing them. A
// replicated parameter then gets only its sequence slice's gradient on each rank: the runner sums
// those over the group after the backward (train::TensorParallelModel).
//
// TensorParallel{} (no group) is tensor-parallel size 1: every function is the plain operation
// and every module holds the whole matrix, so one code path serves both.
//
// Requirements: every rank of the group runs the same operations in the same order (each
// function here is a collective when the group has more than one rank); the group outlives the
// autograd graphs made through it (the backward functions hold it). Thread-safety: as C10dGroup,
// one thread at a time per group.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "pipetrain/parallel/tensor_split.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain::parallel {

// This rank's place in its tensor-parallel group; no group: one rank.
struct TensorParallel {
  std::shared_ptr<C10dGroup> group;
  bool sequence_parallel = false;  // with a group of more than one rank

  int size() const { return group ? group->size() : 1; }
  int rank() const { return group ? group->rank() : 0; }
  bool split() const { return size() > 1; }
};

// Elements [start, start + length) of a dimension of `total` elements cut into `parts` equal
// parts: part `index`.
struct Slice {
  int64_t start = 0;
  int64_t length = 0;
};
// Throws BadInput naming `what`, `total` and `parts` when `parts` does not divide `total`.
Slice even_slice(int64_t total, int parts, int index, const std::string& what);

// Identity forward on a parameter `w` whose slice this rank shares with `replicas` - 1 others
// (TensorSplit, its dimension 0); the backward sums the gradient over those ranks, each of which
// computed only its own share (its query heads' use of a shared key/value head). One all-reduce
// over the group of a [parts x slice] buffer. REQUIRES: replicas divides the group's size.
torch::Tensor sum_over_replicas(const torch::Tensor& w, int replicas, const TensorParallel& tp);

// Identity forward; the backward sums the gradient over the group.
torch::Tensor copy_to_tensor_parallel(const torch::Tensor& x, const TensorParallel& tp);
// Sum over the group forward; identity backward.
torch::Tensor reduce_from_tensor_parallel(const torch::Tensor& x, const TensorParallel& tp);
// Concatenates the ranks' x along the last dimension (rank order); the backward keeps this
// rank's slice of the gradient.
torch::Tensor gather_from_tensor_parallel(const torch::Tensor& x, const TensorParallel& tp);

// Sequence parallelism's pair, along dimension `dim`: the ranks' slices concatenated in rank
// order (backward: the sum over the group, this rank's slice kept), and the sum over the group
// with this rank's slice kept (backward: the slices concatenated). The dimension must divide.
torch::Tensor gather_sequence(const torch::Tensor& x, int64_t dim, const TensorParallel& tp);
torch::Tensor reduce_scatter_sequence(const torch::Tensor& x, int64_t dim,
                                      const TensorParallel& tp);
// This rank's slice of a replicated x along `dim` (backward: the slices concatenated).
torch::Tensor scatter_sequence(const torch::Tensor& x, int64_t dim, const TensorParallel& tp);

// Entering a split region from [B, T, H] activations: copy_to_tensor_parallel, or with sequence
// parallelism gather_sequence along T. Leaving it: reduce_from_tensor_parallel, or
// reduce_scatter_sequence along T.
torch::Tensor enter_tensor_parallel(const torch::Tensor& x, const TensorParallel& tp);
torch::Tensor leave_tensor_parallel(const torch::Tensor& x, const TensorParallel& tp);

// Several column-parallel linears of one input entering a split region: y_i = x W_i^T + b_i,
// with x entered as enter_tensor_parallel does (biases: empty, or one per weight, undefined for
// none). With sequence parallelism they are one autograd node that keeps this rank's slice of x,
// not the gathered sequence (Megatron's saving: 1/tp of the input's memory per linear until the
// backward), and gathers it again in the backward only where a weight wants its gradient. So a
// split backward's I reduce-scatters the input's gradient and gathers nothing, and its W gathers
// once for the node's weights. Without it: enter_tensor_parallel, then the plain linears.
std::vector<torch::Tensor> sequence_parallel_linears(const torch::Tensor& x,
                                                     const std::vector<torch::Tensor>& weights,
                                                     const std::vector<torch::Tensor>& biases,
                                                     const TensorParallel& tp);

// x_slice W_slice^T summed over the group (leave_tensor_parallel), plus the whole bias (undefined:
// none): the body of a row-parallel layer for modules that keep their own tensors.
torch::Tensor row_parallel_linear(const torch::Tensor& x, const torch::Tensor& weight,
                                  const torch::Tensor& bias, const TensorParallel& tp);
// ids -> rows of a table split by rows: this rank holds `table` = rows [vocab_start, vocab_start +
// table.size(0)); the others' ids look up zeros before the sum over the group (with sequence
// parallelism the reduce-scatter along ids' dimension 1, the sequence of [B, T]). padding_idx (a
// whole-vocabulary id) gets no gradient.
torch::Tensor vocab_parallel_embedding(const torch::Tensor& ids, const torch::Tensor& table,
                                       int64_t vocab_start, std::optional<int64_t> padding_idx,
                                       const TensorParallel& tp);

// y = x W^T + b with W [out, in] split by rows: this rank holds W[slice] [out/tp, in] and b[slice].
// Input replicated; output this rank's slice [.., out/tp] (the whole y with gather_output).
class ColumnParallelLinearImpl : public torch::nn::Cloneable<ColumnParallelLinearImpl> {
 public:
  ColumnParallelLinearImpl(int64_t in, int64_t out, bool bias, TensorParallel tp,
                           bool gather_output = false, torch::TensorOptions options = {});
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);
  // This rank's rows of the whole layer's out dimension.
  Slice rows() const { return even_slice(out, tp.size(), tp.rank(), "output features"); }

  int64_t in, out;
  bool has_bias, gather_output;
  TensorParallel tp;
  torch::TensorOptions options;
  torch::Tensor weight, bias;  // [out/tp, in], [out/tp]; uninitialized (zeros) after reset
};
TORCH_MODULE(ColumnParallelLinear);

// y = x W^T + b with W [out, in] split by columns: this rank holds W[:, slice] [out, in/tp].
// Input this rank's slice [.., in/tp] (a column-parallel layer's output); output replicated, the
// bias (whole, [out]) added once after the sum.
class RowParallelLinearImpl : public torch::nn::Cloneable<RowParallelLinearImpl> {
 public:
  RowParallelLinearImpl(int64_t in, int64_t out, bool bias, TensorParallel tp,
                        torch::TensorOptions options = {});
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);
  Slice columns() const { return even_slice(in, tp.size(), tp.rank(), "input features"); }

  int64_t in, out;
  bool has_bias;
  TensorParallel tp;
  torch::TensorOptions options;
  torch::Tensor weight, bias;  // [out, in/tp], [out]
};
TORCH_MODULE(RowParallelLinear);

// Token ids (any shape, int64) -> [.., dim]; this rank holds rows vocab_rows() of the [V, dim]
// table. Ids equal to padding_idx get no gradient (nn.Embedding's padding_idx).
class VocabParallelEmbeddingImpl : public torch::nn::Cloneable<VocabParallelEmbeddingImpl> {
 public:
  VocabParallelEmbeddingImpl(int64_t vocab, int64_t dim, TensorParallel tp,
                             std::optional<int64_t> padding_idx = std::nullopt,
                             torch::TensorOptions options = {});
  void reset() override;
  torch::Tensor forward(const torch::Tensor& ids);
  Slice vocab_rows() const { return even_slice(vocab, tp.size(), tp.rank(), "vocabulary"); }

  int64_t vocab, dim;
  TensorParallel tp;
  std::optional<int64_t> padding_idx;
  torch::TensorOptions options;
  torch::Tensor weight;  // [V/tp, dim]
};
TORCH_MODULE(VocabParallelEmbedding);

// Per-token cross-entropy [N] of logits whose vocabulary is split over the group: `logits` is
// this rank's slice [N, V/tp] (columns vocab_start ..), `targets` [N] int64 the whole ids, the
// same on every rank. Computed in float32 whatever the logits' dtype; the gradient returns in
// the logits' dtype. Equal to cross_entropy(whole logits, targets, reduction none).
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits,
                                           const torch::Tensor& targets, int64_t vocab_start,
                                           const TensorParallel& tp);

}  // namespace pipetrain::parallel
