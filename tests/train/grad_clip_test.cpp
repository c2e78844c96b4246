#include "pipetrain/train/grad_clip.h"

#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/train/finite_loss.h"

namespace pipetrain::train {
namespace {

// Two parameters with gradients (3, 4) and (12): global norm sqrt(9 + 16 + 144) = 13.
std::vector<torch::Tensor> parameters_with_norm_13() {
  torch::Tensor a = torch::zeros({2}, torch::requires_grad());
  torch::Tensor b = torch::zeros({1}, torch::requires_grad());
  torch::Tensor no_grad = torch::zeros({5}, torch::requires_grad());
  a.mutable_grad() = torch::tensor({3.0f, 4.0f});
  b.mutable_grad() = torch::tensor({12.0f});
  return {a, b, no_grad};
}

TEST(GradClip, SquaredNormSumsEveryGradient) {
  EXPECT_DOUBLE_EQ(local_grad_norm_squared(parameters_with_norm_13()), 169.0);
}

TEST(GradClip, TiedTensorCountsOnce) {
  auto parameters = parameters_with_norm_13();
  parameters.push_back(parameters[0]);
  EXPECT_DOUBLE_EQ(local_grad_norm_squared(parameters), 169.0);
}

TEST(GradClip, ClipScalesToTheMaxNormAndReturnsTheNormBefore) {
  auto parameters = parameters_with_norm_13();
  EXPECT_NEAR(clip_grad_norm(parameters, 6.5), 13.0, 1e-9);
  EXPECT_NEAR(std::sqrt(local_grad_norm_squared(parameters)), 6.5, 1e-5);
  EXPECT_TRUE(torch::allclose(parameters[0].grad(), torch::tensor({1.5f, 2.0f}), 1e-5));
}

TEST(GradClip, NormBelowTheMaximumIsLeftAlone) {
  auto parameters = parameters_with_norm_13();
  EXPECT_NEAR(clip_grad_norm(parameters, 100.0), 13.0, 1e-9);
  EXPECT_TRUE(parameters[1].grad().equal(torch::tensor({12.0f})));
}

TEST(GradClip, SplitFormAcrossTwoRanksEqualsTheWhole) {
  // Rank 0 holds a, rank 1 holds b; the runtime adds the squared norms.
  auto parameters = parameters_with_norm_13();
  double total = std::sqrt(local_grad_norm_squared({parameters[0]}) +
                           local_grad_norm_squared({parameters[1]}));
  double factor = clip_factor(total, 6.5);
  scale_gradients({parameters[0]}, factor);
  scale_gradients({parameters[1]}, factor);
  EXPECT_TRUE(torch::allclose(parameters[1].grad(), torch::tensor({6.0f}), 1e-5));
}

TEST(FiniteLoss, NanLossNamesTheStep) {
  EXPECT_NO_THROW(check_finite_loss(0.5, 3));
  try {
    check_finite_loss(std::nan(""), 42, 1, 7);
    FAIL() << "no error";
  } catch (const NonFiniteLossError& e) {
    EXPECT_EQ(e.step(), 42);
    std::string message = e.what();
    EXPECT_NE(message.find("nan at step 42"), std::string::npos) << message;
    EXPECT_NE(message.find("epoch 1, batch 7"), std::string::npos) << message;
  }
  EXPECT_THROW(check_finite_loss(INFINITY, 1), NonFiniteLossError);
}

}  // namespace
}  // namespace pipetrain::train
