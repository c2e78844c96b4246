// Profiler: shapes and bytes it must get exactly, timings it must order correctly.
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "pipetrain/base/error.h"
#include "pipetrain/partition/planner.h"
#include "pipetrain/partition/profiler.h"
#include "pipetrain/stage/autocast_parameters.h"
#include "pipetrain/stage/device.h"
#include "pipetrain/stage/skip_layers.h"

namespace pipetrain::partition {
namespace {

ProfileOptions quick() {
  return ProfileOptions().warmup(1).repeats(3).min_trial_seconds(1e-4).measure_transfer(false);
}

TEST(Profiler, CountsParameterAndOutputBytesFromTheShapes) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(64, 32), torch::nn::ReLU(),
                              torch::nn::Linear(32, 8));
  const auto profile =
      profile_sequential(model, torch::randn({16, 64}), quick().microbatch_sizes({4, 16}));
  ASSERT_EQ(profile.num_layers(), 3);
  EXPECT_EQ(profile.layers[0].parameter_bytes, (64 * 32 + 32) * 4);
  EXPECT_EQ(profile.layers[1].parameter_bytes, 0);
  EXPECT_EQ(profile.layers[2].parameter_bytes, (32 * 8 + 8) * 4);
  ASSERT_EQ(profile.microbatch_sizes, (std::vector<std::int64_t>{4, 16}));
  EXPECT_EQ(profile.input_bytes[1], 16 * 64 * 4);
  EXPECT_EQ(profile.layers[0].costs[1].output_bytes, 16 * 32 * 4);
  EXPECT_EQ(profile.layers[2].costs[0].output_bytes, 4 * 8 * 4);
}

// cast_parameter_bytes: what autocast alone reads (the linears' weights and biases), decided over
// the whole model: a weight tied to an embedding, which reads it in float32, counts nowhere; the
// same weight tied between two linears counts in both (as parameter_bytes does). It survives the
// profile's JSON.
TEST(Profiler, CountsTheBytesAutocastAloneReadsOverTheWholeModel) {
  torch::manual_seed(0);
  torch::nn::Embedding embedding(8, 4);
  torch::nn::Linear first(4, 4), tied(4, 4), head(4, 8);
  tied->weight.set_data(first->weight.detach());  // values only: not a tie
  torch::nn::Sequential model(embedding, first, torch::nn::ReLU(), tied,
                              torch::nn::LayerNorm(torch::nn::LayerNormOptions({4})), head);
  const auto profile = profile_sequential(model, torch::randint(8, {4, 2}), quick());
  ASSERT_EQ(profile.num_layers(), 6);
  const std::vector<std::int64_t> expected = {0, 80, 0, 80, 0, 4 * 8 * 4 + 8 * 4};
  for (int l = 0; l < 6; ++l) {
    EXPECT_EQ(profile.layers[static_cast<size_t>(l)].cast_parameter_bytes,
              expected[static_cast<size_t>(l)])
        << "layer " << l;
  }
  const ModelProfile read = nlohmann::json(profile).get<ModelProfile>();
  EXPECT_EQ(read.layers[5].cast_parameter_bytes, expected[5]);

  // A head that names its weight as read through autocast alone, tied to the embedding's table,
  // which reads it in float32: alone the head would qualify; in the model it does not.
  struct TiedHeadImpl : torch::nn::Module, AutocastCastParameters {
    explicit TiedHeadImpl(torch::Tensor table) { weight = register_parameter("weight", table); }
    torch::Tensor forward(const torch::Tensor& x) { return torch::matmul(x, weight.t()); }
    std::vector<torch::Tensor> autocast_cast_parameters() const override { return {weight}; }
    torch::Tensor weight;
  };
  torch::nn::Sequential tied_model(
      embedding, first, torch::nn::AnyModule(std::make_shared<TiedHeadImpl>(embedding->weight)));
  const auto tied_profile = profile_sequential(tied_model, torch::randint(8, {4, 2}), quick());
  EXPECT_EQ(tied_profile.layers[0].cast_parameter_bytes, 0);
  EXPECT_EQ(tied_profile.layers[1].cast_parameter_bytes, 80);
  EXPECT_EQ(tied_profile.layers[2].cast_parameter_bytes, 0);
}

