// MLP: a multilayer perceptron as a flat Sequential, for flattened Fashion-MNIST by default.
//
// Layers: Flatten, then Linear(w0, w1), ReLU, Linear(w1, w2), ReLU, ..., Linear(w_{n-2}, w_{n-1})
// (no ReLU after the last). Default widths 784-512-256-10: 535818 parameters. Every boundary a
// pipeline can cut carries one float tensor [B, width].
//
// Thread-safety: returns a fresh module; no shared state.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

namespace pipetrain::examples {

struct MlpOptions {
  /// Layer widths, input first, classes last. REQUIRES at least 2 entries, all > 0.
  /// Default {784, 512, 256, 10} (28x28 images, 10 classes).
  TORCH_ARG(std::vector<int64_t>, widths) = std::vector<int64_t>{784, 512, 256, 10};
};

torch::nn::Sequential make_mlp(const MlpOptions& options = {});

}  // namespace pipetrain::examples
