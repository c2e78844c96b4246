#include "pipetrain/stage/stage.h"

#include <functional>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/stage/skip.h"
#include "pipetrain/stage/skip_layers.h"

namespace pipetrain {
namespace {

// A middle stage (index 1): Linear, Stash(s), Tanh, Linear, PopAdd(s), ReLU, Linear.
std::vector<StageLayer> make_layers(uint64_t seed) {
  torch::manual_seed(seed);
  torch::nn::Sequential model(torch::nn::Linear(5, 6), SkipStash("s"), torch::nn::Tanh(),
                              torch::nn::Linear(6, 6), SkipPopAdd("s"), torch::nn::ReLU(),
                              torch::nn::Linear(6, 3));
  std::vector<StageLayer> layers;
  int l = 0;
  for (auto& module : *model) layers.push_back({std::to_string(l++), module});
  return layers;
}

std::vector<torch::Tensor> grads_of(const std::vector<StageLayer>& layers) {
  std::vector<torch::Tensor> grads;
  for (const auto& layer : layers) {
    for (const auto& p : layer.module.ptr()->parameters()) grads.push_back(p.grad().clone());
  }
  return grads;
}

// Two micro-batches through a middle stage, forwards then backwards; `between` runs after the
// forwards, `after` after the backwards.
Bundle run_backward(bool split, bool checkpoint, std::vector<torch::Tensor>* param_grads,
                    bool offload = false, const std::function<void(Stage&)>& between = {},
                    const std::function<void(Stage&)>& after = {}) {
  Stage stage(1, 0, make_layers(3), torch::kCPU, 11);
  torch::manual_seed(5);
  std::vector<torch::Tensor> inputs = {torch::randn({4, 5}), torch::randn({3, 5})};
  std::vector<torch::Tensor> grads = {torch::randn({4, 3}), torch::randn({3, 3})};
  StageForwardOptions options;
  options.split_backward = split;
  options.checkpoint = checkpoint;
  options.offload = offload;
  Bundle result;
  for (int i = 0; i < 2; ++i)
    stage.forward(i, Bundle{{inputs[static_cast<size_t>(i)]}, {}}, options);
  if (between) between(stage);
  for (int i = 0; i < 2; ++i) {
    Bundle g{{grads[static_cast<size_t>(i)]}, {}};
    if (split) {
      result = stage.backward_input(i, g);
      stage.backward_weight(i);
    } else {
      result = stage.backward(i, g);
    }
  }
  EXPECT_EQ(stage.stashed_microbatches(), 0);
  if (after) after(stage);
  *param_grads = grads_of(stage.layers());
  return result;
}

TEST(Stage, InputThenWeightBackwardGivesExactlyTheFullBackwardGradients) {
  for (bool checkpoint : {false, true}) {
    std::vector<torch::Tensor> full_grads;
    std::vector<torch::Tensor> split_grads;
    Bundle full = run_backward(/*split=*/false, checkpoint, &full_grads);
    Bundle split = run_backward(/*split=*/true, checkpoint, &split_grads);
    ASSERT_EQ(full.tensors.size(), 1u);
    ASSERT_EQ(split.tensors.size(), 1u);
    EXPECT_TRUE(torch::equal(full.tensors[0], split.tensors[0])) << "input gradient differs";
    ASSERT_EQ(full_grads.size(), split_grads.size());
    ASSERT_FALSE(full_grads.empty());
    for (size_t p = 0; p < full_grads.size(); ++p) {
      EXPECT_TRUE(torch::equal(full_grads[p], split_grads[p]))
          << "parameter " << p << " checkpoint " << checkpoint << " max diff "
          << (full_grads[p] - split_grads[p]).abs().max().item<double>();
    }
  }
}

TEST(Stage, CheckpointKeepsOnlyInputsUntilBackward) {
  Stage kept(1, 0, make_layers(3), torch::kCPU, 1);
  Stage checkpointed(1, 0, make_layers(3), torch::kCPU, 1);
  torch::Tensor x = torch::randn({64, 5});
  StageForwardOptions never;
  StageForwardOptions always;
  always.checkpoint = true;
  kept.forward(0, Bundle{{x}, {}}, never);
  checkpointed.forward(0, Bundle{{x}, {}}, always);
  EXPECT_LT(checkpointed.accounting().peak_stashed_bytes, kept.accounting().peak_stashed_bytes);
  EXPECT_EQ(checkpointed.accounting().peak_stashed_bytes, 64 * 5 * 4);
}

// Linear+ReLU layers of known widths: what autograd keeps of a forward follows from the shapes.
// Linear saves its input (for the weight gradient), ReLU its result (for its mask), and each
// Linear's input is the previous ReLU's result (the first one's is the stage input): per
// micro-batch of `rows` the stage keeps the input and every ReLU result (the last one is the
// output), all float32. The Linear results die when the next ReLU has read them.
constexpr int64_t kRows = 16;
const std::vector<int64_t> kWidths = {24, 40, 32, 8};  // input, then each Linear's out_features

std::vector<StageLayer> linear_relu_layers() {
  torch::manual_seed(2);
  std::vector<StageLayer> layers;
  for (size_t l = 0; l + 1 < kWidths.size(); ++l) {
    layers.push_back({"linear" + std::to_string(l),
                      torch::nn::AnyModule(torch::nn::Linear(kWidths[l], kWidths[l + 1]))});
    layers.push_back({"relu" + std::to_string(l), torch::nn::AnyModule(torch::nn::ReLU())});
  }
  return layers;
}

int64_t float_bytes(int64_t rows, int64_t width) {
  return rows * width * static_cast<int64_t>(sizeof(float));
}

TEST(StageStash, AKeptMicroBatchHoldsItsInputAndTheTensorsAutogradSaved) {
  int64_t relu_results = 0;
  for (size_t l = 1; l < kWidths.size(); ++l) relu_results += float_bytes(kRows, kWidths[l]);
  const int64_t expected = float_bytes(kRows, kWidths[0]) + relu_results;
  for (int index : {0, 1}) {  // stage 0 (input without grad) and a middle stage
    Stage stage(index, 0, linear_relu_layers(), torch::kCPU, 1);
    stage.forward(0, Bundle{{torch::randn({kRows, kWidths[0]})}, {}}, StageForwardOptions{});
    EXPECT_EQ(stage.stashed_bytes(), expected) << "stage " << index;
    stage.forward(1, Bundle{{torch::randn({kRows, kWidths[0]})}, {}}, StageForwardOptions{});
    EXPECT_EQ(stage.stashed_bytes(), 2 * expected) << "stage " << index;
    EXPECT_EQ(stage.accounting().peak_stashed_bytes, 2 * expected) << "stage " << index;
    for (int i = 0; i < 2; ++i)
      stage.backward(i, Bundle{{torch::ones({kRows, kWidths.back()})}, {}});
    EXPECT_EQ(stage.stashed_bytes(), 0) << "stage " << index;
  }
}

TEST(StageStash, ACheckpointedMicroBatchHoldsOnlyItsInputUntilTheRecompute) {
  Stage stage(1, 0, linear_relu_layers(), torch::kCPU, 1);
  StageForwardOptions checkpoint;
  checkpoint.checkpoint = true;
  Bundle out = stage.forward(0, Bundle{{torch::randn({kRows, kWidths[0]})}, {}}, checkpoint);
  EXPECT_EQ(stage.stashed_bytes(), float_bytes(kRows, kWidths[0]))
      << "the output left with the Bundle; nothing else may stay";
  out = Bundle{};
  // The recompute before the backward rebuilds what a kept forward holds.
  int64_t relu_results = 0;
  for (size_t l = 1; l < kWidths.size(); ++l) relu_results += float_bytes(kRows, kWidths[l]);
  stage.backward(0, Bundle{{torch::ones({kRows, kWidths.back()})}, {}});
  EXPECT_EQ(stage.accounting().peak_stashed_bytes, float_bytes(kRows, kWidths[0]) + relu_results);
  EXPECT_EQ(stage.stashed_bytes(), 0);
}

TEST(StageStash, ASplitBackwardAlsoHoldsEachLinearResultForTheWeightPass) {
  // The per-layer record keeps every layer's output as a root for W: the Linear results too.
  int64_t layer_outputs = 0;
  for (size_t l = 1; l < kWidths.size(); ++l) layer_outputs += 2 * float_bytes(kRows, kWidths[l]);
  Stage stage(1, 0, linear_relu_layers(), torch::kCPU, 1);
  StageForwardOptions split;
  split.split_backward = true;
  stage.forward(0, Bundle{{torch::randn({kRows, kWidths[0]})}, {}}, split);
  EXPECT_EQ(stage.stashed_bytes(), float_bytes(kRows, kWidths[0]) + layer_outputs);
  stage.backward_input(0, Bundle{{torch::ones({kRows, kWidths.back()})}, {}});
  stage.backward_weight(0);
  EXPECT_EQ(stage.stashed_bytes(), 0);
}

class RecordRecompute : public torch::nn::Module {
 public:
  torch::Tensor forward(torch::Tensor x) {
    (is_recomputing() ? recomputes : forwards)++;
    return x * 2;
  }
  int forwards = 0;
  int recomputes = 0;
};

TEST(Stage, RecomputeRunsOnceBeforeBackwardWithTheRecomputeFlagSet) {
  auto probe = std::make_shared<RecordRecompute>();
  torch::nn::Sequential model(torch::nn::Linear(3, 3), torch::nn::AnyModule(probe));
  std::vector<StageLayer> layers;
  for (auto& module : *model) layers.push_back({"l", module});
  Stage stage(1, 0, layers, torch::kCPU, 1);
  StageForwardOptions options;
  options.checkpoint = true;
  stage.forward(0, Bundle{{torch::randn({2, 3})}, {}}, options);
  EXPECT_EQ(probe->forwards, 1);
  EXPECT_EQ(probe->recomputes, 0);
  stage.backward(0, Bundle{{torch::ones({2, 3})}, {}});
  EXPECT_EQ(probe->forwards, 1);
  EXPECT_EQ(probe->recomputes, 1);
}

TEST(Stage, UnpoppedSkipLeavesWithTheOutputsAndItsGradientComesBack) {
  torch::nn::Sequential model(torch::nn::Linear(3, 3), SkipStash("z"), torch::nn::Tanh());
  std::vector<StageLayer> layers;
  for (auto& module : *model) layers.push_back({"l", module});
  Stage stage(1, 0, layers, torch::kCPU, 1);
  Bundle out = stage.forward(0, Bundle{{torch::randn({2, 3})}, {}}, StageForwardOptions{});
  ASSERT_EQ(out.skip_names, std::vector<std::string>{"z"});
  ASSERT_EQ(out.tensors.size(), 2u);
  Bundle grads = stage.backward(0, Bundle{{torch::Tensor(), torch::ones({2, 3})}, {"z"}});
  ASSERT_EQ(grads.tensors.size(), 1u);
  EXPECT_TRUE(grads.tensors[0].defined());
}

TEST(Stage, SplitBackwardRejectsInPlaceLayers) {
  torch::nn::Sequential model(torch::nn::Linear(3, 3),
                              torch::nn::ReLU(torch::nn::ReLUOptions().inplace(true)));
  std::vector<StageLayer> layers;
  for (auto& module : *model) layers.push_back({"l", module});
  Stage stage(1, 0, layers, torch::kCPU, 1);
  StageForwardOptions options;
  options.split_backward = true;
  try {
    stage.forward(0, Bundle{{torch::randn({2, 3})}, {}}, options);
    FAIL() << "no error";
  } catch (const Error& error) {
    // Autograd refuses first (an in-place op on the layer's recorded input), which is the layer's
    // own failure (Runtime); the stage's version check, if reached, says BadInput. Both name it.
    EXPECT_TRUE(error.kind() == ErrorKind::Runtime || error.kind() == ErrorKind::BadInput)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("layer 'l'"), std::string::npos) << error.what();
  }
}

// Activation offload on a CPU stage: nothing is copied, but the inputs go through the same path
// as on a GPU (set aside after the forward, new leaves before the recompute), so the gradients
// show whether it is right. Micro-batch 0 is prefetched, 1 is brought back by the recompute.
TEST(StageOffload, CheckpointedInputsWaitAsideAndComeBackWithTheSameGradients) {
  for (bool split : {false, true}) {
    std::vector<torch::Tensor> expected_params;
    const Bundle expected = run_backward(split, /*checkpoint=*/true, &expected_params);
    std::vector<torch::Tensor> params;
    const Bundle result = run_backward(
        split, /*checkpoint=*/true, &params, /*offload=*/true,
        [](Stage& stage) {
          EXPECT_EQ(stage.offloaded_bytes(), (4 + 3) * 5 * 4);
          stage.prefetch(0);
          EXPECT_EQ(stage.offloaded_bytes(), 3 * 5 * 4);
          stage.prefetch(7);  // not stashed: nothing happens
        },
        [](Stage& stage) {
          EXPECT_EQ(stage.offloaded_bytes(), 0);
          EXPECT_EQ(stage.stashed_bytes(), 0);
          EXPECT_EQ(stage.accounting().peak_offloaded_bytes, (4 + 3) * 5 * 4);
        });
    ASSERT_EQ(result.tensors.size(), 1u);
    EXPECT_TRUE(torch::equal(result.tensors[0], expected.tensors[0])) << "split " << split;
    ASSERT_EQ(params.size(), expected_params.size());
    for (size_t p = 0; p < params.size(); ++p) {
      EXPECT_TRUE(torch::equal(params[p], expected_params[p])) << "split " << split << " " << p;
    }
  }
}

// A CPU stage's stash keeps counting what it offloaded (it never left), and a micro-batch that
// is not checkpointed offloads nothing.
TEST(StageOffload, OnTheCpuNothingIsFreedAndOnlyCheckpointedMicroBatchesCount) {
  int64_t stashed[2] = {0, 0};
  for (bool offload : {false, true}) {
    Stage stage(1, 0, make_layers(3), torch::kCPU, 11);
    StageForwardOptions options;
    options.checkpoint = true;
    options.offload = offload;
    stage.forward(0, Bundle{{torch::randn({4, 5})}, {}}, options);
    stashed[offload] = stage.stashed_bytes();
    options.checkpoint = false;
    stage.forward(1, Bundle{{torch::randn({4, 5})}, {}}, options);
    EXPECT_EQ(stage.offloaded_bytes(), offload ? 4 * 5 * 4 : 0);
  }
  EXPECT_EQ(stashed[1], stashed[0]);
  EXPECT_GT(stashed[1], 0);
}

// A skip received from an earlier stage waits aside with the inputs and gets its gradient.
TEST(StageOffload, AReceivedSkipWaitsAsideWithTheInputsAndGetsItsGradient) {
  std::vector<torch::Tensor> results[2];
  for (bool offload : {false, true}) {
    torch::manual_seed(2);
    torch::nn::Sequential model(torch::nn::Linear(3, 3), SkipPopAdd("z"), torch::nn::Tanh());
    std::vector<StageLayer> layers;
    int l = 0;
    for (auto& module : *model) layers.push_back({std::to_string(l++), module});
    Stage stage(1, 0, layers, torch::kCPU, 1);
    StageForwardOptions options;
    options.checkpoint = true;
    options.offload = offload;
    torch::manual_seed(4);
    const torch::Tensor x = torch::randn({2, 3});
    const torch::Tensor z = torch::randn({2, 3});
    stage.forward(0, Bundle{{x, z}, {"z"}}, options);
    EXPECT_EQ(stage.offloaded_bytes(), offload ? 2 * 2 * 3 * 4 : 0);
    Bundle grads = stage.backward(0, Bundle{{torch::ones({2, 3})}, {}});
    ASSERT_EQ(grads.tensors.size(), 2u);
    EXPECT_EQ(grads.skip_names, std::vector<std::string>{"z"});
    results[offload] = {grads.tensors[0], grads.tensors[1]};
  }
  for (size_t t = 0; t < 2; ++t) {
    ASSERT_TRUE(results[1][t].defined()) << t;
    EXPECT_TRUE(torch::equal(results[1][t], results[0][t])) << t;
  }
}

}  // namespace
}  // namespace pipetrain