// A skip stashed before a boundary and popped after it crosses the boundary with the output (the
// receiving stage keeps it as an input), so it is part of what crosses there.
TEST(Profiler, OutputBytesIncludeTheSkipsInFlight) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(64, 32), SkipStash("a"), torch::nn::Linear(32, 32),
                              torch::nn::Tanh(), SkipPopAdd("a"), torch::nn::Linear(32, 8));
  const auto profile =
      profile_sequential(model, torch::randn({16, 64}), quick().microbatch_sizes({16}));
  const std::int64_t row = 16 * 32 * 4;
  EXPECT_EQ(profile.layers[0].costs[0].output_bytes, row);
  EXPECT_EQ(profile.layers[1].costs[0].output_bytes, 2 * row);  // the stash's own output too
  EXPECT_EQ(profile.layers[2].costs[0].output_bytes, 2 * row);
  EXPECT_EQ(profile.layers[3].costs[0].output_bytes, 2 * row);
  EXPECT_EQ(profile.layers[4].costs[0].output_bytes, row);  // popped
  EXPECT_EQ(profile.layers[5].costs[0].output_bytes, 16 * 8 * 4);
}

// A split backward's record keeps the input of each segment's first layer (a segment ends after a
// layer with parameters): x * 2 after a Linear begins one, x * 3 after it does not, and nothing
// else keeps x * 3's input (a multiply by a number saves nothing), so it is freed there, unless
// the layer begins a stage (split_first_activation_bytes).
TEST(Profiler, SplitBytesKeepEachSegmentsFirstInputAndAStagesFirstInput) {
  torch::nn::Sequential model(
      torch::nn::Linear(64, 32), torch::nn::Functional([](torch::Tensor x) { return x * 2; }),
      torch::nn::Functional([](torch::Tensor x) { return x * 3; }), torch::nn::Linear(32, 8));
  const auto profile =
      profile_sequential(model, torch::randn({16, 64}), quick().microbatch_sizes({16}));
  ASSERT_EQ(profile.method, "allocator");
  const std::int64_t row = 16 * 32 * 4;
  const LayerCost& doubled = profile.layers[1].costs[0];
  const LayerCost& tripled = profile.layers[2].costs[0];
  EXPECT_EQ(doubled.split_first_activation_bytes, doubled.split_activation_bytes);
  EXPECT_EQ(tripled.split_first_activation_bytes - tripled.split_activation_bytes, row);
  EXPECT_EQ(tripled.split_activation_bytes, tripled.activation_bytes);
}

TEST(Profiler, MeasuresTheActivationsAutogradKeeps) {
  torch::nn::Sequential model(torch::nn::Linear(64, 32), torch::nn::ReLU(),
                              torch::nn::Linear(32, 8));
  const auto profile =
      profile_sequential(model, torch::randn({16, 64}), quick().microbatch_sizes({16}));
  ASSERT_EQ(profile.method, "allocator");
  // Linear keeps its input (counted where it was made) and makes its output: +output.
  EXPECT_EQ(profile.layers[0].costs[0].activation_bytes, 16 * 32 * 4);
  // ReLU keeps its result, not its input, so the Linear's output is freed: net zero.
  EXPECT_EQ(profile.layers[1].costs[0].activation_bytes, 0);
  EXPECT_EQ(profile.layers[2].costs[0].activation_bytes, 16 * 8 * 4);
}

TEST(Profiler, TimesABigLayerLongerThanASmallOne) {
  torch::nn::Sequential model(torch::nn::Linear(512, 512), torch::nn::Linear(512, 4),
                              torch::nn::Linear(4, 4));
  const auto profile =
      profile_sequential(model, torch::randn({64, 512}), quick().microbatch_sizes({64}));
  const auto& big = profile.layers[0].costs[0];
  const auto& small = profile.layers[2].costs[0];
  EXPECT_GT(big.forward_seconds, 5 * small.forward_seconds);
  EXPECT_GT(big.backward_weight_seconds, 0);
  // The first layer's input is data: no input gradient.
  EXPECT_EQ(big.backward_input_seconds, 0);
  EXPECT_GT(small.backward_input_seconds, 0);
  EXPECT_GT(small.backward_seconds, 0);
  EXPECT_GT(profile.layers[0].update_seconds, profile.layers[2].update_seconds);
}

