// `pipetrain train --offload-activations` on CPU stages: the same losses as without it (nothing
// moves on the CPU, but the inputs take the offload path), and after the last step a report of
// what was set aside per rank that says nothing was freed. In one process and in two.
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "../helpers/cli_run.h"

namespace pipetrain::train_offload_test {
namespace {

using testing::CliRun;

CliRun train(const std::string& extra) {
  return testing::run_pipetrain(
      "train --data synthetic --synthetic-samples 256 --model mlp "
      "--model-options '{\"widths\": [784, 64, 32, 10]}' --batch-size 32 --seed 3 --steps 8 "
      "--chunks 4 --checkpoint always " +
      extra);
}

std::string losses_of(const CliRun& run) {
  std::smatch m;
  if (!std::regex_search(run.output, m, std::regex("loss ([0-9.]+ -> [0-9.]+)"))) return "";
  return m[1].str();
}

// MiB set aside by `rank` in the report (-1 when absent).
double offloaded_mib(const CliRun& run, int rank) {
  std::smatch m;
  const std::regex line("  rank " + std::to_string(rank) + ": ([0-9.]+) MiB");
  if (!std::regex_search(run.output, m, line)) return -1;
  return std::stod(m[1].str());
}

TEST(TrainOffload, TrainsLikeWithoutItAndReportsWhatWasSetAsideOnEveryRank) {
  for (const std::string layout : {"--stages 2", "--nproc 2"}) {
    const CliRun plain = train(layout);
    const CliRun offload = train(layout + " --offload-activations");
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    ASSERT_EQ(offload.exit_code, 0) << offload.output;
    EXPECT_NE(losses_of(plain), "") << plain.output;
    EXPECT_EQ(losses_of(offload), losses_of(plain)) << layout << "\n" << offload.output;
    EXPECT_NE(offload.output.find("activation offload"), std::string::npos) << offload.output;
    EXPECT_NE(offload.output.find("nothing moved and nothing was freed"), std::string::npos)
        << offload.output;
    EXPECT_EQ(plain.output.find("activation offload"), std::string::npos) << plain.output;
    // Rank 0 sets aside its micro-batches' 784-wide inputs (8 rows each, 0.02 MiB and more).
    EXPECT_GT(offloaded_mib(offload, 0), 0) << offload.output;
  }
}

}  // namespace
}  // namespace pipetrain::train_offload_test
