// DeepSpeed's ladder on the memory model (tune/zero_ladder.h): a Llama whose model states dwarf
// its activations climbs to the rung that fits, skipping what cannot run, and each rung's figures
// are the memory model's for its plan.
#include "pipetrain/tune/zero_ladder.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/models/llama_config.h"
#include "pipetrain/models/llama_profile.h"
#include "pipetrain/partition/memory.h"

namespace pipetrain::tune {
namespace {

// 6.3 M parameters (100 MB of float32 AdamW state) and 8 tokens a mini-batch. At this size the
// default 25 MiB buckets and prefetch are much of each ZeRO rung's memory: only ZeRO-Infinity's
// files bring a rank under 56 MiB.
partition::ModelProfile states_heavy_profile() {
  const models::LlamaConfig config = models::llama_config(
      /*vocab_size=*/8192, /*hidden_size=*/256, /*intermediate_size=*/1024, /*layers=*/4,
      /*heads=*/4, /*kv_heads=*/2);
  torch::manual_seed(0);
  const torch::Tensor sample = torch::randint(config.vocab_size, {2, 4}, torch::kInt64);
  return models::profile_llama(config, sample,
                               partition::ProfileOptions()
                                   .microbatch_sizes({1, 2})
                                   .warmup(0)
                                   .repeats(1)
                                   .min_trial_seconds(0)
                                   .measure_transfer(false));
}

partition::PlannerOptions adamw(int replicas, std::int64_t limit) {
  partition::PlannerOptions o;
  o.ranks = 2;
  o.optimizer_state_multiple = 2;
  o.data_parallel = replicas;
  o.memory_limit_bytes = limit;
  o.zero_policy.stream = true;  // the CLI's defaults: gradients streamed, ZeRO-3 by layer
  o.zero_policy.by_layer = true;
  return o;
}

TEST(ZeroLadder, ClimbsToTheFirstRungThatFitsAndSaysWhyItLeftEachBelow) {
  const partition::ModelProfile profile = states_heavy_profile();
  const std::int64_t pool = 64 << 10;
  const ZeroLadder ladder = walk_zero_ladder(profile, adamw(2, 56 << 20), true, pool);
  ASSERT_EQ(ladder.steps.size(), 7u);
  ASSERT_EQ(ladder.chosen, 6) << zero_ladder_text(ladder, 56 << 20);
  const ZeroLadderStep& nvme = ladder.steps[6];
  EXPECT_EQ(nvme.rung.name, "ZeRO 3 + NVMe");
  EXPECT_TRUE(nvme.fits);
  ASSERT_TRUE(nvme.plan.has_value());
  EXPECT_LE(nvme.rank_bytes, 56 << 20);
  // The figures are the memory model's for the chosen plan: device and host, every replica.
  partition::PlannerOptions o = adamw(2, 56 << 20);
  o.zero = 3;
  o.offload_optimizer = o.optimizer_state_in_files = o.parameters_in_files = true;
  o.gradients_in_files = true;
  o.offload_buffer_bytes = pool;
  std::int64_t machine = 0, largest = 0;
  for (const partition::RankMemory& r : partition::plan_memory(profile, *nvme.plan, o)) {
    const std::int64_t bytes = r.total() + r.offloaded + r.checkpoint_snapshot;
    machine += 2 * bytes;
    largest = std::max(largest, bytes);
  }
  EXPECT_EQ(nvme.rank_bytes, largest);
  EXPECT_EQ(nvme.machine_bytes, machine);
  // Every rung below it was tried (but the parameter offload to cpu, host memory already), each
  // over the limit, the least it needs more than ZeRO-Infinity's.
  for (int r = 0; r < 6; ++r) {
    const ZeroLadderStep& step = ladder.steps[static_cast<size_t>(r)];
    SCOPED_TRACE(step.rung.name);
    EXPECT_FALSE(step.fits);
    if (r == 5) {
      EXPECT_FALSE(step.tried);
      EXPECT_NE(step.why.find("skipped: on CPU stages"), std::string::npos) << step.why;
      continue;
    }
    EXPECT_TRUE(step.tried);
    EXPECT_GT(step.rank_bytes, 56 << 20);
    EXPECT_GT(step.rank_bytes, nvme.rank_bytes);
    EXPECT_NE(step.why.find("over the limit"), std::string::npos) << step.why;
  }
  // ZeRO shards the states: each rung below ZeRO-Infinity needs less than ZeRO 0.
  EXPECT_LT(ladder.steps[4].rank_bytes, ladder.steps[0].rank_bytes);
  const std::string text = zero_ladder_text(ladder, 56 << 20);
  EXPECT_NE(text.find("chosen: ZeRO 3 + NVMe (--zero 3 --offload-optimizer nvme --offload-params "
                      "nvme --offload-dir DIR), "),
            std::string::npos)
      << text;
}

TEST(ZeroLadder, StopsAtZeroZeroWhenItFitsAndSkipsShardingWithoutReplicas) {
  const partition::ModelProfile profile = states_heavy_profile();
  const ZeroLadder roomy = walk_zero_ladder(profile, adamw(2, std::int64_t{1} << 30), true, 0);
  EXPECT_EQ(roomy.chosen, 0);
  for (size_t r = 1; r < roomy.steps.size(); ++r) EXPECT_EQ(roomy.steps[r].why, "not needed");
  // One replica: ZeRO 1-3 shard over none; ZeRO-Offload and ZeRO-Infinity run at one.
  const ZeroLadder alone = walk_zero_ladder(profile, adamw(1, 56 << 20), true, 64 << 10);
  for (const int r : {1, 2, 4}) {
    EXPECT_FALSE(alone.steps[static_cast<size_t>(r)].tried);
    EXPECT_NE(alone.steps[static_cast<size_t>(r)].why.find("--dp 2 or more"), std::string::npos);
  }
  EXPECT_TRUE(alone.steps[3].tried);
  EXPECT_THROW(walk_zero_ladder(profile, adamw(2, 0), true, 0), BadInput);
}

}  // namespace
}  // namespace pipetrain::tune
