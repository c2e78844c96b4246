#include "pipetrain/train/optimizer.h"
#include "pipetrain/base/error.h"

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

}  // namespace
}  // namespace pipetrain::train
