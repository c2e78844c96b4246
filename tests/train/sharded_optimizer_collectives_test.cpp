// The order of a ShardedOptimizer's overlapped reductions (start_reduce, on its communication
// thread) against the other collectives of a step. Regressions, both found by CI's
// `--zero 3 --overlap-grad-reduce` run on the CNN:
// - the trainer summed the batch norms' statistics over the replicas' group while the optimizer's
//   thread could still be packing a reduce-scatter for that group, so one replica posted the
//   all-reduce first and the other the reduce-scatter (Gloo: "Received data size doesn't match
//   expected size", the rank aborted);
// - a step the loss scaler skips never reaches reduce_gradients(), and the reductions it started
//   were left marked started: the next step's start_reduce did nothing and its reduce_gradients
//   waited for the skipped step's.
#include <stdlib.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/cli_run.h"
#include "../helpers/multiprocess.h"
#include "../helpers/params_file.h"
#include "pipetrain/train/sharded_optimizer.h"

namespace pipetrain::train::sharded_optimizer_collectives_test {
namespace {

// One process, no replicas (the reduce-scatter is a copy, still made on the thread): a reduction
// started in a step that never reduces (skipped) is finished by zero_grad(), and the next step's
// start_reduce starts its own, whose gradient the step uses.
TEST(ShardedOptimizerCollectives, AReductionOfASkippedStepIsDroppedAndTheNextStepReducesItsOwn) {
  for (int stage : {1, 2, 3}) {
    torch::Tensor p = torch::full({1000}, 1.0f).requires_grad_(true);
    ShardedOptimizer sharded(nullptr, {p}, {p}, "sgd", OptimizerOptions().lr(0.5),
                             ZeroOptions().stage(stage), {{p}}, {0});
    sharded.zero_grad();
    sharded.wait_gathered(0);  // stage 3: the parameters whole for the step
    p.mutable_grad() = torch::full({1000}, 100.0f);
    sharded.start_reduce(0);             // the skipped step's: no reduce_gradients() follows
    sharded.post_started_collectives();  // as the trainer does after a step: 100 is packed
    sharded.zero_grad();
    sharded.wait_gathered(0);
    p.mutable_grad() = torch::full({1000}, 2.0f);
    sharded.start_reduce(0);
    sharded.reduce_gradients();
    sharded.step();
    sharded.gather_all();
    EXPECT_TRUE(torch::equal(p.detach(), torch::full({1000}, 0.0f)))
        << "ZeRO " << stage << ": weights " << p.detach().min().item<float>() << " to "
        << p.detach().max().item<float>() << ", not 1 - 0.5 x 2";
  }
}

// Two replicas through the Trainer (tests/helpers/rank_helper.cpp, CollectiveOrderRunner): the
// trainer's batch-norm all-reduce comes after the reduce-scatter the step started on both, though
// one replica's thread is still packing it when the step returns and the other's is not.
TEST(ShardedOptimizerCollectives, TheBatchNormSumComesAfterTheStartedReduceScatterOnEveryReplica) {
  const testing::RanksRun run = testing::run_ranks(2, {"zero_collective_order", "1"}, 0, 20000);
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  EXPECT_EQ(run.count("OK zero_collective_order"), 2) << run.output();
}

// TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective's order over each group
// (transport/c10d.h) while ZeRO-3's gathers, the overlapped reduce-scatters on the optimizer's
// thread and the batch-norm sums share the replicas' group: the CNN of CI's failure trains as it
// does without the checks, to the bit.
TEST(ShardedOptimizerCollectives, UnderDistributedDebugDetailTheCheckedRunEqualsTheUncheckedOne) {
  std::string dir = ::testing::TempDir() + "pipetrain_zero_order_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr) << dir;
  const std::string flags =
      "train --data synthetic --synthetic-samples 64 --model cnn --batch-size 16 --steps 3 "
      "--chunks 4 --optimizer adamw --lr 0.01 --nproc 4 --pp 2 --dp 2 --zero 3 "
      "--overlap-grad-reduce --save-params ";
  const testing::CliRun plain = testing::run_pipetrain(flags + dir + "/plain.pt");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const testing::CliRun checked = testing::run_command("env TORCH_DISTRIBUTED_DEBUG=DETAIL " +
                                                       std::string(PIPETRAIN_BINARY_DIR) +
                                                       "/pipetrain " + flags + dir + "/checked.pt");
  ASSERT_EQ(checked.exit_code, 0) << checked.output;
  EXPECT_EQ(testing::max_relative_difference(dir + "/checked.pt", dir + "/plain.pt"), 0);
  // The run says that it checks, and only that run says it.
  const std::string says = "TORCH_DISTRIBUTED_DEBUG=DETAIL: each collective is compared";
  EXPECT_NE(checked.output.find(says), std::string::npos) << checked.output;
  EXPECT_EQ(plain.output.find(says), std::string::npos) << plain.output;
}

// What ZeRO holds between steps, measured by counting this thread's allocations (two replicas,
// AdamW, float32): 16, 12, 10 and 8 bytes a parameter at stages 0 to 3, as the paper counts.
TEST(ShardedOptimizerCollectives, TwoReplicasHoldTheModelStatesThePaperCountsAtEveryStage) {
  testing::expect_zero_held_as_the_paper_counts(2);
}

}  // namespace
}  // namespace pipetrain::train::sharded_optimizer_collectives_test
