// Deferred batch norm across data-parallel replicas (stage/batchnorm.h, "Data-parallel
// replicas"): `pipetrain train --nproc 4 --dp 2` on the CNN example (batch norms) ends with the
// running statistics and the weights of the one-process run over the same micro-batches.
// Regression: each replica used to commit the statistics of its own share, the replicas'
// running_mean differed, and gathering the model at the end of an epoch failed ("buffer
// '1.running_mean' differs between two parts").
#include <stdlib.h>

#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/cli_run.h"
#include "pipetrain/train/checkpoint.h"

namespace pipetrain::train {
namespace {

std::string replica_test_path(const std::string& name) {
  static const std::string dir = [] {
    std::string pattern = ::testing::TempDir() + "pipetrain_dp_bn_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << pattern;
    return pattern;
  }();
  return dir + "/" + name;
}

// The CNN on 64 synthetic images, batches of 16: 4 steps, one epoch (it ends with an evaluation
// that gathers the model), a final checkpoint in `dir`.
testing::CliRun train_cnn(const std::string& layout, const std::string& dir) {
  return testing::run_pipetrain(
      "train --data synthetic --synthetic-samples 64 --model cnn --model-options "
      "'{\"width\": 8}' --batch-size 16 --optimizer sgd --lr 0.05 --seed 5 --checkpoint-format "
      "file --checkpoint-dir " +
      replica_test_path(dir) + " " + layout);
}

TEST(DataParallelBatchNorm, ReplicasCommitTheWholeMiniBatchsStatisticsAsOneProcessDoes) {
  // One process: 4 micro-batches of 4 rows. Two replicas: 8 rows each, 2 micro-batches of 4
  // rows: the same micro-batches, so the same normalization, gradients and statistics.
  const testing::CliRun one = train_cnn("--stages 2 --chunks 4", "one");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const testing::CliRun two = train_cnn("--nproc 4 --dp 2 --chunks 2", "two");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const Checkpoint a = load_checkpoint(replica_test_path("one/checkpoint.pt"));
  const Checkpoint b = load_checkpoint(replica_test_path("two/checkpoint.pt"));
  ASSERT_EQ(a.buffers.size(), b.buffers.size());
  int running = 0;
  for (const auto& [name, tensor] : a.buffers) {
    ASSERT_TRUE(b.buffers.count(name)) << name;
    const torch::Tensor other = b.buffers.at(name);
    if (!tensor.is_floating_point()) {
      EXPECT_TRUE(torch::equal(tensor, other)) << name;  // num_batches_tracked: one per step
      continue;
    }
    ++running;
    EXPECT_TRUE(torch::allclose(tensor, other, 1e-5, 1e-6))
        << name << ": max difference " << (tensor - other).abs().max().item<double>();
  }
  EXPECT_GT(running, 0) << "the CNN has batch norms";
  for (const auto& [name, tensor] : a.parameters) {
    EXPECT_TRUE(torch::allclose(tensor, b.parameters.at(name), 1e-5, 1e-6)) << name;
  }
}

}  // namespace
}  // namespace pipetrain::train
