// Tests for DeferredBatchNorm (include/pipetrain/stage/batchnorm.h). The reference is always
// LibTorch's own torch::nn::BatchNorm1d/2d: on the whole mini-batch for running statistics, on one
// micro-batch for the forward output.
#include "pipetrain/stage/batchnorm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/stage/skip.h"

namespace pipetrain {
namespace {

torch::Tensor images(int64_t rows, int64_t seed) {
  torch::manual_seed(seed);
  return torch::randn({rows, 3, 4, 5}) * 2 + 0.5;
}

// Splits rows as the pipeline does: pieces of the given row counts.
std::vector<torch::Tensor> split_rows(const torch::Tensor& batch, std::vector<int64_t> sizes) {
  return batch.split_with_sizes(sizes, 0);
}

void expect_close(const torch::Tensor& got, const torch::Tensor& expected, const char* what) {
  EXPECT_TRUE(torch::allclose(got, expected, 1e-5, 1e-6))
      << what << "\n got      " << got << "\n expected " << expected;
}

TEST(DeferredBatchNorm, RunningStatisticsAfterAStepEqualBatchNormOnTheWholeMiniBatch) {
  DeferredBatchNorm deferred(DeferredBatchNormOptions(3).chunks(3));
  torch::nn::BatchNorm2d whole(3);
  for (int64_t step = 0; step < 2; ++step) {  // two steps: the momentum average compounds
    torch::Tensor batch = images(12, step);
    for (const auto& micro : split_rows(batch, {4, 4, 4})) deferred->forward(micro);
    whole->forward(batch);
    expect_close(deferred->running_mean, whole->running_mean, "running_mean");
    expect_close(deferred->running_var, whole->running_var, "running_var");
    EXPECT_EQ(deferred->num_batches_tracked.item<int64_t>(), step + 1);
  }
}

TEST(DeferredBatchNorm, UnevenMicroBatchesAreWeightedByTheirRows) {
  DeferredBatchNorm deferred(DeferredBatchNormOptions(3).chunks(3));
  torch::nn::BatchNorm2d whole(3);
  torch::Tensor batch = images(12, 7);
  for (const auto& micro : split_rows(batch, {6, 4, 2})) deferred->forward(micro);
  whole->forward(batch);
  expect_close(deferred->running_mean, whole->running_mean, "running_mean");
  expect_close(deferred->running_var, whole->running_var, "running_var");
}

TEST(DeferredBatchNorm, EachMicroBatchIsNormalizedWithItsOwnStatistics) {
  DeferredBatchNorm deferred(DeferredBatchNormOptions(3).chunks(2));
  torch::nn::BatchNorm2d reference(3);
  {
    torch::NoGradGuard no_grad;
    deferred->weight.copy_(torch::tensor({0.5, 2.0, -1.0}));
    deferred->bias.copy_(torch::tensor({0.1, -0.2, 0.3}));
    reference->weight.copy_(deferred->weight);
    reference->bias.copy_(deferred->bias);
  }
  for (const auto& micro : split_rows(images(8, 3), {4, 4})) {
    expect_close(deferred->forward(micro), reference->forward(micro), "output");
  }
}

TEST(DeferredBatchNorm, NothingIsCommittedBeforeTheLastMicroBatch) {
  DeferredBatchNorm deferred(DeferredBatchNormOptions(3).chunks(3));
  auto micro = split_rows(images(12, 1), {4, 4, 4});
  deferred->forward(micro[0]);
  deferred->forward(micro[1]);
  EXPECT_EQ(deferred->tracked(), 2);
  EXPECT_TRUE(torch::equal(deferred->running_mean, torch::zeros({3})));
  EXPECT_TRUE(torch::equal(deferred->running_var, torch::ones({3})));
  deferred->forward(micro[2]);
  EXPECT_EQ(deferred->tracked(), 0);
  EXPECT_FALSE(torch::equal(deferred->running_mean, torch::zeros({3})));
}

TEST(DeferredBatchNorm, RecomputeDoesNotCountTwice) {
  DeferredBatchNorm deferred(DeferredBatchNormOptions(3).chunks(3));
  torch::nn::BatchNorm2d whole(3);
  torch::Tensor batch = images(12, 4);
  auto micro = split_rows(batch, {4, 4, 4});
  SkipContext recompute;
  recompute.recomputing = true;
  for (int64_t i = 0; i < 3; ++i) {
    deferred->forward(micro[i]);
    SkipContextGuard guard(&recompute);  // the checkpointed forward runs again before backward
    deferred->forward(micro[i]);
    EXPECT_EQ(deferred->tracked(), (i + 1) % 3);
  }
  whole->forward(batch);
  expect_close(deferred->running_mean, whole->running_mean, "running_mean");
  expect_close(deferred->running_var, whole->running_var, "running_var");
  EXPECT_EQ(deferred->num_batches_tracked.item<int64_t>(), 1);
}

TEST(DeferredBatchNorm, CommitAfterFewerMicroBatchesThanChunksUsesTheRowsSeen) {
  // A mini-batch of 2 rows with chunks 4 arrives as 2 micro-batches of 1 row (each image still has
  // 20 values per channel).
  DeferredBatchNorm deferred(DeferredBatchNormOptions(3).chunks(4));
  torch::nn::BatchNorm2d whole(3);
  torch::Tensor batch = images(2, 5);
  for (const auto& micro : split_rows(batch, {1, 1})) deferred->forward(micro);
  EXPECT_EQ(deferred->tracked(), 2);
  commit_deferred_batch_norms(*deferred);
  whole->forward(batch);
  expect_close(deferred->running_mean, whole->running_mean, "running_mean");
  expect_close(deferred->running_var, whole->running_var, "running_var");
  deferred->commit();  // nothing tracked: no second update
  EXPECT_EQ(deferred->num_batches_tracked.item<int64_t>(), 1);
}

TEST(DeferredBatchNorm, CumulativeAverageWithoutMomentumMatchesBatchNorm) {
  DeferredBatchNorm deferred(DeferredBatchNormOptions(3).chunks(2).momentum(std::nullopt));
  torch::nn::BatchNorm2d whole(torch::nn::BatchNorm2dOptions(3).momentum(c10::nullopt));
  for (int64_t step = 0; step < 3; ++step) {
    torch::Tensor batch = images(6, 10 + step);
    for (const auto& micro : split_rows(batch, {3, 3})) deferred->forward(micro);
    whole->forward(batch);
  }
  expect_close(deferred->running_mean, whole->running_mean, "running_mean");
  expect_close(deferred->running_var, whole->running_var, "running_var");
}

TEST(DeferredBatchNorm, TwoAndThreeDimensionalInputsMatchBatchNorm1d) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{8, 3}, {8, 3, 5}}) {
    DeferredBatchNorm deferred(DeferredBatchNormOptions(3).chunks(2));
    torch::nn::BatchNorm1d whole(3);
    torch::manual_seed(9);
    torch::Tensor batch = torch::randn(shape) * 3 - 1;
    for (const auto& micro : split_rows(batch, {4, 4})) deferred->forward(micro);
    whole->forward(batch);
    expect_close(deferred->running_mean, whole->running_mean, "running_mean");
    expect_close(deferred->running_var, whole->running_var, "running_var");
  }
}

