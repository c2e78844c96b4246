// What every example checks: pipelined training is transparent (docs/ARCHITECTURE.md), so the
// weights after N steps equal those of plain sequential training of a copy of the model, within
// float rounding (about 1e-5 relative for fp32).
//
// same_weights(got, want) is true when both hold the same non-empty set of names and, per tensor,
// max|got - want| <= rtol * max|want|. It prints the worst relative difference, or the first name
// that is missing, so a failing example says why. trains_as_sequential runs a Pipe and its
// sequential copy side by side on the same random batches and compares them. Header-only: each
// example of this project includes it.
#pragma once

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include <torch/torch.h>

#include "pipetrain/runtime/pipe.h"

namespace consumer {

using NamedTensors = std::map<std::string, torch::Tensor>;

inline NamedTensors to_map(const torch::OrderedDict<std::string, torch::Tensor>& named) {
  NamedTensors out;
  for (const auto& item : named) out.emplace(item.key(), item.value());
  return out;
}

inline bool same_weights(const NamedTensors& got, const NamedTensors& want, double rtol = 1e-5,
                         const char* want_is = "sequential training") {
  if (want.empty() || got.size() != want.size()) {
    std::printf("expected %zu parameters, got %zu\n", want.size(), got.size());
    return false;
  }
  double worst = 0;
  bool within = true;  // written so that a NaN difference fails too
  for (const auto& [name, expected] : want) {
    const auto found = got.find(name);
    if (found == got.end()) {
      std::printf("parameter %s is missing\n", name.c_str());
      return false;
    }
    const double scale = std::max(expected.abs().max().item<double>(), 1e-30);
    const double difference = (found->second - expected).abs().max().item<double>();
    within = within && difference <= rtol * scale;
    worst = std::max(worst, difference / scale);
  }
  std::printf("largest relative difference from %s: %.3g (tolerance %.0e)\n", want_is, worst, rtol);
  return within;
}

// `steps` SGD steps (learning rate `lr`) of `pipe` and of `reference`, the sequential copy of its
// model, on the same random batches of `rows` x `inputs` -> `rows` x `outputs` under MSE; then
// same_weights.
inline bool trains_as_sequential(pipetrain::Pipe& pipe, torch::nn::Sequential reference, double lr,
                                 int64_t rows, int64_t inputs, int64_t outputs, int steps = 3) {
  torch::optim::SGD sgd(pipe->parameters(), torch::optim::SGDOptions(lr));
  torch::optim::SGD reference_sgd(reference->parameters(), torch::optim::SGDOptions(lr));
  auto mse = [](const torch::Tensor& out, const torch::Tensor& target) {
    return torch::mse_loss(out, target);
  };
  for (int step = 0; step < steps; ++step) {
    const torch::Tensor x = torch::randn({rows, inputs}), y = torch::randn({rows, outputs});
    sgd.zero_grad();
    pipe->train_step(x, y, mse);
    sgd.step();
    reference_sgd.zero_grad();
    mse(reference->forward(x), y).backward();
    reference_sgd.step();
  }
  return same_weights(to_map(pipe->named_parameters()), to_map(reference->named_parameters()));
}

}  // namespace consumer
