// train::evaluate (train/evaluate.h): the row-weighted mean loss and the accuracy, whatever the
// batch, in eval mode, with the training mode restored.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/train/evaluate.h"

namespace pipetrain::train {
namespace {

torch::Tensor mean_squared(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::mse_loss(output, target);
}

torch::Tensor class_loss(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(output, target);
}

TEST(Evaluate, TheLossIsTheMeanOverRowsForAnyBatch) {
  torch::manual_seed(3);
  torch::nn::Sequential model(torch::nn::Linear(4, 2));
  const torch::Tensor x = torch::randn({10, 4});
  const torch::Tensor y = torch::randn({10, 2});
  const double whole = torch::mse_loss(model->forward(x), y).item<double>();
  for (int64_t batch : {1, 3, 10, 64}) {
    const Evaluation e = evaluate(model, mean_squared, x, y, EvaluateOptions().batch(batch));
    EXPECT_NEAR(e.loss, whole, 1e-6 * whole) << "batch " << batch;
    EXPECT_EQ(e.samples, 10);
    EXPECT_LT(e.accuracy, 0) << "not a classification";
  }
}

TEST(Evaluate, CountsTheRowsWhoseArgmaxIsTheTarget) {
  torch::nn::Sequential model{torch::nn::Identity()};
  // Rows 0 and 2 score class 1 highest, row 1 class 0; targets 1, 1, 1: two of three right.
  const torch::Tensor scores = torch::tensor({{0.0, 1.0}, {2.0, 0.0}, {0.5, 0.7}});
  const torch::Tensor targets = torch::tensor({1, 1, 1}, torch::kLong);
  const Evaluation e =
      evaluate(model, class_loss, scores, targets, EvaluateOptions().batch(2).classification(true));
  EXPECT_DOUBLE_EQ(e.accuracy, 2.0 / 3.0);
  EXPECT_NEAR(e.loss, class_loss(scores, targets).item<double>(), 1e-6);
}

TEST(Evaluate, RunsInEvalModeAndRestoresTraining) {
  torch::manual_seed(4);
  torch::nn::Sequential model(torch::nn::Dropout(0.5));
  model->train();
  const torch::Tensor x = torch::ones({8, 16});
  // With dropout live the output would differ from the input; in eval mode it is the input.
  const Evaluation e = evaluate(model, mean_squared, x, x);
  EXPECT_EQ(e.loss, 0.0);
  EXPECT_TRUE(model->is_training());
}

TEST(Evaluate, RejectsABadBatchAndRowsThatDiffer) {
  torch::nn::Sequential model{torch::nn::Identity()};
  const torch::Tensor x = torch::ones({4, 2});
  EXPECT_THROW(evaluate(model, mean_squared, x, x, EvaluateOptions().batch(0)), BadInput);
  EXPECT_THROW(evaluate(model, mean_squared, x, torch::ones({3, 2})), BadInput);
}

}  // namespace
}  // namespace pipetrain::train
