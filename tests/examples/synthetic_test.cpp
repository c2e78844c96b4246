#include "pipetrain/examples/synthetic.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace pipetrain::examples {
namespace {

TEST(Synthetic, ClassificationHasTheRequestedShapesAndRange) {
  SyntheticData data = make_synthetic_classification(64, {3, 8, 8}, 5, 1);
  EXPECT_EQ(data.inputs.sizes(), torch::IntArrayRef({64, 3, 8, 8}));
  EXPECT_EQ(data.targets.sizes(), torch::IntArrayRef({64}));
  EXPECT_GE(data.targets.min().item<int64_t>(), 0);
  EXPECT_LE(data.targets.max().item<int64_t>(), 4);
}

TEST(Synthetic, SameSeedSameDataRegardlessOfTheGlobalGenerator) {
  torch::manual_seed(1);
  SyntheticData a = make_synthetic_regression(16, {10}, {2}, 42);
  torch::manual_seed(2);
  torch::randn({100});
  SyntheticData b = make_synthetic_regression(16, {10}, {2}, 42);
  SyntheticData c = make_synthetic_regression(16, {10}, {2}, 43);
  EXPECT_TRUE(a.inputs.equal(b.inputs));
  EXPECT_TRUE(a.targets.equal(b.targets));
  EXPECT_FALSE(a.inputs.equal(c.inputs));
  EXPECT_EQ(a.targets.sizes(), torch::IntArrayRef({16, 2}));
}

TEST(Synthetic, TokenTargetsAreTheInputsShiftedByOne) {
  SyntheticData data = make_synthetic_tokens(4, 12, 30, 7);
  using torch::indexing::Slice;
  EXPECT_TRUE(data.inputs.index({Slice(), Slice(1, 12)})
                  .equal(data.targets.index({Slice(), Slice(0, 11)})));
  EXPECT_LT(data.inputs.max().item<int64_t>(), 30);
}

}  // namespace
}  // namespace pipetrain::examples
