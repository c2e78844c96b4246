// runtime/gradient_reducer.h: buckets, the sums written back, undefined gradients; and end to end,
// `pipetrain train --nproc 4 --pp 2 --dp 2 --overlap-grad-reduce` ends with the blocking sum's
// weights bit for bit under every kind of schedule.
#include "pipetrain/runtime/gradient_reducer.h"

#include <stdlib.h>

#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/cli_run.h"
#include "../helpers/params_file.h"
#include "pipetrain/base/error.h"

namespace pipetrain {
namespace {

torch::Tensor parameter_with_grad(std::vector<float> grad) {
  torch::Tensor p = torch::zeros({static_cast<int64_t>(grad.size())}).requires_grad_();
  p.mutable_grad() = torch::tensor(grad);
  return p;
}

// Over a mirror group of 3 (every member holding these gradients) the sum is 3x each.
TEST(GradientReducer, PacksBucketsOfAtMostTheSizeAndWritesTheSumsBack) {
  GradientReducer reducer(C10dGroup::mirror(3), /*bucket_bytes=*/12);  // 3 floats
  const torch::Tensor a = parameter_with_grad({1, 2});
  const torch::Tensor b = parameter_with_grad({3});
  const torch::Tensor c = parameter_with_grad({4, 5, 6, 7});  // larger than a bucket: its own
  torch::Tensor none = torch::zeros({2}).requires_grad_();    // no gradient: counts as zeros
  reducer.start({a, b});
  reducer.start({c, none});
  EXPECT_EQ(reducer.buckets_started(), 3);  // {a, b}, {c}, {none}
  EXPECT_GE(reducer.finish(), 0.0);
  EXPECT_EQ(reducer.buckets_started(), 0);
  EXPECT_TRUE(torch::equal(a.grad(), torch::tensor({3.f, 6.f})));
  EXPECT_TRUE(torch::equal(b.grad(), torch::tensor({9.f})));
  EXPECT_TRUE(torch::equal(c.grad(), torch::tensor({12.f, 15.f, 18.f, 21.f})));
  ASSERT_TRUE(none.grad().defined());
  EXPECT_TRUE(torch::equal(none.grad(), torch::zeros({2})));
}

// CPU buckets are packed on the reducer's own thread: start() has returned before that, so a
// packing failure (a sparse gradient has no flat view) comes out of finish(), and the reducer is
// then still destroyed cleanly.
TEST(GradientReducer, APackingFailureOnItsThreadIsThrownByFinish) {
  GradientReducer reducer(C10dGroup::mirror(2), /*bucket_bytes=*/1 << 20);
  torch::Tensor sparse = torch::zeros({2}).requires_grad_();
  sparse.mutable_grad() = torch::ones({2}).to_sparse();
  const torch::Tensor dense = parameter_with_grad({1, 2});
  reducer.start({dense}, 0);
  reducer.start({sparse}, 1);
  EXPECT_EQ(reducer.buckets_started(), 2);
  EXPECT_THROW(reducer.finish(), std::exception);
}

TEST(GradientReducer, ABucketSizeBelowOneByteOrNoGroupIsRefused) {
  EXPECT_THROW(GradientReducer(C10dGroup::mirror(2), 0), BadInput);
  EXPECT_THROW(GradientReducer(nullptr, 1 << 20), BadInput);
}

std::string scratch(const std::string& name) {
  static const std::string dir = [] {
    std::string pattern = ::testing::TempDir() + "pipetrain_overlap_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << pattern;
    return pattern;
  }();
  return dir + "/" + name;
}

// The weights the overlapped run `tag` saved equal the blocking run's, bit for bit.
void expect_same_params(const std::string& tag) {
  const auto want = testing::load_params(scratch(tag + "_blocking.pt"));
  const auto got = testing::load_params(scratch(tag + "_overlap.pt"));
  ASSERT_EQ(got.size(), want.size()) << tag;
  for (const auto& [name, tensor] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(torch::equal(got.at(name), tensor)) << tag << ": " << name;
  }
}

// 2 pipeline ranks x 2 replicas, 4 SGD steps with momentum; buckets of 4 KiB so that a stage's
// gradients take several. Two replicas sum two numbers: the same bits in any order.
TEST(GradientReducer, OverlappedTrainingEqualsTheBlockingSumBitForBitUnderEverySchedule) {
  const std::string common =
      "train --data synthetic --synthetic-samples 128 --model mlp "
      "--model-options '{\"widths\": [784, 64, 32, 10]}' --batch-size 32 --seed 3 --steps 4 "
      "--optimizer sgd --lr 0.05 --momentum 0.9 --nproc 4 --pp 2 --dp 2 --chunks 4 ";
  for (const std::string schedule :
       {"gpipe", "1f1b", "interleaved-1f1b --virtual 2", "zb-h1", "zb-v"}) {
    const std::string tag = schedule.substr(0, schedule.find(' '));
    const testing::CliRun blocking = testing::run_pipetrain(
        common + "--schedule " + schedule + " --save-params " + scratch(tag + "_blocking.pt"));
    ASSERT_EQ(blocking.exit_code, 0) << blocking.output;
    const testing::CliRun overlapped = testing::run_pipetrain(
        common + "--schedule " + schedule + " --overlap-grad-reduce --bucket-size 0.004 " +
        "--save-params " + scratch(tag + "_overlap.pt"));
    ASSERT_EQ(overlapped.exit_code, 0) << overlapped.output;
    EXPECT_NE(overlapped.output.find("data-parallel gradient sum: "), std::string::npos)
        << overlapped.output;
    EXPECT_NE(overlapped.output.find("overlapped with the pipeline in buckets"), std::string::npos)
        << overlapped.output;
    EXPECT_NE(blocking.output.find("(mean over ranks; one blocking all-reduce)"), std::string::npos)
        << blocking.output;
    expect_same_params(tag);
  }
}

// ZeRO 1, 2 and 3 overlapped: each local stage's gradients are segments of the sharded layout
// (ShardedOptimizer's segments), cut at --bucket-size (4 KiB here: several per stage) and
// reduce-scattered as soon as the stage's last backward ends; at ZeRO-3 each is also gathered on
// its own. The same weights, bit for bit, as the same ZeRO stage reducing after the step (one
// segment per stage at ZeRO-3, one for everything at 1 and 2); AdamW, so that the sharded
// optimizer state matters.
TEST(GradientReducer, OverlappedZeroInSmallBucketsEqualsItsBlockingRunsBitForBit) {
  const std::string common =
      "train --data synthetic --synthetic-samples 128 --model mlp "
      "--model-options '{\"widths\": [784, 64, 32, 10]}' --batch-size 32 --seed 3 --steps 4 "
      "--optimizer adamw --lr 0.01 --nproc 4 --pp 2 --dp 2 --chunks 4 --clip-grad-norm 0.5 ";
  for (const std::string zero : {"1", "2", "3"}) {
    for (const std::string schedule : {"1f1b", "interleaved-1f1b --virtual 2", "zb-v"}) {
      const std::string tag = "zero" + zero + "_" + schedule.substr(0, schedule.find(' '));
      const std::string flags = common + "--zero " + zero + " --schedule " + schedule;
      const testing::CliRun blocking =
          testing::run_pipetrain(flags + " --save-params " + scratch(tag + "_blocking.pt"));
      ASSERT_EQ(blocking.exit_code, 0) << blocking.output;
      const testing::CliRun overlapped = testing::run_pipetrain(
          flags + " --overlap-grad-reduce --bucket-size 0.004 --save-params " +
          scratch(tag + "_overlap.pt"));
      ASSERT_EQ(overlapped.exit_code, 0) << overlapped.output;
      expect_same_params(tag);
    }
  }
}

TEST(GradientReducer, TheOverlapWithoutReplicasIsAUsageError) {
  const std::string common =
      "train --data synthetic --synthetic-samples 64 --model mlp --batch-size 16 --steps 1 ";
  const testing::CliRun alone = testing::run_pipetrain(common + "--nproc 2 --overlap-grad-reduce");
  EXPECT_EQ(alone.exit_code, 2) << alone.output;
  EXPECT_NE(alone.output.find("--overlap-grad-reduce overlaps the gradient sum over "
                              "data-parallel replicas: it needs --dp 2 or more"),
            std::string::npos)
      << alone.output;
  const testing::CliRun bucket =
      testing::run_pipetrain(common + "--nproc 4 --dp 2 --overlap-grad-reduce --bucket-size 0");
  EXPECT_EQ(bucket.exit_code, 2) << bucket.output;
}

}  // namespace
}  // namespace pipetrain
