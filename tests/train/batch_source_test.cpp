// train/batch_source.h: TensorBatches reads rows in order and wraps; an epoch is ceil(R / N)
// steps; the run-length helpers count steps and epochs for sources with and without epochs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/train/batch_source.h"

namespace pipetrain::train {
namespace {

// A stream of sampled windows: no epochs.
class Stream final : public BatchSource {
 public:
  std::pair<torch::Tensor, torch::Tensor> at(int64_t k) const override {
    return {torch::full({1}, k), torch::full({1}, k)};
  }
  int64_t per_epoch() const override { return 0; }
};

TEST(TensorBatches, ReadsRowsInOrderAndWrapsPastTheLast) {
  const torch::Tensor rows = torch::arange(10, torch::kInt64);
  const TensorBatches batches(rows, rows * 2, 4);
  EXPECT_EQ(batches.per_epoch(), 3);  // ceil(10 / 4)
  auto [x0, y0] = batches.at(0);
  EXPECT_TRUE(torch::equal(x0, torch::tensor({0, 1, 2, 3}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(y0, x0 * 2));
  auto [x2, y2] = batches.at(2);  // rows 8, 9, then 0, 1
  EXPECT_TRUE(torch::equal(x2, torch::tensor({8, 9, 0, 1}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(y2, x2 * 2));
  EXPECT_THROW(TensorBatches(rows, torch::zeros({9}), 4), BadInput);
}

TEST(BatchSource, CountsStepsAndEpochsOfARun) {
  const torch::Tensor rows = torch::arange(10, torch::kInt64);
  const TensorBatches batches(rows, rows, 4);  // 3 steps an epoch
  EXPECT_EQ(batches.epoch_of(2), 0);
  EXPECT_EQ(batches.epoch_of(3), 1);
  EXPECT_TRUE(batches.ends_epoch(2));
  EXPECT_FALSE(batches.ends_epoch(3));
  EXPECT_EQ(batches.steps_in_epochs(2), 6);
  EXPECT_EQ(batches.epochs_begun(6), 2);
  EXPECT_EQ(batches.epochs_begun(7), 3);  // the third in part
  EXPECT_EQ(batches.epochs_begun(1), 1);

  const Stream stream;  // no epochs: an "epoch" is one step, and every run is one epoch
  EXPECT_EQ(stream.epoch_of(100), 0);
  EXPECT_FALSE(stream.ends_epoch(100));
  EXPECT_EQ(stream.steps_in_epochs(5), 5);
  EXPECT_EQ(stream.epochs_begun(100), 1);
}

}  // namespace
}  // namespace pipetrain::train
