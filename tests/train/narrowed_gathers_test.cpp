// Which bytes ZeRO-3 all-gathers narrowed under bf16, per layer (train/sharded_optimizer.h,
// layer_narrowed_gather_bytes): what the memory model sizes the gather buffers with, in
// train --report-memory and in plan --memory.
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/stage/autocast_parameters.h"
#include "pipetrain/train/sharded_optimizer.h"

namespace pipetrain::train::narrowed_gathers_test {
namespace {

// A linear map through a weight another module owns, read only by at::linear (so it names it).
struct SharedLinearImpl : torch::nn::Module, AutocastCastParameters {
  explicit SharedLinearImpl(torch::Tensor tied) {
    weight = register_parameter("weight", std::move(tied));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight); }
  std::vector<torch::Tensor> autocast_cast_parameters() const override { return {weight}; }
  torch::Tensor weight;
};
TORCH_MODULE(SharedLinear);

TEST(LayerNarrowedGatherBytes, CountsTheLinearsAtBf16AndZeroThreeATiedWeightAtItsFirstLayer) {
  torch::nn::Linear first(4, 4);  // weight 64 bytes, bias 16
  torch::nn::Sequential model(first, torch::nn::ReLU(), SharedLinear(first->weight),
                              torch::nn::LayerNorm(torch::nn::LayerNormOptions({4})));
  const ZeroOptions three = ZeroOptions().stage(3);
  EXPECT_EQ(layer_narrowed_gather_bytes(*model, three, Precision::kBFloat16),
            (std::vector<int64_t>{80, 0, 0, 0}));  // the norm's weight is read in float32
  EXPECT_TRUE(layer_narrowed_gather_bytes(*model, three, Precision::kFloat32).empty());
  EXPECT_TRUE(
      layer_narrowed_gather_bytes(*model, ZeroOptions().stage(2), Precision::kBFloat16).empty());
  EXPECT_TRUE(layer_narrowed_gather_bytes(*model, ZeroOptions().stage(3).cast_gather(false),
                                          Precision::kBFloat16)
                  .empty());
}

}  // namespace
}  // namespace pipetrain::train::narrowed_gathers_test
