#include "pipetrain/train/optimizer.h"
#include "pipetrain/base/error.h"

#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/train/lr_schedule.h"

namespace pipetrain::train {
namespace {

TEST(Optimizer, MakesEachNamedKind) {
  torch::Tensor w = torch::zeros({3}, torch::requires_grad());
  EXPECT_EQ(optimizer_name(*make_optimizer("sgd", {w})), "sgd");
  EXPECT_EQ(optimizer_name(*make_optimizer("adam", {w})), "adam");
  EXPECT_EQ(optimizer_name(*make_optimizer("adamw", {w})), "adamw");
}

TEST(Optimizer, UnknownNameListsTheValidNames) {
  torch::Tensor w = torch::zeros({3}, torch::requires_grad());
  try {
    make_optimizer("lamb", {w});
    FAIL() << "no error";
  } catch (const pipetrain::BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("'lamb'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("sgd, adam, adamw"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_optimizer("sgd", {}), pipetrain::BadInput);
  EXPECT_THROW(make_optimizer("sgd", {w}, OptimizerOptions().lr(0)), pipetrain::BadInput);
}

TEST(Optimizer, SgdStepMovesAgainstTheGradientByTheLearningRate) {
  torch::Tensor w = torch::ones({2}, torch::requires_grad());
  auto optimizer = make_optimizer("sgd", {w}, OptimizerOptions().lr(0.5).momentum(0));
  w.mutable_grad() = torch::tensor({2.0f, -4.0f});
  optimizer->step();
  EXPECT_TRUE(torch::allclose(w, torch::tensor({0.0f, 3.0f})));
}

TEST(Optimizer, TiedTensorListedTwiceIsUpdatedOnce) {
  torch::Tensor w = torch::ones({2}, torch::requires_grad());
  auto optimizer = make_optimizer("sgd", {w, w}, OptimizerOptions().lr(1.0).momentum(0));
  w.mutable_grad() = torch::ones({2});
  optimizer->step();
  EXPECT_TRUE(torch::allclose(w, torch::zeros({2}))) << w;
}

TEST(Optimizer, SetLearningRateReachesEveryGroup) {
  torch::Tensor a = torch::ones({1}, torch::requires_grad());
  torch::Tensor b = torch::ones({1}, torch::requires_grad());
  auto optimizer = make_optimizer("adam", {a});
  optimizer->add_param_group(
      torch::optim::OptimizerParamGroup({b}, std::make_unique<torch::optim::AdamOptions>(0.5)));
  set_learning_rate(*optimizer, 0.125);
  for (const auto& group : optimizer->param_groups()) EXPECT_EQ(group.options().get_lr(), 0.125);
  EXPECT_EQ(learning_rate(*optimizer), 0.125);
}

TEST(LrSchedule, WarmsUpLinearlyThenDecaysByCosineToTheFloor) {
  LrScheduleOptions options = LrScheduleOptions(1.0).warmup_steps(10).total_steps(110).min_lr(0.1);
  EXPECT_DOUBLE_EQ(learning_rate_at(options, 0), 0.1);   // 1/10 of the peak
  EXPECT_DOUBLE_EQ(learning_rate_at(options, 4), 0.5);   // 5/10
  EXPECT_DOUBLE_EQ(learning_rate_at(options, 9), 1.0);   // end of warm-up
  EXPECT_DOUBLE_EQ(learning_rate_at(options, 10), 1.0);  // cosine at 0
  // Half-way through the decay the cosine term is 0: midway between peak and floor.
  EXPECT_NEAR(learning_rate_at(options, 60), 0.55, 1e-12);
  // A quarter of the way: floor + (peak - floor) * (1 + cos(pi/4)) / 2.
  EXPECT_NEAR(learning_rate_at(options, 35), 0.1 + 0.9 * (1 + std::sqrt(0.5)) / 2, 1e-12);
  EXPECT_DOUBLE_EQ(learning_rate_at(options, 110), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate_at(options, 1000), 0.1);
}

TEST(LrSchedule, DecreasesMonotonicallyAfterWarmUp) {
  LrScheduleOptions options = LrScheduleOptions(3e-4).warmup_steps(5).total_steps(50);
  for (int64_t k = 6; k <= 50; ++k) {
    EXPECT_LE(learning_rate_at(options, k), learning_rate_at(options, k - 1)) << k;
  }
}

TEST(LrSchedule, WithoutTotalStepsStaysAtThePeak) {
  EXPECT_DOUBLE_EQ(learning_rate_at(LrScheduleOptions(0.01), 123456), 0.01);
}

TEST(LrSchedule, InvalidOptionsAreErrors) {
  EXPECT_THROW(learning_rate_at(LrScheduleOptions(1.0).min_lr(2.0), 0), pipetrain::BadInput);
  EXPECT_THROW(learning_rate_at(LrScheduleOptions(1.0).warmup_steps(10).total_steps(5), 0),
               pipetrain::BadInput);
}

// The rates DeepSpeed's own schedules (runtime/lr_schedules.py, 0.19.6) gave each optimizer step
// k, stepped as its engine steps them (the scheduler steps after each optimizer step): that file
// run with torch's SGD, printing param_groups[0]["lr"] before each step.
void expect_rates(const LrScheduleOptions& options,
                  const std::vector<std::pair<int, double>>& rates) {
  for (const auto& [k, rate] : rates) {
    EXPECT_DOUBLE_EQ(learning_rate_at(options, k), rate) << options.schedule() << " step " << k;
  }
}

TEST(LrSchedule, DeepSpeedsWarmupLrGivesItsRatesStepForStep) {
  const LrScheduleOptions log =
      LrScheduleOptions(0.1).schedule("warmup-lr").warmup_steps(10).warmup_min_lr(0.01);
  expect_rates(log, {{0, 0.01},
                     {1, 0.01},
                     {2, 0.037092699609758306},
                     {5, 0.07290730039024168},
                     {10, 0.09999999999999999},
                     {11, 0.1},
                     {14, 0.1}});
  expect_rates(LrScheduleOptions(log).warmup_type("linear"), {{0, 0.01},
                                                              {1, 0.01},
                                                              {2, 0.019000000000000003},
                                                              {5, 0.046000000000000006},
                                                              {10, 0.09100000000000001},
                                                              {11, 0.1},
                                                              {14, 0.1}});
  // warmup_num_steps 2 from 0: DeepSpeed's W is at least 2.
  expect_rates(LrScheduleOptions(0.5).schedule("warmup-lr").warmup_steps(2),
               {{0, 0.0}, {1, 0.0}, {2, 0.5}, {3, 0.5}});
}

TEST(LrSchedule, DeepSpeedsWarmupDecayAndWarmupCosineGiveItsRatesStepForStep) {
  expect_rates(LrScheduleOptions(0.1)
                   .schedule("warmup-decay-lr")
                   .warmup_steps(10)
                   .warmup_min_lr(0.01)
                   .total_steps(20),
               {{0, 0.01},
                {1, 0.01},
                {2, 0.037092699609758306},
                {10, 0.09999999999999999},
                {11, 0.1},
                {12, 0.09100000000000001},
                {16, 0.05500000000000001},
                {20, 0.019000000000000003},
                {21, 0.01},
                {29, 0.01}});
  // WarmupCosineLR's warmup_min_ratio 0.1 and cos_min_ratio 0.01 of the lr 0.1.
  expect_rates(LrScheduleOptions(0.1)
                   .schedule("warmup-cosine-lr")
                   .warmup_steps(10)
                   .warmup_min_lr(0.1 * 0.1)
                   .min_lr(0.01 * 0.1)
                   .total_steps(20),
               {{0, 0.0},
                {1, 0.010000000000000002},
                {2, 0.037092699609758306},
                {10, 0.09999999999999999},
                {11, 0.09757729755661011},
                {12, 0.09054634122155991},
                {16, 0.03520365877844011},
                {21, 0.001},
                {29, 0.001}});
  EXPECT_THROW(
      learning_rate_at(LrScheduleOptions(0.1).schedule("warmup-lr").warmup_type("cubic"), 0),
      pipetrain::BadInput);
  EXPECT_THROW(learning_rate_at(LrScheduleOptions(0.1).schedule("onecycle"), 0),
               pipetrain::BadInput);
}

}  // namespace
}  // namespace pipetrain::train
