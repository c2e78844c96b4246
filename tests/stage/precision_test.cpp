// Mixed precision of a stage (stage/precision.h): names, the autocast guard, and what a bf16
// stage hands on, receives and accumulates.
#include "pipetrain/stage/precision.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/stage/stage.h"

namespace pipetrain {
namespace {

TEST(Precision, ParsesItsNamesAndRejectsOthersListingThem) {
  EXPECT_EQ(parse_precision("fp32"), Precision::kFloat32);
  EXPECT_EQ(parse_precision("bf16"), Precision::kBFloat16);
  EXPECT_EQ(parse_precision("fp16"), Precision::kFloat16);
  EXPECT_STREQ(to_string(Precision::kBFloat16), "bf16");
  try {
    parse_precision("fp8");
    FAIL() << "fp8 was accepted";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("valid: fp32, bf16, fp16"), std::string::npos) << e.what();
  }
}

TEST(Precision, Fp16OnACpuStageIsBadInputThatSuggestsBf16) {
  try {
    check_precision_usable(Precision::kFloat16, torch::kCPU);
    FAIL() << "fp16 on the CPU was accepted";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("use bf16 on the CPU"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_precision_usable(Precision::kBFloat16, torch::kCPU));
}

TEST(AutocastGuard, RunsLinearInBfloat16AndRestoresTheThreadsStateAfter) {
  torch::nn::Linear linear(4, 3);
  const torch::Tensor x = torch::randn({2, 4});
  ASSERT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  {
    const AutocastGuard guard(Precision::kBFloat16, torch::kCPU);
    EXPECT_TRUE(at::autocast::is_autocast_enabled(at::kCPU));
    EXPECT_EQ(linear(x).scalar_type(), torch::kBFloat16);
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  EXPECT_EQ(linear(x).scalar_type(), torch::kFloat);
  {
    const AutocastGuard fp32(Precision::kFloat32, torch::kCPU);  // does nothing
    EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  }
}

// Two stages by hand: stage 0 hands bfloat16 values on, stage 1 (the last) computes the loss in
// float32 and hands back a bfloat16 input gradient; parameter gradients stay float32 and point
// the way the float32 ones do.
TEST(StagePrecision, Bf16StagesExchangeBfloat16AndKeepFloat32ParameterGradients) {
  auto run = [](Precision precision, std::vector<torch::Tensor>* param_grads) {
    torch::manual_seed(1);
    torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                                torch::nn::Linear(16, 4));
    std::vector<torch::nn::AnyModule> all(model->begin(), model->end());
    std::vector<StageLayer> first{{"0", all[0]}, {"1", all[1]}};
    std::vector<StageLayer> second{{"2", all[2]}};
    Stage s0(0, 0, first, torch::kCPU, 3);
    Stage s1(1, 2, second, torch::kCPU, 4);
    s0.set_precision(precision, /*last=*/false);
    s1.set_precision(precision, /*last=*/true);
    const torch::Tensor x = torch::randn({6, 8});
    const torch::Tensor y = torch::randn({6, 4});
    StageForwardOptions last;
    last.loss = [&](const std::vector<torch::Tensor>& out) {
      EXPECT_EQ(out[0].scalar_type(), torch::kFloat) << "the loss sees float32 outputs";
      return torch::mse_loss(out[0], y);
    };
    Bundle activation = s0.forward(0, Bundle{{x}, {}}, StageForwardOptions());
    torch::Tensor loss;
    s1.forward(0, activation, last, &loss);
    const Bundle gradient = s1.backward(0, Bundle());
    s0.backward(0, gradient);
    for (const auto& p : model->parameters()) param_grads->push_back(p.grad());
    return std::make_pair(activation.tensors[0].scalar_type(), gradient.tensors[0].scalar_type());
  };
  std::vector<torch::Tensor> bf16_grads, fp32_grads;
  const auto [activation, gradient] = run(Precision::kBFloat16, &bf16_grads);
  EXPECT_EQ(activation, torch::kBFloat16);
  EXPECT_EQ(gradient, torch::kBFloat16);
  const auto [activation32, gradient32] = run(Precision::kFloat32, &fp32_grads);
  EXPECT_EQ(activation32, torch::kFloat);
  EXPECT_EQ(gradient32, torch::kFloat);
  ASSERT_EQ(bf16_grads.size(), fp32_grads.size());
  for (size_t q = 0; q < bf16_grads.size(); ++q) {
    EXPECT_EQ(bf16_grads[q].scalar_type(), torch::kFloat);
    const double cosine =
        torch::cosine_similarity(bf16_grads[q].flatten(), fp32_grads[q].flatten(), 0)
            .item<double>();
    EXPECT_GT(cosine, 0.99) << "parameter " << q;
    EXPECT_FALSE(torch::equal(bf16_grads[q], fp32_grads[q])) << "bf16 computed nothing in bf16";
  }
}

}  // namespace
}  // namespace pipetrain
