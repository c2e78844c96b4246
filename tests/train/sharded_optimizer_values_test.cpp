// ZeroOptions::initial_values (train/sharded_optimizer.h): ZeRO-3 on parameters built without
// their values writes them as the shard takes them, one segment at a time, and frees each segment
// before the next one's values are written, in memory and with the shard in the offload file. In
// one process at one replica (no collectives): the layout's walk is the same at any replica count.
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/train/sharded_optimizer.h"

namespace pipetrain::train {
namespace {

// The values a parameter gets: its index everywhere, plus a ramp, so that a slice in the wrong
// place shows.
torch::Tensor values_of(size_t q, const torch::Tensor& p) {
  return torch::arange(p.numel(), torch::kFloat32).reshape(p.sizes()) + 1000.0 * (q + 1);
}

// `most_held`: the parameters holding values at once (the file takes them a sub-group at a time,
// and a sub-group may span two segments here).
void check_values_on_demand(const ZeroOptions& base, int most_held, const std::string& where) {
  torch::NoGradGuard no_grad;
  // Three layers of two parameters each (each parameter its own segment's), allocated without
  // values.
  std::vector<torch::Tensor> parameters;
  for (int64_t q = 0; q < 6; ++q) {
    parameters.push_back(torch::empty({20 + q, 100}).requires_grad_());
  }
  std::vector<std::vector<torch::Tensor>> segments;
  for (const torch::Tensor& p : parameters) segments.push_back({p});
  std::vector<size_t> asked;  // the order values were asked for
  std::vector<int> holding;   // how many parameters held storage when each was asked for
  std::set<size_t> written;
  ZeroOptions zero = base;
  zero.stage(3).offload(true).initial_values([&](const torch::Tensor& p) {
    size_t q = 0;
    while (!parameters[q].is_same(p)) ++q;
    if (!written.insert(q).second) return;  // once
    int held = 0;
    for (size_t r = 0; r < parameters.size(); ++r) {
      held += written.count(r) && parameters[r].storage().nbytes() > 0;
    }
    asked.push_back(q);
    holding.push_back(held);
    p.copy_(values_of(q, p));
  });
  ShardedOptimizer optimizer(nullptr, parameters, parameters, "adamw", OptimizerOptions(), zero,
                             segments);
  EXPECT_EQ(asked, (std::vector<size_t>{0, 1, 2, 3, 4, 5})) << where;
  // Each segment was freed as soon as the shard held it: never more than `most_held` at once.
  for (size_t i = 0; i < holding.size(); ++i) {
    EXPECT_GE(holding[i], 1) << where << " " << i;
    EXPECT_LE(holding[i], most_held) << where << " " << i;
  }
  for (const torch::Tensor& p : parameters) EXPECT_EQ(p.storage().nbytes(), 0u) << where;
  // The shard holds the values: gathered whole, they are the ones written.
  optimizer.gather_all();
  for (size_t q = 0; q < parameters.size(); ++q) {
    EXPECT_TRUE(torch::equal(parameters[q], values_of(q, parameters[q]))) << where << " " << q;
  }
  // Asked once: a second construction's take (after a gather) reads the parameters themselves.
  optimizer.zero_grad();
  EXPECT_EQ(asked.size(), parameters.size()) << where;
}

TEST(ShardedOptimizerValues, OnDemandAreWrittenASegmentAtATimeAndFreedBeforeTheNext) {
  check_values_on_demand(ZeroOptions(), 1, "in memory");
  const std::string dir = ::testing::TempDir() + "/sharded_optimizer_values";
  std::filesystem::create_directories(dir);
  check_values_on_demand(
      ZeroOptions().offload_to_nvme(true).offload_params_to_nvme(true).nvme(
          NvmeOptions().dir(dir).buffer_bytes(4096).buffer_count(4).sub_group_size(1024)),
      2, "in the offload file (sub-groups across the segments)");
}

// Anywhere else they would never be written: refused, naming the stage.
TEST(ShardedOptimizerValues, OnDemandBelowStageThreeIsRefused) {
  std::vector<torch::Tensor> parameters = {torch::zeros({4, 4}).requires_grad_()};
  const ZeroOptions zero =
      ZeroOptions().stage(2).offload(true).initial_values([](const torch::Tensor&) {});
  try {
    ShardedOptimizer optimizer(nullptr, parameters, parameters, "adamw", OptimizerOptions(), zero);
    ADD_FAILURE() << "not refused";
  } catch (const BadInput& error) {
    EXPECT_NE(std::string(error.what()).find("at stage 2"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace pipetrain::train
