// Helpers shared by the runtime tests: small models, sequential reference training, and a
// parameter comparison that names the worst parameter.
#pragma once

#include <functional>
#include <sstream>
#include <string>

#include <torch/torch.h>

#include "pipetrain/runtime/pipe.h"
#include "pipetrain/stage/skip_layers.h"

namespace pipetrain::testing {

inline torch::Tensor mse(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::mse_loss(output, target);
}

// 7 layers: Linear, Tanh, Linear, ReLU, Linear, Tanh, Linear (6 -> 2).
inline torch::nn::Sequential make_mlp(uint64_t seed = 0) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 8),
                               torch::nn::ReLU(), torch::nn::Linear(8, 5), torch::nn::Tanh(),
                               torch::nn::Linear(5, 2));
}

// 7 layers with a residual from layer 1 to layer 5: Linear, Stash(a), Linear, Tanh, Linear,
// PopAdd(a), Linear.
inline torch::nn::Sequential make_skip_mlp(uint64_t seed = 0) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(6, 8), SkipStash("a"), torch::nn::Linear(8, 8),
                               torch::nn::Tanh(), torch::nn::Linear(8, 8), SkipPopAdd("a"),
                               torch::nn::Linear(8, 2));
}

inline torch::nn::Sequential clone_of(const torch::nn::Sequential& model) {
  return torch::nn::Sequential(
      std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone()));
}

struct Batch {
  torch::Tensor input;
  torch::Tensor target;
};

inline std::vector<Batch> make_batches(int64_t rows, int steps, uint64_t seed = 7) {
  torch::manual_seed(seed);
  std::vector<Batch> batches;
  for (int k = 0; k < steps; ++k)
    batches.push_back({torch::randn({rows, 6}), torch::randn({rows, 2})});
  return batches;
}

inline torch::optim::SGD make_sgd(std::vector<torch::Tensor> params) {
  return torch::optim::SGD(params, torch::optim::SGDOptions(0.1).momentum(0.9));
}

// Plain training of the whole mini-batch: forward, mean loss, backward, step.
inline void train_sequential(torch::nn::Sequential& model, const std::vector<Batch>& batches) {
  auto sgd = make_sgd(model->parameters());
  for (const auto& batch : batches) {
    sgd.zero_grad();
    mse(model->forward(batch.input), batch.target).backward();
    sgd.step();
  }
}

inline std::vector<torch::Tensor> train_pipe(Pipe& pipe, const std::vector<Batch>& batches) {
  auto sgd = make_sgd(pipe->parameters());
  std::vector<torch::Tensor> losses;
  for (const auto& batch : batches) {
    sgd.zero_grad();
    losses.push_back(pipe->train_step(batch.input, batch.target, mse));
    sgd.step();
  }
  return losses;
}

// Empty when every parameter of `actual` is allclose(rtol, atol) to the one of the same name in
// `expected`; otherwise names the worst one and its largest difference.
inline std::string compare_parameters(const torch::nn::Module& actual,
                                      const torch::nn::Module& expected, double rtol = 1e-5,
                                      double atol = 1e-6) {
  auto expected_params = expected.named_parameters();
  std::ostringstream out;
  for (const auto& entry : actual.named_parameters()) {
    const torch::Tensor* other = expected_params.find(entry.key());
    if (!other) {
      out << "parameter " << entry.key() << " missing in the reference; ";
      continue;
    }
    torch::Tensor a = entry.value().detach().cpu();
    torch::Tensor b = other->detach().cpu();
    if (!torch::allclose(a, b, rtol, atol)) {
      out << entry.key() << " differs by up to " << (a - b).abs().max().item<double>() << "; ";
    }
  }
  if (actual.named_parameters().size() != expected_params.size()) {
    out << "parameter counts differ (" << actual.named_parameters().size() << " vs "
        << expected_params.size() << ")";
  }
  return out.str();
}

// make_skip_mlp() trained for 3 SGD steps of 8 rows sequentially and, from a copy, through a Pipe
// built with `options`: the Pipe (for its accounting) and compare_parameters' verdict.
struct SkipMlpRun {
  Pipe pipe{nullptr};
  std::string difference;  // "" when the weights agree within rtol/atol
};
inline SkipMlpRun train_skip_mlp_both_ways(const PipeOptions& options, double rtol = 1e-5,
                                           double atol = 1e-6) {
  torch::nn::Sequential reference = make_skip_mlp();
  SkipMlpRun run;
  run.pipe = Pipe(clone_of(reference), options);
  const auto batches = make_batches(8, 3);
  train_sequential(reference, batches);
  train_pipe(run.pipe, batches);
  run.difference = compare_parameters(*run.pipe, *reference, rtol, atol);
  return run;
}

}  // namespace pipetrain::testing