TEST(Profiler, DefaultSizesArePowersOfTwoDividingTheBatch) {
  torch::nn::Sequential model(torch::nn::Linear(8, 8));
  const auto profile = profile_sequential(model, torch::randn({12, 8}), quick());
  EXPECT_EQ(profile.microbatch_sizes, (std::vector<std::int64_t>{1, 3, 6, 12}));
  EXPECT_EQ(profile.batch_size, 12);
}

TEST(Profiler, ProfileRoundTripsThroughJson) {
  torch::nn::Sequential model(torch::nn::Linear(8, 8), torch::nn::Tanh());
  const auto profile = profile_sequential(model, torch::randn({4, 8}), quick());
  const nlohmann::json json = profile;
  const ModelProfile back = json.get<ModelProfile>();
  ASSERT_EQ(back.num_layers(), 2);
  EXPECT_EQ(back.microbatch_sizes, profile.microbatch_sizes);
  EXPECT_EQ(back.layers[0].costs.back().forward_seconds,
            profile.layers[0].costs.back().forward_seconds);
  EXPECT_EQ(back.layers[1].costs.back().activation_bytes,
            profile.layers[1].costs.back().activation_bytes);
  EXPECT_EQ(back.calibrated, false);
  EXPECT_EQ(back.concurrent_compute_scale, 1.0);
}

TEST(Profiler, NamesTheLayerThatCannotTakeItsInput) {
  torch::nn::Sequential model(torch::nn::Linear(8, 8), torch::nn::Linear(9, 2));
  try {
    profile_sequential(model, torch::randn({4, 8}), quick());
    FAIL() << "expected an error";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1"), std::string::npos) << e.what();
  }
}

// A layer whose parameter lives on the meta device: a device other than the batch's on any
// machine (Module::to(kMeta) is refused by LibTorch's set_data).
struct MetaScaleImpl : torch::nn::Module {
  MetaScaleImpl() { scale = register_parameter("scale", torch::ones({8}, torch::kMeta)); }
  torch::Tensor forward(const torch::Tensor& x) { return x * scale; }
  torch::Tensor scale;
};
TORCH_MODULE(MetaScale);

TEST(Profiler, AModelAndABatchOnDifferentDevicesAreAnErrorNamingTheParameter) {
  torch::nn::Sequential model(torch::nn::Linear(8, 8), MetaScale());
  try {
    profile_sequential(model, torch::randn({4, 8}), quick());
    FAIL() << "expected an error";
  } catch (const BadInput& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("parameter 1.scale is on meta"), std::string::npos) << message;
    EXPECT_NE(message.find("the sample batch on cpu"), std::string::npos) << message;
  }
}

TEST(DeviceTime, OnTheCpuIsTheWallClockTimeOfEveryCall) {
  int calls = 0;
  const double seconds = time_on_device(torch::kCPU, 3, [&] {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the work timed: 2 ms at least
  });
  EXPECT_EQ(calls, 3);
  EXPECT_GE(seconds, 0.006);
  EXPECT_LT(seconds, 1.0);
  EXPECT_THROW(time_on_device(torch::kCPU, 0, [] {}), BadInput);
}

TEST(ProfiledPlan, RecommendsNoSlowerThanTheHandWrittenDefault) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(128, 256), torch::nn::ReLU(),
                              torch::nn::Linear(256, 256), torch::nn::ReLU(),
                              torch::nn::Linear(256, 16));
  const auto profile = profile_sequential(model, torch::randn({32, 128}), quick());
  PlannerOptions options;
  options.ranks = 2;
  const PlanReport report = plan_pipeline(profile, options);
  ASSERT_TRUE(report.found());
  const Plan fallback = evaluate_plan(profile, default_plan(profile, 2, 4), options);
  EXPECT_LE(report.recommended().predicted_step_seconds, fallback.predicted_step_seconds);
}

TEST(LocalTransfer, MeasuresAPositiveHandOffLatency) {
  const TransferModel model = measure_local_transfer(3);
  EXPECT_GT(model.latency_seconds, 0);
  EXPECT_LT(model.latency_seconds, 0.01);
  EXPECT_FALSE(std::isfinite(model.bytes_per_second));
}

}  // namespace
}  // namespace pipetrain::partition
