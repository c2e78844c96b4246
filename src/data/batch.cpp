// A step's mini-batch and its micro-batches (data/batch.h).
#include "pipetrain/data/batch.h"

#include <algorithm>
#include <cmath>

#include <torch/torch.h>

#include "pipetrain/base/check.h"

namespace pipetrain::data {

int64_t Batch::rows() const {
  return inputs.empty() || !inputs[0].defined() || inputs[0].dim() < 1 ? 0 : inputs[0].size(0);
}

double Batch::total_weight() const {
  return weight_of(0, rows());
}

double Batch::weight_of(int64_t first, int64_t count) const {
  if (!weights.defined()) return static_cast<double>(count);
  return weights.narrow(0, first, count).sum().item<double>();
}

void check_batch(const Batch& batch) {
  PIPETRAIN_CHECK_INPUT(
      !batch.inputs.empty() && batch.inputs[0].defined() && batch.inputs[0].dim() >= 1,
      "a mini-batch needs an input with a batch dimension (dim 0)");
  const int64_t rows = batch.rows();
  PIPETRAIN_CHECK_INPUT(
      batch.targets.defined() && batch.targets.dim() >= 1 && batch.targets.size(0) == rows,
      "the target has ",
      batch.targets.defined() && batch.targets.dim() >= 1 ? batch.targets.size(0) : 0,
      " rows but the input has ", rows, "; give one target row per input row");
  if (batch.weights.defined()) {
    PIPETRAIN_CHECK_INPUT(batch.weights.scalar_type() == torch::kFloat64 &&
                              batch.weights.dim() == 1 && batch.weights.size(0) == rows,
                          "the row weights must be float64 [", rows, "], got ",
                          batch.weights.scalar_type(), " ", batch.weights.sizes());
    PIPETRAIN_CHECK_INPUT(batch.weights.min().item<double>() >= 0, "a row weight is negative (",
                          batch.weights.min().item<double>(), ")");
  }
  PIPETRAIN_CHECK_INPUT(batch.pad_multiple >= 1, "the pad multiple must be >= 1 (got ",
                        batch.pad_multiple, ")");
  if (batch.layout) {
    const torch::Tensor& tokens = batch.inputs[0];
    PIPETRAIN_CHECK_INPUT(batch.layout->rows() == rows && tokens.dim() >= 2 &&
                              tokens.size(1) == batch.layout->width() && batch.targets.dim() >= 2 &&
                              batch.targets.size(1) == batch.layout->width(),
                          "the sequence layout (", batch.layout->describe(),
                          ") does not match the token rows: inputs ", tokens.sizes(), ", targets ",
                          batch.targets.sizes());
  }
}

Batch rows_of(const Batch& batch, int64_t first, int64_t count) {
  Batch part;
  for (const torch::Tensor& input : batch.inputs)
    part.inputs.push_back(input.narrow(0, first, count));
  part.targets = batch.targets.narrow(0, first, count);
  if (batch.weights.defined()) part.weights = batch.weights.narrow(0, first, count);
  if (batch.layout) part.layout = batch.layout->slice(first, count, batch.layout->width());
  part.pad_multiple = batch.pad_multiple;
  return part;
}

BatchTokens batch_tokens(const Batch& batch) {
  BatchTokens counts;
  if (batch.layout) {
    for (int64_t r = 0; r < batch.layout->rows(); ++r) counts.tokens += batch.layout->used(r);
  }
  if (batch.weights.defined()) {
    counts.counted_targets = static_cast<int64_t>(std::llround(batch.total_weight()));
  }
  return counts;
}

int64_t counted_targets(const torch::Tensor& targets) {
  return targets.ne(kIgnoredTarget).sum().item<int64_t>();
}

Microbatch tokens_at(const Microbatch& part, const torch::Tensor& positions) {
  PIPETRAIN_CHECK_INPUT(part.inputs.size() == 1 && part.inputs[0].dim() == 2 &&
                            part.target.dim() >= 2 &&
                            part.target.size(0) == part.inputs[0].size(0) &&
                            part.target.size(1) == part.inputs[0].size(1),
                        "context parallelism cuts token rows [rows, width]: the micro-batch's "
                        "input must be, and its target [rows, width, ...], got ",
                        part.inputs.empty() ? "no input" : c10::str(part.inputs[0].sizes()),
                        " and ", part.target.sizes());
  Microbatch mine;
  if (part.layout && part.layout->by_document()) mine.layout = part.layout;
  const torch::Tensor at = positions.to(part.inputs[0].device());
  mine.inputs.push_back(part.inputs[0].index_select(1, at));
  mine.target = part.target.index_select(1, at.to(part.target.device()));
  // Token targets weigh their counted ones; others (a regression's, the auto plan's timed steps'
  // mean squared error) the columns' share of the rows' weight.
  mine.weight = mine.target.is_floating_point() ? part.weight * static_cast<double>(at.numel()) /
                                                      static_cast<double>(part.target.size(1))
                                                : static_cast<double>(counted_targets(mine.target));
  return mine;
}

int64_t padded_width(int64_t width, int64_t multiple, int64_t limit) {
  const int64_t rounded = (width + multiple - 1) / multiple * multiple;
  return std::min(std::max<int64_t>(rounded, 1), limit);
}

std::vector<Microbatch> split_batch(const Batch& batch, const std::vector<int64_t>& sizes) {
  std::vector<Microbatch> parts(sizes.size());
  int64_t first = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Microbatch& part = parts[i];
    const int64_t count = sizes[i];
    const bool whole = sizes.size() == 1;  // no narrow: a view op per tensor every step
    for (const torch::Tensor& input : batch.inputs) {
      part.inputs.push_back(whole ? input : input.narrow(0, first, count));
    }
    part.target = whole ? batch.targets : batch.targets.narrow(0, first, count);
    part.weight = batch.weight_of(first, count);
    if (batch.layout) {
      const int64_t full = batch.layout->width();
      const std::shared_ptr<const SequenceLayout> rows = batch.layout->slice(first, count, full);
      const int64_t width = padded_width(rows->longest(), batch.pad_multiple, full);
      if (width == full) {
        part.layout = rows;
      } else {
        part.layout = rows->slice(0, count, width);
        part.inputs[0] = part.inputs[0].narrow(1, 0, width);
        part.target = part.target.narrow(1, 0, width);
      }
    }
    first += count;
  }
  return parts;
}

}  // namespace pipetrain::data
