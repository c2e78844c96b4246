// `pipetrain plan --model`: profile, search and recommend, end to end through build/pipetrain.
#include <gtest/gtest.h>

#include "../helpers/cli_run.h"
#include "../helpers/python.h"

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
