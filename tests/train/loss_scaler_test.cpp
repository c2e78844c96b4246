// Dynamic loss scaling (train/loss_scaler.h) and the Trainer running it: the scale's rule, float32
// weights unchanged by scaling (powers of two), and a step with a NaN gradient skipped on every
// stage while the scale halves.
#include "pipetrain/train/loss_scaler.h"

#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/train/step_runner.h"
#include "pipetrain/train/trainer.h"

namespace pipetrain::train {
namespace {

TEST(DynamicLossScaler, HalvesOnANonFiniteStepAndDoublesAfterTheGrowthInterval) {
  DynamicLossScaler scaler(LossScalerOptions().initial_scale(1024).growth_interval(3));
  EXPECT_EQ(scaler.scale(), 1024);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 512);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 512) << "two good steps of three";
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 1024);
  scaler.update(false);
  scaler.update(true);  // an overflow resets the run of good steps
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 512);
  EXPECT_EQ(scaler.good_steps(), 2);
  EXPECT_THROW(DynamicLossScaler(LossScalerOptions().backoff_factor(1.5)), BadInput);
}

// The scales DeepSpeed's DynamicLossScaler (runtime/fp16/loss_scaler.py at 0.19.6) holds after
// each update of one pattern of overflows (1), from 1024 with a window of 3: that class run with
// torch, its rank and logger stubbed, printing cur_scale after each update_scale. The third
// errs at its minimum scale, as DeepSpeed stops the run there.
TEST(DynamicLossScaler, DeepSpeedsRuleGivesItsScalesStepForStep) {
  const std::vector<int> overflows = {0, 0, 0, 0, 1, 0, 1, 1, 0, 0, 0,
                                      0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0};
  const auto run = [&](int64_t hysteresis, double min_scale, bool consecutive) {
    DynamicLossScaler scaler(LossScalerOptions()
                                 .rule(LossScaleRule::kDeepSpeed)
                                 .initial_scale(1024)
                                 .growth_interval(3)
                                 .hysteresis(hysteresis)
                                 .min_scale(min_scale)
                                 .consecutive_hysteresis(consecutive));
    std::vector<double> scales;
    for (int overflow : overflows) {
      try {
        scaler.update(overflow != 0);
      } catch (const Error& error) {
        EXPECT_NE(std::string(error.what()).find("minimum loss scale 256"), std::string::npos)
            << error.what();
        scales.push_back(-1);
        break;
      }
      scales.push_back(scaler.scale());
    }
    return scales;
  };
  EXPECT_EQ(run(2, 64, false),
            (std::vector<double>{1024, 1024, 1024, 2048, 2048, 2048, 1024, 512, 512, 512, 512,
                                 1024, 1024, 1024, 2048, 2048, 1024, 512,  512, 512, 512, 1024}));
  EXPECT_EQ(run(2, 64, true), (std::vector<double>{1024, 1024, 1024, 2048, 2048, 2048, 2048, 1024,
                                                   1024, 1024, 1024, 2048, 2048, 2048, 4096, 4096,
                                                   2048, 1024, 1024, 1024, 1024, 2048}));
  EXPECT_EQ(run(1, 256, false),
            (std::vector<double>{1024, 1024, 1024, 2048, 1024, 1024, 512, 256, 256, 256, 256, 512,
                                 512, 512, 1024, 512, 256, -1}));
  // Restored mid-run from its checkpoint form, it goes on as the run it was taken from.
  DynamicLossScaler a(LossScalerOptions().rule(LossScaleRule::kDeepSpeed).growth_interval(3));
  for (int overflow : {0, 0, 1, 0}) a.update(overflow != 0);
  DynamicLossScaler b(LossScalerOptions().rule(LossScaleRule::kDeepSpeed).growth_interval(3));
  b.restore(a.scale(), a.good_steps(), a.hysteresis_left());
  for (int overflow : {1, 0, 0, 0, 1, 1}) {
    a.update(overflow != 0);
    b.update(overflow != 0);
    EXPECT_EQ(a.scale(), b.scale());
  }
  // Static: the scale stays; a non-finite step is still skipped.
  DynamicLossScaler fixed(LossScalerOptions().rule(LossScaleRule::kStatic).initial_scale(128));
  fixed.update(true);
  fixed.update(false);
  EXPECT_EQ(fixed.scale(), 128);
  EXPECT_EQ(fixed.skipped_steps(), 1);
  EXPECT_EQ(parse_loss_scale_rule("deepspeed"), LossScaleRule::kDeepSpeed);
  EXPECT_THROW(parse_loss_scale_rule("apex"), BadInput);
  EXPECT_THROW(DynamicLossScaler(LossScalerOptions().hysteresis(0)), BadInput);
}

TEST(DynamicLossScaler, FindsInfAndNanGradients) {
  torch::Tensor a = torch::zeros({3}, torch::requires_grad());
  torch::Tensor b = torch::zeros({2}, torch::requires_grad());
  a.mutable_grad() = torch::ones({3});
  EXPECT_FALSE(has_non_finite_gradient({a, b}));  // b has no gradient: nothing to find
  b.mutable_grad() = torch::tensor({1.0f, std::numeric_limits<float>::quiet_NaN()});
  EXPECT_TRUE(has_non_finite_gradient({a, b}));
  b.mutable_grad() = torch::tensor({1.0f, std::numeric_limits<float>::infinity()});
  EXPECT_TRUE(has_non_finite_gradient({a, b}));
}

