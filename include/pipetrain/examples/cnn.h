// CNN: a small ResNet-style network for 28x28x1 images (Fashion-MNIST), as a flat Sequential.
//
//   [B,1,28,28] conv3x3(1->w) bn relu maxpool2          -> [B,w,14,14]
//               residual block "res0.k" x blocks        -> [B,w,14,14]
//               conv3x3 stride 2 (w->2w) bn relu        -> [B,2w,7,7]
//               residual block "res1.k" x blocks        -> [B,2w,7,7]
//               flatten, linear(2w*49 -> classes)       -> [B,classes]
//
// A residual block is 8 Sequential entries, each its own layer so the pipeline may cut anywhere:
//   SkipStash(n), conv3x3, bn, relu, conv3x3, bn, SkipPopAdd(n), relu   (stage/skip_layers.h)
// A cut inside a block carries the activation [B,c,h,w] plus the stashed skip tensor n (same
// shape) to the next stage. Batch norm is torch::nn::BatchNorm2d; the pipeline runtime swaps in
// its deferred (mini-batch-exact) batch norm.
//
// With the default width 32 and 1 block per stage: 25 layers, 142826 parameters; one epoch of
// Adam (lr 1e-3, batch 128) reaches about 89-90% test accuracy (docs/MODELS.md has the figures).
//
// Thread-safety: returns a fresh module; no shared state.
#pragma once

#include <cstdint>

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

namespace pipetrain::examples {

struct CnnOptions {
  /// Channels of the first stage (the second has twice as many). Default 32.
  TORCH_ARG(int64_t, width) = 32;
  /// Residual blocks per resolution stage. Default 1.
  TORCH_ARG(int64_t, blocks) = 1;
  /// Output classes. Default 10.
  TORCH_ARG(int64_t, classes) = 10;
};

torch::nn::Sequential make_cnn(const CnnOptions& options = {});

}  // namespace pipetrain::examples
