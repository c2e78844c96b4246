// evaluate(): a model's mean loss (and, for a classifier, its accuracy) over held-out rows, in
// batches, without gradients and in eval mode (dropout off, batch norm on its running
// statistics); the module's training mode is restored afterwards, also when the forward throws.
//
// Example:
//   train::Evaluation e = train::evaluate(model, loss, test_x, test_y,
//                                         train::EvaluateOptions().classification(true));
//   std::printf("loss %.4f accuracy %.2f%%\n", e.loss, 100 * e.accuracy);
//
// Thread-safety: uses the module, so not concurrently with training it.
#pragma once

#include <cstdint>

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include "pipetrain/runtime/step.h"

namespace pipetrain::train {

struct EvaluateOptions {
  /// Rows per forward. REQUIRES >= 1.
  TORCH_ARG(int64_t, batch) = 1000;
  /// The outputs are class scores (rows, classes) and the targets class indices: also count the
  /// rows whose argmax is the target.
  TORCH_ARG(bool, classification) = false;
};

struct Evaluation {
  double loss = 0;       // the loss averaged over rows (each batch's mean weighted by its rows)
  double accuracy = -1;  // fraction of rows classified right; < 0 when not a classification
  int64_t samples = 0;   // rows evaluated
};

// REQUIRES: inputs and targets have the same rows, at least one; options.batch() >= 1 (else
// pipetrain::BadInput). Errors of the forward or the loss propagate.
Evaluation evaluate(torch::nn::Sequential model, const LossFn& loss, const torch::Tensor& inputs,
                    const torch::Tensor& targets, const EvaluateOptions& options = {});

}  // namespace pipetrain::train
