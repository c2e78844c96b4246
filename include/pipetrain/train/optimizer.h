// Optimizers by name ("sgd", "adam", "adamw"), the learning rate of every group, and parameter
// deduplication.
//
// A thin layer over LibTorch's torch::optim so the CLI can say `--optimizer adam --lr 1e-3`.
// Tied parameters (one tensor registered under two names, e.g. the GPT's embedding and LM head)
// appear twice in Module::parameters(); torch::optim would then update them twice per step.
// make_optimizer therefore keeps each tensor once (unique_parameters).
//
// Ownership: the optimizer holds (shares) the parameter tensors. Thread-safety: none; an
// optimizer is used by one thread at a time.
//
// Example:
//   auto optimizer = make_optimizer("adam", model->parameters(), OptimizerOptions().lr(1e-3));
//   set_learning_rate(*optimizer, learning_rate_at(schedule, step));
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

namespace pipetrain::train {

struct OptimizerOptions {
  /// Learning rate (the schedule may override it per step). Default 1e-3.
  TORCH_ARG(double, lr) = 1e-3;
  /// SGD momentum (0 = plain SGD). Ignored by adam/adamw. Default 0.9.
  TORCH_ARG(double, momentum) = 0.9;
  /// L2 penalty for sgd/adam, decoupled weight decay for adamw. Default 0.
  TORCH_ARG(double, weight_decay) = 0.0;
  /// Adam/AdamW first- and second-moment decay. Defaults 0.9, 0.999.
  TORCH_ARG(double, beta1) = 0.9;
  TORCH_ARG(double, beta2) = 0.999;
  /// Adam/AdamW denominator epsilon. Default 1e-8.
  TORCH_ARG(double, eps) = 1e-8;
};

// "sgd", "adam", "adamw".
std::vector<std::string> optimizer_names();

// Throws pipetrain::BadInput for an unknown name (listing the valid ones), no parameters, or a
// non-positive learning rate.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const std::string& name, const std::vector<torch::Tensor>& parameters,
    const OptimizerOptions& options = {});

// The registry name of an optimizer made here ("sgd", "adam", "adamw"); "" for other types.
std::string optimizer_name(const torch::optim::Optimizer& optimizer);

// Sets the learning rate of every parameter group.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);
// The learning rate of the first parameter group. REQUIRES at least one group.
double learning_rate(const torch::optim::Optimizer& optimizer);

// `parameters` with repeated tensors (same TensorImpl) removed, first occurrence kept, in order.
std::vector<torch::Tensor> unique_parameters(const std::vector<torch::Tensor>& parameters);

}  // namespace pipetrain::train