TEST(DeferredBatchNorm, EvalModeNormalizesWithTheRunningStatistics) {
  DeferredBatchNorm deferred(DeferredBatchNormOptions(3).chunks(1));
  torch::nn::BatchNorm2d reference(3);
  {
    torch::NoGradGuard no_grad;
    deferred->running_mean.copy_(torch::tensor({0.3, -0.1, 2.0}));
    deferred->running_var.copy_(torch::tensor({1.5, 0.2, 4.0}));
    reference->running_mean.copy_(deferred->running_mean);
    reference->running_var.copy_(deferred->running_var);
  }
  deferred->eval();
  reference->eval();
  torch::Tensor batch = images(4, 6);
  expect_close(deferred->forward(batch), reference->forward(batch), "output");
  EXPECT_EQ(deferred->num_batches_tracked.item<int64_t>(), 0);
}

TEST(DeferredBatchNorm, NamesItsParametersAndBuffersLikeBatchNorm) {
  DeferredBatchNorm deferred(DeferredBatchNormOptions(3));
  torch::nn::BatchNorm2d reference(3);
  EXPECT_EQ(deferred->named_parameters().keys(), reference->named_parameters().keys());
  EXPECT_EQ(deferred->named_buffers().keys(), reference->named_buffers().keys());
}

