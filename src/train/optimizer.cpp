// Optimizer factory (pipetrain/train/optimizer.h).
#include "pipetrain/train/optimizer.h"
#include "pipetrain/base/check.h"
#include "pipetrain/base/error.h"

#include <stdexcept>
#include <unordered_set>

#include <c10/util/StringUtil.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace pipetrain::train {

std::vector<std::string> optimizer_names() {
  return {"sgd", "adam", "adamw"};
}

std::vector<torch::Tensor> unique_parameters(const std::vector<torch::Tensor>& parameters) {
  std::unordered_set<const void*> seen;
  std::vector<torch::Tensor> unique;
  for (const auto& parameter : parameters) {
    if (seen.insert(parameter.unsafeGetTensorImpl()).second) unique.push_back(parameter);
  }
  return unique;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const std::string& name, const std::vector<torch::Tensor>& parameters,
    const OptimizerOptions& options) {
  std::vector<torch::Tensor> unique = unique_parameters(parameters);
  if (unique.empty()) {
    throw BadInput("optimizer '" + name +
                   "' got no parameters; does the model (or this stage) have any?");
  }
  if (!(options.lr() > 0.0)) {
    throw BadInput("learning rate must be positive, got " + std::to_string(options.lr()));
  }
  auto betas = std::make_tuple(options.beta1(), options.beta2());
  if (name == "sgd") {
    return std::make_unique<torch::optim::SGD>(unique, torch::optim::SGDOptions(options.lr())
                                                           .momentum(options.momentum())
                                                           .weight_decay(options.weight_decay()));
  }
  if (name == "adam") {
    return std::make_unique<torch::optim::Adam>(unique, torch::optim::AdamOptions(options.lr())
                                                            .betas(betas)
                                                            .eps(options.eps())
                                                            .weight_decay(options.weight_decay()));
  }
  if (name == "adamw") {
    return std::make_unique<torch::optim::AdamW>(unique, torch::optim::AdamWOptions(options.lr())
                                                             .betas(betas)
                                                             .eps(options.eps())
                                                             .weight_decay(options.weight_decay()));
  }
  throw BadInput("unknown optimizer '" + name +
                 "'; valid optimizers: " + c10::Join(", ", optimizer_names()));
}

std::string optimizer_name(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return "sgd";
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return "adamw";
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return "adam";
  return "";
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

double learning_rate(const torch::optim::Optimizer& optimizer) {
  PIPETRAIN_CHECK_INPUT(!optimizer.param_groups().empty(), "the optimizer has no parameter groups");
  return optimizer.param_groups().front().options().get_lr();
}

}  // namespace pipetrain::train
