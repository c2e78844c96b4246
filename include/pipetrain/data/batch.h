// Batch: one training step's mini-batch as the runtime takes it -- inputs, targets, what each row
// weighs in the loss, and for token rows their layout (data/sequence_layout.h) -- and its cut into
// micro-batches.
//
//   weights   each row's share of the mini-batch's loss. Undefined: 1 per row (the loss of a
//             micro-batch is a mean over its rows). A language model's rows weigh their counted
//             targets: the loss of a micro-batch is then the mean over its counted targets, and
//             the runtime scales micro-batch i by weight(i) / weight(mini-batch), so that the
//             step's loss is the sum over every counted target of the mini-batch (all
//             micro-batches, all data-parallel replicas) over their count, whatever the cut --
//             transformers' num_items_in_batch.
//   layout    token rows [N, W] (inputs[0] and targets): each micro-batch is cut to its own longest
//             row, rounded up to `pad_multiple` (never wider than W), so micro-batches of one
//             step may differ in shape. The runtime hands micro-batch i's layout to the layers
//             computing it.
//
// Thread-safety: plain values; the tensors and the layout are shared, never written.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/types.h>

#include "pipetrain/data/sequence_layout.h"

namespace pipetrain::data {

// A target that is not learned (padding, a prompt's token, the first token of the next
// document): -100, as transformers' labels mark it (and torch's cross_entropy ignores by default).
constexpr int64_t kIgnoredTarget = -100;

struct Batch {
  std::vector<torch::Tensor> inputs;             // stage 0's input tuple, rows on dim 0
  torch::Tensor targets;                         // rows on dim 0
  torch::Tensor weights;                         // float64 [N], or undefined (1 per row)
  std::shared_ptr<const SequenceLayout> layout;  // token rows, or null
  int64_t pad_multiple = 1;                      // with a layout (above); >= 1

  Batch() = default;
  Batch(torch::Tensor input, torch::Tensor target)
      : inputs{std::move(input)}, targets(std::move(target)) {}

  int64_t rows() const;
  // Sum of the weights (the rows without weights).
  double total_weight() const;
  // Weight of rows [first, first + count).
  double weight_of(int64_t first, int64_t count) const;
};

// Throws BadInput naming what disagrees: no input, inputs and targets of different row counts,
// weights not float64 [N] or negative, a layout whose rows or width differ from the token rows.
void check_batch(const Batch& batch);

// Rows [first, first + count) of `batch` (a data-parallel replica's share): views, the weights and
// layout cut alike. REQUIRES a checked batch and rows within it.
Batch rows_of(const Batch& batch, int64_t first, int64_t count);

struct Microbatch {
  std::vector<torch::Tensor> inputs;
  torch::Tensor target;
  double weight = 0;                             // the sum of its rows' weights
  std::shared_ptr<const SequenceLayout> layout;  // null without one
};

// Cuts `batch` into micro-batches of `sizes` rows (stage/microbatch.h's cut), each with its rows'
// weight and, with a layout, cut to its own width (above). REQUIRES a checked batch; sizes summing
// to its rows.
std::vector<Microbatch> split_batch(const Batch& batch, const std::vector<int64_t>& sizes);

// The counted targets of `targets`: those that are not kIgnoredTarget.
int64_t counted_targets(const torch::Tensor& targets);

// A context-parallel member's part of a micro-batch of token rows (parallel/ring_attention.h):
// the columns `positions` (int64, along the width) of inputs[0] and the target, weighing the
// counted targets among them (a language model's loss is the mean over its counted targets); a
// floating-point target [rows, width, ...] weighs the columns' share of the micro-batch's. A
// layout by document stays the whole rows' (each member's attention finds its tokens' documents
// and positions in it); one by row (cross-document attention) is dropped: each member's
// attention already places its tokens along the row. Throws BadInput for an input that is not
// [rows, width] token rows or a target that is not [rows, width, ...].
Microbatch tokens_at(const Microbatch& part, const torch::Tensor& positions);

// What a batch of token rows holds, for rates: its tokens that are not padding (the layout's; 0
// without one) and its counted targets (the weights' sum, a language model's batch weighing its
// rows by them; 0 without weights).
struct BatchTokens {
  int64_t tokens = 0;
  int64_t counted_targets = 0;
};
BatchTokens batch_tokens(const Batch& batch);

// `width` rounded up to a multiple of `multiple`, but at most `limit`.
int64_t padded_width(int64_t width, int64_t multiple, int64_t limit);

}  // namespace pipetrain::data
