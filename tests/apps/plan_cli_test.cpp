// `pipetrain plan` end to end: runs build/pipetrain and reads what it prints.
#include <gtest/gtest.h>

#include "../helpers/cli_run.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

using CommandResult = pipetrain::testing::CliRun;

CommandResult run_plan(const std::string& arguments) {
  return pipetrain::testing::run_pipetrain("plan " + arguments);
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/" + name;
}

TEST(PlanCli, JsonHasTheScheduleItsFiguresAndTheActions) {
  const CommandResult run = run_plan("--stages 4 --microbatches 8 --schedule 1f1b --format json");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto json = nlohmann::json::parse(run.output);
  EXPECT_EQ(json["schedule"], "1f1b");
  EXPECT_EQ(json["stages"], 4);
  EXPECT_EQ(json["microbatches"], 8);
  EXPECT_EQ(json["virtual_stages"], 1);
  // (K-1)/(M+K-1) = 3/11 with the default costs F=1, B=2.
  EXPECT_NEAR(json["bubble_fraction"].get<double>(), 3.0 / 11.0, 1e-9);
  EXPECT_NEAR(json["makespan"].get<double>(), 33.0, 1e-9);
  EXPECT_EQ(json["peak_activations"], (std::vector<int>{4, 3, 2, 1}));
  ASSERT_EQ(json["actions"].size(), 4u);
  EXPECT_EQ(json["actions"][3][0], "3F0");
  EXPECT_EQ(json["actions"][3][1], "3B0");
}

TEST(PlanCli, InterleavedJsonCountsVirtualStages) {
  const CommandResult run =
      run_plan("--stages 2 --microbatches 4 --schedule interleaved-1f1b --virtual 2 --format json");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto json = nlohmann::json::parse(run.output);
  EXPECT_EQ(json["virtual_stages"], 2);
  EXPECT_EQ(json["peak_activations"].size(), 4u);
}

TEST(PlanCli, BadInputExitsTwoWithWhatIsValid) {
  struct Case {
    const char* arguments;
    const char* expected;
  };
  for (const Case& c :
       {Case{"--stages 4 --microbatches 8 --schedule pipedream", "zb-h1"},
        Case{"--stages 0 --microbatches 8", "--stages"},
        Case{"--stages 4 --microbatches 0", "--microbatches"},
        Case{"--stages 4 --microbatches 8 --schedule interleaved-1f1b --virtual 0", "--virtual"},
        Case{"--stages 4 --microbatches 8 --cost-f -1", "--cost-f"},
        Case{"--stages 4 --microbatches 8 --format xml", "json, text, svg"},
        Case{"--stages 4 --microbatches 8 --format svg", "--output"},
        Case{"--stages four --microbatches 8", "four"},
        Case{"--schedule-file /nonexistent/x.sched", "/nonexistent/x.sched"}}) {
    const CommandResult run = run_plan(c.arguments);
    EXPECT_EQ(run.exit_code, 2) << c.arguments << "\n" << run.output;
    EXPECT_NE(run.output.find(c.expected), std::string::npos) << c.arguments << "\n" << run.output;
  }
}

TEST(PlanCli, MisorderedScheduleFileExitsTwoWithTheMarkedGrid) {
  const std::string path = temp_path("plan_cli_bad.sched");
  {
    std::ofstream out(path);
    out << "# rank 1 runs micro-batch 1 first: deadlock\n0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n";
  }
  const CommandResult run = run_plan("--schedule-file " + path);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("deadlock"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find(">1F1<"), std::string::npos) << run.output;
  std::remove(path.c_str());
}

TEST(PlanCli, CustomScheduleFileIsSimulated) {
  const std::string path = temp_path("plan_cli_good.sched");
  {
    std::ofstream out(path);
    out << "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n";
  }
  const CommandResult run = run_plan("--schedule-file " + path + " --format json");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto json = nlohmann::json::parse(run.output);
  EXPECT_EQ(json["schedule"], "custom");
  EXPECT_EQ(json["stages"], 2);
  EXPECT_EQ(json["microbatches"], 2);
  std::remove(path.c_str());
}

// The anchors: at F = I = W = 1 (B = 2), no comm, the bubble time (idle time of the
// worst rank between its first and last action) is the ZB paper's closed form, and the peaks are
// the papers' figures, in micro-batches of a rank's share.
TEST(PlanCli, ZeroBubbleJsonHasThePapersBubbleTimesAndPeaks) {
  for (const auto& [K, M] : {std::pair{4, 8}, std::pair{8, 32}}) {
    auto plan = [&, K = K, M = M](const std::string& schedule) {
      const CommandResult run =
          run_plan("--stages " + std::to_string(K) + " --microbatches " + std::to_string(M) +
                   " --schedule " + schedule + " --format json");
      EXPECT_EQ(run.exit_code, 0) << run.output;
      return nlohmann::json::parse(run.output);
    };
    auto peak = [](const nlohmann::json& json) {
      const auto peaks = json["peak_rank_activations"].get<std::vector<double>>();
      return *std::max_element(peaks.begin(), peaks.end());
    };
    const auto h1 = plan("zb-h1");
    const auto h2 = plan("zb-h2");
    const auto v = plan("zb-v");
    const auto half = plan("v-half");
    EXPECT_DOUBLE_EQ(h1["bubble_time"].get<double>(), K - 1.0);  // (p-1)(F+B-W)
    EXPECT_DOUBLE_EQ(h2["bubble_time"].get<double>(), 0.0);      // (p-1)(F+B-2W)
    EXPECT_DOUBLE_EQ(v["bubble_time"].get<double>(), 0.0);
    EXPECT_EQ(v["virtual_stages"], 2);
    EXPECT_DOUBLE_EQ(peak(h2), 2 * K - 1.0);
    EXPECT_DOUBLE_EQ(peak(v), K);  // 1F1B's
    EXPECT_DOUBLE_EQ(peak(half), (K + 2) / 2);
  }
}