// Identity whose gradient becomes NaN on its `poisoned`-th forward (0-based): an fp16 overflow
// in miniature.
struct PoisonImpl : torch::nn::Module {
  explicit PoisonImpl(int poisoned) : poisoned(poisoned) {}
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor y = x * 1.0;
    if (calls++ == poisoned && y.requires_grad()) {
      y.register_hook([](torch::Tensor g) { return g * std::numeric_limits<float>::quiet_NaN(); });
    }
    return y;
  }
  int poisoned;
  int calls = 0;
};
TORCH_MODULE(Poison);

// Fixed rows, batch k = rows [8k, 8k+8) mod 32.
TensorBatches cycling_batches() {
  torch::manual_seed(11);
  const torch::Tensor x = torch::randn({32, 6});
  return TensorBatches(x, torch::randn({32, 2}), 8);
}

torch::Tensor squared_error(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::mse_loss(output, target);
}

torch::nn::Sequential poisonable_model(int poisoned = -1) {
  torch::manual_seed(5);
  return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Tanh(), Poison(poisoned),
                               torch::nn::Linear(16, 2));
}

std::map<std::string, torch::Tensor> parameters_now(torch::nn::Sequential& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model->named_parameters()) out[item.key()] = item.value().clone();
  return out;
}

TrainerOptions scaling_options(bool scaling) {
  return TrainerOptions(6).optimizer("adam").lr(0.01).clip_grad_norm(1.0).loss_scaling(scaling);
}

TEST(TrainerLossScaling, Float32WeightsAreBitEqualWithAndWithoutScaling) {
  const TensorBatches batches = cycling_batches();
  for (int stages : {1, 2}) {
    torch::nn::Sequential plain = poisonable_model();
    torch::nn::Sequential scaled = poisonable_model();
    auto runner = [&](torch::nn::Sequential model) {
      return stages == 1
                 ? make_sequential_runner(model, squared_error)
                 : make_pipe_runner(model, squared_error, PipeOptions().stages(2).chunks(2));
    };
    auto plain_runner = runner(plain);
    auto scaled_runner = runner(scaled);
    Trainer(plain, *plain_runner, batches, scaling_options(false)).fit();
    const TrainSummary summary =
        Trainer(scaled, *scaled_runner, batches, scaling_options(true)).fit();
    EXPECT_EQ(summary.skipped_steps, 0);
    const auto a = parameters_now(plain);
    const auto b = parameters_now(scaled);
    for (const auto& [name, tensor] : a) {
      EXPECT_TRUE(torch::equal(tensor, b.at(name))) << name << ", " << stages << " stage(s)";
    }
  }
}

TEST(TrainerLossScaling, ANanGradientSkipsThatStepOnEveryStageAndHalvesTheScale) {
  const TensorBatches batches = cycling_batches();
  torch::nn::Sequential model = poisonable_model(/*poisoned=*/2);  // step 2's gradient is NaN
  // Two stages: the NaN arises on stage 1 (Poison) and reaches stage 0's gradients too.
  auto runner = make_pipe_runner(model, squared_error, PipeOptions().stages(2).chunks(1));
  Trainer trainer(model, *runner, batches, scaling_options(true));
  std::map<std::string, torch::Tensor> before_step2, after_step2;
  std::vector<StepReport> reports;
  trainer.on_step = [&](const StepReport& r) {
    reports.push_back(r);
    if (r.step == 1) before_step2 = parameters_now(model);
    if (r.step == 2) after_step2 = parameters_now(model);
  };
  const TrainSummary summary = trainer.fit();
  ASSERT_EQ(reports.size(), 6u);
  EXPECT_EQ(summary.skipped_steps, 1);
  for (const auto& r : reports) EXPECT_EQ(r.skipped, r.step == 2) << "step " << r.step;
  EXPECT_EQ(reports[3].loss_scale, 0.5 * reports[2].loss_scale);
  for (const auto& [name, tensor] : before_step2) {
    EXPECT_TRUE(torch::equal(tensor, after_step2.at(name))) << name << " changed in a skipped step";
  }
  for (const auto& [name, tensor] : parameters_now(model)) {
    EXPECT_TRUE(torch::isfinite(tensor).all().item<bool>()) << name;
    EXPECT_FALSE(torch::equal(tensor, after_step2.at(name))) << name << " did not train after it";
  }
}

// fp16 on a GPU (two stages on cuda:0) with loss scaling ends near the float32 run's loss; runs
// under `make gpu-check` (its ^Cuda filter), skips without a GPU.
TEST(CudaTrainer, Fp16WithLossScalingOnOneGpuTrainsLikeFloat32) {
  if (torch::cuda::device_count() < 1) {
    GTEST_SKIP() << "needs 1 CUDA device; 0 visible (run `make gpu-check` on a GPU machine)";
  }
  const TensorBatches batches = cycling_batches();
  const std::vector<torch::Device> gpu(2, torch::Device(torch::kCUDA, 0));
  double last_loss[2] = {0, 0};
  for (Precision precision : {Precision::kFloat32, Precision::kFloat16}) {
    torch::nn::Sequential model = poisonable_model();
    auto runner = make_pipe_runner(
        model, squared_error, PipeOptions().stages(2).chunks(2).devices(gpu).precision(precision));
    const TrainSummary summary =
        Trainer(model, *runner, batches, scaling_options(precision == Precision::kFloat16)).fit();
    last_loss[precision == Precision::kFloat16] = summary.last_loss;
  }
  EXPECT_NEAR(last_loss[1], last_loss[0], 0.05 * last_loss[0]);
}

}  // namespace
}  // namespace pipetrain::train
