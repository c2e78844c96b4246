#include "pipetrain/train/evaluate.h"

#include <algorithm>

#include <torch/torch.h>

#include "pipetrain/base/check.h"

namespace pipetrain::train {
namespace {

// Restores a module's training mode when it goes out of scope.
class EvalMode {
 public:
  explicit EvalMode(torch::nn::Sequential model) : model_(std::move(model)) {
    was_training_ = model_->is_training();
    model_->eval();
  }
  ~EvalMode() { model_->train(was_training_); }
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  torch::nn::Sequential model_;
  bool was_training_ = false;
};

}  // namespace

Evaluation evaluate(torch::nn::Sequential model, const LossFn& loss, const torch::Tensor& inputs,
                    const torch::Tensor& targets, const EvaluateOptions& options) {
  PIPETRAIN_CHECK_INPUT(options.batch() >= 1, "evaluate: batch must be >= 1, got ",
                        options.batch());
  PIPETRAIN_CHECK_INPUT(inputs.defined() && targets.defined() && inputs.dim() >= 1 &&
                            targets.dim() >= 1 && inputs.size(0) >= 1 &&
                            inputs.size(0) == targets.size(0),
                        "evaluate: inputs and targets need the same rows, at least one");
  torch::NoGradGuard no_grad;
  EvalMode eval_mode(model);
  const int64_t rows = inputs.size(0);
  double total = 0;
  int64_t correct = 0;
  for (int64_t start = 0; start < rows; start += options.batch()) {
    const int64_t n = std::min(options.batch(), rows - start);
    const torch::Tensor output = model->forward(inputs.narrow(0, start, n));
    const torch::Tensor target = targets.narrow(0, start, n);
    total += loss(output, target).item<double>() * static_cast<double>(n);
    if (options.classification()) correct += output.argmax(1).eq(target).sum().item<int64_t>();
  }
  Evaluation result;
  result.loss = total / static_cast<double>(rows);
  if (options.classification()) result.accuracy = static_cast<double>(correct) / rows;
  result.samples = rows;
  return result;
}

}  // namespace pipetrain::train