TEST(PlanCli, ScheduleConstraintsExitTwoNamingTheSmallestSetting) {
  struct Case {
    const char* arguments;
    const char* expected;
  };
  for (const Case& c :
       {Case{"--stages 3 --microbatches 12 --schedule dualpipev", "use 4 ranks"},
        Case{"--stages 4 --microbatches 6 --schedule dualpipev", "8 or more"},
        Case{"--stages 4 --microbatches 8 --schedule zb-v --virtual 3", "set virtual_stages to 2"},
        Case{"--stages 4 --microbatches 8 --schedule zb-auto --activation-limit 0.5",
             "smallest limit that runs is 1"},
        Case{"--stages 4 --microbatches 8 --schedule 1f1b --activation-limit 2", "zb-auto"}}) {
    const CommandResult run = run_plan(c.arguments);
    EXPECT_EQ(run.exit_code, 2) << c.arguments << "\n" << run.output;
    EXPECT_NE(run.output.find(c.expected), std::string::npos) << c.arguments << "\n" << run.output;
  }
}

TEST(PlanCli, ZbAutoUsesTheGivenCostsAndLimit) {
  const CommandResult at_k = run_plan(
      "--stages 4 --microbatches 8 --schedule zb-auto --cost-f 1 --cost-i 2 --cost-w 0.5 "
      "--format json");
  const CommandResult at_2k = run_plan(
      "--stages 4 --microbatches 8 --schedule zb-auto --cost-f 1 --cost-i 2 --cost-w 0.5 "
      "--activation-limit 8 --format json");
  ASSERT_EQ(at_k.exit_code, 0) << at_k.output;
  ASSERT_EQ(at_2k.exit_code, 0) << at_2k.output;
  const auto a = nlohmann::json::parse(at_k.output);
  const auto b = nlohmann::json::parse(at_2k.output);
  for (double p : a["peak_rank_activations"]) EXPECT_LE(p, 4.0);
  for (double p : b["peak_rank_activations"]) EXPECT_LE(p, 8.0);
  EXPECT_LE(b["makespan"].get<double>(), a["makespan"].get<double>());
}

TEST(PlanCli, TorchCsvRoundTripsThroughSaveAndScheduleFile) {
  const std::string path = temp_path("plan_cli_zbv.csv");
  const CommandResult saved =
      run_plan("--stages 2 --microbatches 4 --schedule zb-v --format json --save " + path);
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const CommandResult loaded = run_plan("--schedule-file " + path + " --format json");
  ASSERT_EQ(loaded.exit_code, 0) << loaded.output;
  const auto a = nlohmann::json::parse(saved.output);
  const auto b = nlohmann::json::parse(loaded.output);
  EXPECT_EQ(a["actions"], b["actions"]);
  EXPECT_EQ(a["stage_rank"], b["stage_rank"]);
  {
    std::ofstream out(path);
    out << "0F0,0F1,0Z0\r\n1F0,1B0\r\n";
  }
  CommandResult bad = run_plan("--schedule-file " + path);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("row 1, cell '0Z0'"), std::string::npos) << bad.output;
  {
    std::ofstream out(path);
    out << "0F0,0F1,0B0\r\n1F0,1B0,1F1,1B1\r\n";  // 0B1 missing
  }
  bad = run_plan("--schedule-file " + path);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("rank 0"), std::string::npos) << bad.output;
  std::remove(path.c_str());
}

TEST(PlanCli, SvgIsWrittenToTheOutputFile) {
  const std::string path = temp_path("plan_cli.svg");
  const CommandResult run =
      run_plan("--stages 3 --microbatches 6 --schedule zb-h1 --format svg --output " + path);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::ifstream in(path);
  std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("zb-h1"), std::string::npos);
  std::remove(path.c_str());
}

TEST(PlanCli, TextDrawsTheTimeGrid) {
  const CommandResult run = run_plan("--stages 2 --microbatches 2 --schedule gpipe");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("rank 1"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("1F0"), std::string::npos) << run.output;
}

TEST(PlanCli, SixtyFourStagesFiveHundredTwelveMicrobatchesCompletes) {
  const auto start = std::chrono::steady_clock::now();
  const CommandResult run =
      run_plan("--stages 64 --microbatches 512 --schedule 1f1b --format json");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(run.exit_code, 0) << run.output.substr(0, 2000);
  const auto json = nlohmann::json::parse(run.output);
  EXPECT_NEAR(json["bubble_fraction"].get<double>(), 63.0 / 575.0, 1e-9);
  std::printf("pipetrain plan 64 x 512 1f1b: %.3f s wall (process start included)\n", seconds);
}

}  // namespace
