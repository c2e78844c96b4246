// autocast_linear (stage/autocast_linear.h): torch's bits under autocast, without the weight's cast
// kept for the backward.
#include "pipetrain/stage/autocast_linear.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/stage/allocation_counter.h"
#include "pipetrain/stage/device.h"
#include "pipetrain/stage/precision.h"

namespace pipetrain {
namespace {

struct LinearGrads {
  torch::Tensor y, dx, dw, db;
};

// y = f(x, w, b) under bf16 autocast, then dy pushed back through it: what each gets.
template <typename F>
LinearGrads run_linear(F f, const torch::Tensor& x0, const torch::Tensor& w0,
                       const torch::Tensor& b0, const torch::Tensor& dy,
                       const torch::Device& device = torch::kCPU) {
  torch::Tensor x = x0.to(device).clone().requires_grad_(true);
  torch::Tensor w = w0.to(device).clone().requires_grad_(true);
  torch::Tensor b = b0.defined() ? b0.to(device).clone().requires_grad_(true) : torch::Tensor();
  torch::Tensor y;
  {
    const AutocastGuard autocast(Precision::kBFloat16, device);
    y = f(x, w, b);
  }
  y.backward(dy.to(device));
  return {y.detach().cpu(), x.grad().cpu(), w.grad().cpu(),
          b.defined() ? b.grad().cpu() : torch::Tensor()};
}

void expect_same_bits(const torch::Tensor& a, const torch::Tensor& b, const char* what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined()) return;
  EXPECT_EQ(a.scalar_type(), b.scalar_type()) << what;
  EXPECT_EQ(a.sizes(), b.sizes()) << what;
  EXPECT_TRUE(torch::equal(a, b)) << what << ": differs by up to "
                                  << (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max();
}

void expect_torchs_bits(const torch::Device& device) {
  torch::manual_seed(7);
  const auto torch_linear = [](const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& b) { return torch::linear(x, w, b); };
  const auto ours = [](const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
    return autocast_linear(x, w, b);
  };
  for (const bool bias : {false, true}) {
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      for (const std::vector<int64_t>& shape :
           {std::vector<int64_t>{3, 37, 48}, std::vector<int64_t>{37, 48}}) {
        SCOPED_TRACE(std::string(bias ? "bias " : "no bias ") + c10::toString(dtype) + " " +
                     std::to_string(shape.size()) + "-d input");
        const torch::Tensor x = torch::randn(shape).to(dtype);
        const torch::Tensor w = torch::randn({29, 48});
        const torch::Tensor b = bias ? torch::randn({29}) : torch::Tensor();
        std::vector<int64_t> out = shape;
        out.back() = 29;
        const torch::Tensor dy = torch::randn(out).to(torch::kBFloat16);
        const LinearGrads want = run_linear(torch_linear, x, w, b, dy, device);
        const LinearGrads got = run_linear(ours, x, w, b, dy, device);
        EXPECT_EQ(want.y.scalar_type(), torch::kBFloat16);
        expect_same_bits(got.y, want.y, "output");
        expect_same_bits(got.dx, want.dx, "input gradient");
        expect_same_bits(got.dw, want.dw, "weight gradient");
        expect_same_bits(got.db, want.db, "bias gradient");
      }
    }
  }
}

TEST(AutocastLinear, HasTorchsBitsUnderAutocastWithAndWithoutBiasForAnyInputDtype) {
  expect_torchs_bits(torch::kCPU);
}

TEST(AutocastLinear, HasTorchsBitsUnderCudaAutocast) {
  if (cuda_device_count() < 1) GTEST_SKIP() << "no CUDA device is visible to this process";
  expect_torchs_bits(torch::Device(torch::kCUDA, 0));
}

TEST(AutocastLinear, AsksOnlyForTheGradientsABackwardWantsAsAZeroBubbleSplitDoes) {
  torch::manual_seed(8);
  const torch::Tensor x0 = torch::randn({4, 16, 32});
  const torch::Tensor w0 = torch::randn({24, 32});
  const torch::Tensor b0 = torch::randn({24});
  const torch::Tensor dy = torch::randn({4, 16, 24}).to(torch::kBFloat16);
  std::vector<torch::Tensor> want, got;
  for (const bool cast_on_use : {false, true}) {
    torch::Tensor x = x0.clone().requires_grad_(true);
    torch::Tensor w = w0.clone().requires_grad_(true);
    torch::Tensor b = b0.clone().requires_grad_(true);
    torch::Tensor y;
    {
      const AutocastGuard autocast(Precision::kBFloat16, torch::kCPU);
      y = cast_on_use ? autocast_linear(x, w, b) : torch::linear(x, w, b);
    }
    // The input's gradient first (I), then the weights' from the same graph (W).
    const torch::Tensor dx = torch::autograd::grad({y}, {x}, {dy}, /*retain_graph=*/true)[0];
    EXPECT_FALSE(w.grad().defined());
    const auto dwb = torch::autograd::grad({y}, {w, b}, {dy});
    (cast_on_use ? got : want) = {dx, dwb[0], dwb[1]};
  }
  expect_same_bits(got[0], want[0], "input gradient");
  expect_same_bits(got[1], want[1], "weight gradient");
  expect_same_bits(got[2], want[2], "bias gradient");
}

TEST(AutocastLinear, KeepsNoCastOfTheWeightForTheBackward) {
  const torch::Tensor x = torch::randn({2, 8, 256}).to(torch::kBFloat16).requires_grad_(true);
  const torch::Tensor w = torch::randn({512, 256}).requires_grad_(true);
  const int64_t cast_bytes = w.numel() * 2;
  const int64_t output_bytes = 2 * 8 * 512 * 2;
  for (const bool cast_on_use : {false, true}) {
    SCOPED_TRACE(cast_on_use ? "autocast_linear" : "torch::linear");
    AllocationCounter counter;
    torch::Tensor y;
    {
      CountAllocations counting(counter);
      const AutocastGuard autocast(Precision::kBFloat16, torch::kCPU);
      y = cast_on_use ? autocast_linear(x, w) : torch::linear(x, w);
    }
    // What the forward leaves alive until the backward: the output, and torch's cast of w.
    EXPECT_EQ(counter.live_bytes(), output_bytes + (cast_on_use ? 0 : cast_bytes));
    y.sum().backward();
    EXPECT_TRUE(w.grad().defined());
    w.mutable_grad().reset();
  }
}

TEST(AutocastLinear, IsTorchLinearOutsideAutocastAndWithoutGradients) {
  const torch::Tensor x = torch::randn({3, 5});
  const torch::Tensor w = torch::randn({4, 5}).requires_grad_(true);
  const torch::Tensor y = autocast_linear(x, w);
  EXPECT_EQ(y.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(y, torch::linear(x, w)));
  EXPECT_NE(y.grad_fn()->name().find("MmBackward"), std::string::npos) << y.grad_fn()->name();
  torch::NoGradGuard no_grad;
  const AutocastGuard autocast(Precision::kBFloat16, torch::kCPU);
  const torch::Tensor z = autocast_linear(x, w);
  EXPECT_EQ(z.scalar_type(), torch::kBFloat16);
  EXPECT_FALSE(z.requires_grad());
}

}  // namespace
}  // namespace pipetrain
