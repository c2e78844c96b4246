// Tests for sequence layouts and the cut of a batch into micro-batches
// (include/pipetrain/data/sequence_layout.h, batch.h).
#include "pipetrain/data/batch.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include "pipetrain/base/error.h"

namespace pipetrain::data::batch_test {
namespace {

TEST(SequenceLayout, PositionsRestartAtEverySegmentAndPaddingIsZero) {
  const SequenceLayout layout({{3, 2}, {4}}, 6);
  EXPECT_EQ(layout.longest(), 5);
  EXPECT_EQ(layout.used(1), 4);
  EXPECT_FALSE(layout.one_segment_per_row());
  const torch::Tensor expected = torch::tensor({0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 0, 0}).view({2, 6});
  EXPECT_TRUE(torch::equal(layout.positions(torch::kCPU), expected));
  const SequenceLayout along_rows({{3, 2}}, 6, /*by_document=*/false);
  EXPECT_TRUE(torch::equal(along_rows.positions(torch::kCPU), torch::arange(6).view({1, 6})));
  EXPECT_THROW(SequenceLayout({{5, 2}}, 6), BadInput);  // wider than its row
  EXPECT_THROW(SequenceLayout({{0}}, 6), BadInput);
  EXPECT_THROW(layout.slice(1, 1, 3), BadInput);  // row 1 uses 4 tokens
  EXPECT_EQ(layout.slice(1, 1, 4)->describe(), "1 rows x 4, 1 segments, 0 padding");
}

TEST(SequenceLayout, AScopeInstallsALayoutForTheCallingThreadOnly) {
  const SequenceLayout outer({{2}}, 2), inner({{1}}, 1);
  EXPECT_EQ(current_layout(), nullptr);
  {
    const LayoutScope a(&outer);
    EXPECT_EQ(current_layout(), &outer);
    {
      const LayoutScope b(&inner);
      EXPECT_EQ(current_layout(), &inner);
    }
    EXPECT_EQ(current_layout(), &outer);
  }
  EXPECT_EQ(current_layout(), nullptr);
}

// Four rows of width 8 using 2, 7, 3, 3 tokens, weighing 1, 6, 2, 2 targets.
Batch four_rows(int64_t pad_multiple) {
  Batch batch(torch::arange(32).view({4, 8}), torch::arange(32).view({4, 8}) + 100);
  batch.weights = torch::tensor({1.0, 6.0, 2.0, 2.0}, torch::kFloat64);
  batch.layout = std::make_shared<const SequenceLayout>(
      std::vector<std::vector<int64_t>>{{2}, {4, 3}, {3}, {1, 2}}, 8);
  batch.pad_multiple = pad_multiple;
  return batch;
}

TEST(SplitBatch, EachMicroBatchIsCutToItsOwnLongestRowRoundedUp) {
  const Batch batch = four_rows(1);
  check_batch(batch);
  EXPECT_DOUBLE_EQ(batch.total_weight(), 11.0);
  const std::vector<Microbatch> parts = split_batch(batch, {2, 2});
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].inputs[0].sizes(), (torch::IntArrayRef{2, 7}));
  EXPECT_EQ(parts[1].inputs[0].sizes(), (torch::IntArrayRef{2, 3}));
  EXPECT_EQ(parts[1].target.sizes(), (torch::IntArrayRef{2, 3}));
  EXPECT_TRUE(
      torch::equal(parts[1].inputs[0], torch::tensor({16, 17, 18, 24, 25, 26}).view({2, 3})));
  EXPECT_DOUBLE_EQ(parts[0].weight, 7.0);
  EXPECT_DOUBLE_EQ(parts[1].weight, 4.0);
  EXPECT_EQ(parts[1].layout->width(), 3);
  EXPECT_EQ(parts[1].layout->segments(1), (std::vector<int64_t>{1, 2}));
  // Rounded up to 4: 7 -> 8 (the whole width), 3 -> 4.
  const std::vector<Microbatch> rounded = split_batch(four_rows(4), {2, 2});
  EXPECT_EQ(rounded[0].inputs[0].size(1), 8);
  EXPECT_EQ(rounded[1].inputs[0].size(1), 4);
  EXPECT_EQ(padded_width(5, 4, 6), 6);
}

TEST(SplitBatch, RowsOfAReplicaKeepTheirWeightsAndLayout) {
  const Batch share = rows_of(four_rows(1), 1, 2);
  EXPECT_EQ(share.rows(), 2);
  EXPECT_DOUBLE_EQ(share.total_weight(), 8.0);
  EXPECT_EQ(share.layout->segments(0), (std::vector<int64_t>{4, 3}));
  const Batch plain(torch::zeros({3, 2}), torch::zeros({3}));
  EXPECT_DOUBLE_EQ(plain.total_weight(), 3.0);  // no weights: one a row
  EXPECT_DOUBLE_EQ(split_batch(plain, {2, 1})[0].weight, 2.0);
}

TEST(SplitBatch, ABatchWhosePartsDisagreeIsNamed) {
  Batch batch = four_rows(1);
  batch.targets = torch::zeros({3, 8});
  EXPECT_THROW(check_batch(batch), BadInput);
  batch = four_rows(1);
  batch.weights = torch::tensor({1.0, -1.0, 0.0, 0.0}, torch::kFloat64);
  EXPECT_THROW(check_batch(batch), BadInput);
  batch = four_rows(1);
  batch.inputs[0] = torch::zeros({4, 6}, torch::kInt64);
  try {
    check_batch(batch);
    FAIL() << "a layout of width 8 over rows of 6";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("4 rows x 8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pipetrain::data::batch_test
