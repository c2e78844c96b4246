// `pipetrain plan --model`: profile, search and recommend, end to end through build/pipetrain.
#include <gtest/gtest.h>

#include "../helpers/cli_run.h"
#include "../helpers/python.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

namespace {

using CliRun = pipetrain::testing::CliRun;

CliRun plan(const std::string& arguments) {
  return pipetrain::testing::run_pipetrain("plan " + arguments);
}

TEST(PlanModelCli, JsonRecommendsAPlanThatCoversTheModel) {
  const CliRun run = plan("--model mlp --sample-shape 32,784 --stages 2 --format json --top 3");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto json = nlohmann::json::parse(run.output);
  const auto& recommended = json["recommended"];
  for (const char* key : {"schedule", "chunks", "balance", "checkpoint", "virtual_stages",
                          "predicted_step_seconds", "peak_memory_bytes"}) {
    ASSERT_TRUE(recommended.contains(key)) << key << " missing in " << recommended.dump();
  }
  int layers = 0;
  for (int n : recommended["balance"]) layers += n;
  EXPECT_EQ(layers, static_cast<int>(json["profile"]["layers"].size()));
  EXPECT_EQ(recommended["balance"].size(), 2u * recommended["virtual_stages"].get<unsigned>());
  EXPECT_EQ(32 % recommended["chunks"].get<int>(), 0);
  EXPECT_LE(json["ranked"].size(), 3u);
  EXPECT_LE(recommended["predicted_step_seconds"].get<double>(),
            json["default"]["predicted_step_seconds"].get<double>());
}

// Real processes over loopback Gloo: the transfer measurement, the message calibration and both
// plans as 2 ranks each. Figures are not asserted (they are what the run measured), only that
// every part ran and reported.
TEST(PlanModelCli, VerifyWithProcessesRunsBothPlansAsTwoRanks) {
  const CliRun run = plan(
      "--model mlp --sample-shape 32,784 --stages 2 --format json --verify --processes "
      "--verify-steps 1 --verify-rounds 2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto json = nlohmann::json::parse(run.output.substr(run.output.find('{')));
  const auto& transfer = json["profile"]["transfer"];
  EXPECT_NE(transfer["method"].get<std::string>().find("Gloo"), std::string::npos)
      << transfer.dump();
  EXPECT_GT(transfer["latency_seconds"].get<double>(), 0);
  EXPECT_GT(transfer["message_seconds"].get<double>(), 0);
  ASSERT_EQ(json["verify"].size(), 2u) << json["verify"].dump();
  for (const auto& measured : json["verify"]) {
    EXPECT_EQ(measured["measured_step_seconds_per_round"].size(), 2u) << measured.dump();
    EXPECT_GT(measured["measured_step_seconds"].get<double>(), 0) << measured.dump();
    EXPECT_GT(measured["measured_compute_seconds_per_rank"].get<double>(), 0) << measured.dump();
  }
  EXPECT_GT(json["verify_recommended_over_default"].get<double>(), 0);
}

TEST(PlanModelCli, ATinyLimitExitsOneAndNamesTheSmallestLimitThatWorks) {
  const CliRun run = plan("--model mlp --sample-shape 32,784 --stages 2 --memory-limit 1KiB");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("smallest limit that works"), std::string::npos) << run.output;

  const CliRun json = plan(
      "--model mlp --sample-shape 32,784 --stages 2 --memory-limit 1KiB "
      "--format json");
  ASSERT_EQ(json.exit_code, 1) << json.output;
  const auto report = nlohmann::json::parse(json.output);
  const long long smallest = report["smallest_fitting_limit_bytes"];
  // Planning again with exactly that limit finds a plan that fits it.
  const CliRun again = plan(
      "--model mlp --sample-shape 32,784 --stages 2 --format json "
      "--memory-limit " +
      std::to_string(smallest));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_LE(
      nlohmann::json::parse(again.output)["recommended"]["peak_memory_bytes"].get<long long>(),
      smallest);
}

// --memory: the recommended plan's categories per rank; ZeRO 1 over 2 replicas halves the
// optimizer state (Adam: 2 x the parameters, then 2 x the half-shard), and plans for processes
// add the transport's buffers, which one process does not have.
TEST(PlanModelCli, MemoryPrintsEveryRanksCategoriesAndZeroShardsTheOptimizerState) {
  const std::string common =
      "--model mlp --sample-shape 32,784 --stages 2 --format json --optimizer adam --memory "
      "--schedules 1f1b ";
  const CliRun plain = plan(common);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const auto one = nlohmann::json::parse(plain.output)["memory_per_rank"];
  ASSERT_EQ(one.size(), 2u) << plain.output;
  const CliRun sharded = plan(common + "--zero 1 --dp 2 --processes");
  ASSERT_EQ(sharded.exit_code, 0) << sharded.output;
  const auto json = nlohmann::json::parse(sharded.output);
  const auto two = json["memory_per_rank"];
  ASSERT_EQ(two.size(), 2u);
  for (size_t r = 0; r < 2; ++r) {
    const auto params = one[r]["parameters"].get<long long>();
    EXPECT_GT(params, 0);
    EXPECT_EQ(one[r]["optimizer_state"].get<long long>(), 2 * params);
    EXPECT_EQ(one[r]["receive_buffers"].get<long long>() + one[r]["send_buffers"].get<long long>(),
              0);
    EXPECT_EQ(two[r]["parameters"].get<long long>(), params);
    const long long shard = (params / 4 + 1) / 2 * 4;  // float32 elements over 2, rounded up
    EXPECT_EQ(two[r]["optimizer_state"].get<long long>(), 2 * shard);
    EXPECT_EQ(two[r]["gradients"].get<long long>(), params + shard);
    EXPECT_GT(two[r]["receive_buffers"].get<long long>(), 0);
    EXPECT_GT(two[r]["send_buffers"].get<long long>(), 0);
  }
  // The plan's peak is the largest rank total of the same model.
  long long largest = 0;
  for (const auto& rank : two) largest = std::max(largest, rank["total"].get<long long>());
  EXPECT_EQ(json["recommended"]["peak_memory_bytes"].get<long long>(), largest);
  const CliRun no_replicas = plan(common + "--zero 1");
  EXPECT_EQ(no_replicas.exit_code, 2) << no_replicas.output;
  EXPECT_NE(no_replicas.output.find("--dp 2 or more"), std::string::npos) << no_replicas.output;
}

TEST(PlanModelCli, BadInputExitsTwoWithAMessage) {
  CliRun run = plan("--model mlp --sample-shape 32,x");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--sample-shape"), std::string::npos) << run.output;
  run = plan("--model no-such-model --sample-shape 4,784");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  run = plan("--model mlp --sample-shape 4,784 --memory-limit lots");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  run = plan("--model mlp --sample-shape 4,784 --stages 100");
  EXPECT_EQ(run.exit_code, 2) << run.output;
}

TEST(PlanModelCli, PlansATorchScriptFile) {
  const std::string dir = ::testing::TempDir() + "/plan_model_ts";
  const std::string make = pipetrain::testing::kPython + " " + std::string(PIPETRAIN_SOURCE_DIR) +
                           "/tests/apps/make_models.py mlp " + dir + " > /dev/null 2>&1";
  if (std::system(make.c_str()) != 0) GTEST_SKIP() << pipetrain::testing::no_python_torch_message();
  const CliRun run =
      plan("--model " + dir + "/mlp.pt --sample-shape 16,8 --stages 2 --format json");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto json = nlohmann::json::parse(run.output);
  EXPECT_EQ(json["profile"]["layers"].size(), 5u);
}

}  // namespace