TEST(DeferredBatchNorm, AWrongChannelCountIsReportedWithTheShape) {
  DeferredBatchNorm deferred(DeferredBatchNormOptions(4));
  try {
    deferred->forward(torch::ones({2, 3}));
    FAIL() << "expected an error";
  } catch (const BadInput& error) {
    EXPECT_NE(std::string(error.what()).find("[2, 3]"), std::string::npos) << error.what();
  }
}

TEST(DeferredBatchNorm, AdoptsSharedTensorsButClonesIntoFreshOnes) {
  DeferredBatchNormTensors shared{torch::full({3}, 2.0).requires_grad_(), torch::zeros({3}),
                                  torch::full({3}, 0.5), torch::full({3}, 3.0),
                                  torch::zeros({}, torch::kLong)};
  shared.bias.requires_grad_();
  DeferredBatchNorm deferred(DeferredBatchNormOptions(3).chunks(1), shared);
  EXPECT_EQ(deferred->weight.unsafeGetTensorImpl(), shared.weight.unsafeGetTensorImpl());
  EXPECT_EQ(deferred->running_var.unsafeGetTensorImpl(), shared.running_var.unsafeGetTensorImpl());
  deferred->forward(images(4, 2));
  EXPECT_EQ(shared.num_batches_tracked.item<int64_t>(), 1);  // the owner of the tensors sees it

  auto copy = std::dynamic_pointer_cast<DeferredBatchNormImpl>(deferred->clone());
  ASSERT_NE(copy, nullptr);
  EXPECT_NE(copy->weight.unsafeGetTensorImpl(), shared.weight.unsafeGetTensorImpl());
  EXPECT_TRUE(torch::equal(copy->weight, shared.weight));
  EXPECT_TRUE(torch::equal(copy->running_mean, shared.running_mean));
  copy->forward(images(4, 3));
  EXPECT_EQ(shared.num_batches_tracked.item<int64_t>(), 1);
  EXPECT_EQ(copy->num_batches_tracked.item<int64_t>(), 2);
}

TEST(ConvertDeferredBatchNorm, ReplacesBatchNormsKeepingNamesAndValues) {
  torch::nn::Sequential model(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3),
                              torch::nn::ReLU());
  {
    torch::NoGradGuard no_grad;
    auto bn = model->ptr(1)->as<torch::nn::BatchNorm1d>();
    bn->weight.uniform_(0.5, 1.5);
    bn->bias.uniform_(-0.5, 0.5);
    bn->running_mean.uniform_(-1, 1);
    bn->running_var.uniform_(0.5, 2);
  }
  torch::nn::Sequential converted = convert_deferred_batch_norm(model, 2);
  EXPECT_EQ(converted->named_parameters().keys(), model->named_parameters().keys());
  EXPECT_EQ(converted->named_buffers().keys(), model->named_buffers().keys());
  auto* deferred = converted->ptr(1)->as<DeferredBatchNorm>();
  ASSERT_NE(deferred, nullptr);
  EXPECT_EQ(deferred->options.chunks(), 2);
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(torch::equal(converted->named_parameters()[item.key()], item.value()));
  }
  for (const auto& item : model->named_buffers()) {
    EXPECT_TRUE(torch::equal(converted->named_buffers()[item.key()], item.value()));
  }
  EXPECT_EQ(converted->ptr(0).get(), model->ptr(0).get());  // other layers shared, not copied

  // One step in 2 micro-batches updates the statistics like the original on the whole batch.
  torch::Tensor batch = torch::randn({10, 4});
  for (const auto& micro : batch.chunk(2)) converted->forward(micro);
  model->forward(batch);
  auto* original = model->ptr(1)->as<torch::nn::BatchNorm1d>();
  expect_close(deferred->running_mean, original->running_mean, "running_mean");
  expect_close(deferred->running_var, original->running_var, "running_var");
}

}  // namespace
}  // namespace pipetrain
