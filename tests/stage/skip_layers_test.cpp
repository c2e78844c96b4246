// SkipStash / SkipPopAdd (include/pipetrain/stage/skip_layers.h) run sequentially: the pair is a
// residual connection, with or without a projection, and a shape mismatch says how to fix it.
#include "pipetrain/stage/skip_layers.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/stage/skip.h"

namespace pipetrain {
namespace {

TEST(SkipLayers, StashAndPopAddEqualAHandWrittenResidualInValueAndGradient) {
  torch::manual_seed(0);
  torch::nn::Linear first(6, 6), second(6, 6);
  torch::nn::Sequential with_skips(SkipStash("r"), first, torch::nn::ReLU(), second,
                                   SkipPopAdd("r"));
  torch::Tensor x = torch::randn({4, 6}, torch::requires_grad());
  torch::Tensor y = with_skips->forward(x);
  torch::Tensor x2 = x.detach().clone().requires_grad_(true);
  torch::Tensor expected = x2 + second->forward(torch::relu(first->forward(x2)));
  EXPECT_TRUE(torch::allclose(y, expected));
  y.sum().backward();
  torch::Tensor first_grad = first->weight.grad().clone();
  first->weight.mutable_grad().zero_();
  expected.sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), x2.grad()));
  EXPECT_TRUE(torch::allclose(first_grad, first->weight.grad()));
}

TEST(SkipLayers, ProjectionMatchesAStridedConvolutionShortcut) {
  torch::manual_seed(0);
  torch::nn::Conv2d main_path(torch::nn::Conv2dOptions(4, 8, 3).stride(2).padding(1));
  SkipPopAdd add(SkipPopAddOptions("p").projection(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 8, 1).stride(2))));
  torch::nn::Sequential model(SkipStash("p"), main_path, add);
  torch::Tensor x = torch::randn({2, 4, 10, 10});
  torch::Tensor expected = main_path->forward(x) + add->projection.forward(x);
  EXPECT_TRUE(torch::allclose(model->forward(x), expected));
}

TEST(SkipLayers, ProjectionParametersAreNamedProjectionAndTrain) {
  SkipPopAdd add(SkipPopAddOptions("p").projection(torch::nn::Linear(3, 5)));
  const auto parameters = add->named_parameters();
  ASSERT_EQ(parameters.size(), 2u);
  EXPECT_TRUE(parameters.contains("projection.weight"));
  EXPECT_TRUE(parameters.contains("projection.bias"));
  stash("p", torch::randn({2, 3}));
  add->forward(torch::randn({2, 5})).sum().backward();
  EXPECT_TRUE(add->projection.ptr()->named_parameters()["weight"].grad().defined());
}

TEST(SkipLayers, ACloneHasItsOwnProjection) {
  SkipPopAdd add(SkipPopAddOptions("p").projection(torch::nn::Linear(3, 5)));
  auto copy = std::dynamic_pointer_cast<SkipPopAddImpl>(add->clone());
  ASSERT_TRUE(copy);
  torch::Tensor original = add->named_parameters()["projection.weight"];
  torch::Tensor cloned = copy->named_parameters()["projection.weight"];
  EXPECT_TRUE(torch::equal(original, cloned));
  {
    torch::NoGradGuard no_grad;
    cloned.add_(1);
  }
  EXPECT_FALSE(torch::equal(original, cloned)) << "the clone shares the original's projection";
}

TEST(SkipLayers, ShapeMismatchWithoutProjectionSaysHowToFix) {
  torch::nn::Sequential model(SkipStash("m"), torch::nn::Linear(4, 3), SkipPopAdd("m"));
  try {
    model->forward(torch::randn({2, 4}));
    FAIL() << "no error";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("projection"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'m'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pipetrain
