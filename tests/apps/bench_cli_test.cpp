// `pipetrain bench` end to end with tiny sizes: the JSON contract (fields present, positive and
// consistent with one another). Timing targets are never asserted here: they are what the bench
// measures, and a loaded test machine would make them flaky.
#include <gtest/gtest.h>

#include "../helpers/cli_run.h"

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

namespace {

using nlohmann::json;

// stdout only: progress lines go to stderr, stdout is the JSON report.
pipetrain::testing::CliRun run_bench(const std::string& arguments) {
  return pipetrain::testing::run_pipetrain("bench " + arguments,
                                           pipetrain::testing::CliOptions().without_stderr());
}

const json* find(const json& configs, const std::string& runtime, const std::string& schedule,
                 int stages, int chunks, const std::string& checkpoint) {
  for (const json& row : configs) {
    if (row["runtime"] == runtime && row["schedule"] == schedule && row["stages"] == stages &&
        row["chunks"] == chunks && row["checkpoint"] == checkpoint && row["virtual_stages"] == 1 &&
        row.value("precision", "fp32") == "fp32") {
      return &row;
    }
  }
  return nullptr;
}

// One tiny run shared by the tests below (each configuration is a child process).
const json& tiny_report() {
  static const json report = [] {
    const pipetrain::testing::CliRun run = run_bench(
        "--suite mlp --width 32 --batch 16 --chunks 4 --steps 1 --warmup 0 --rounds 2 --threads 2 "
        "--no-python --bf16 --json");
    EXPECT_EQ(run.exit_code, 0) << run.output;
    try {
      return json::parse(run.output);
    } catch (const json::exception& e) {
      ADD_FAILURE() << "not one JSON object: " << e.what() << "\n" << run.output;
      return json::object();
    }
  }();
  return report;
}

void JsonListsEveryRuntimeAndScheduleWithPositiveTimes() {
  const json& report = tiny_report();
  ASSERT_TRUE(report.contains("configs"));
  std::set<std::string> runtimes;
  std::set<std::string> schedules;
  for (const json& row : report["configs"]) {
    EXPECT_FALSE(row.contains("error")) << row.dump();
    runtimes.insert(row["runtime"].get<std::string>());
    if (row["runtime"] == "inprocess") schedules.insert(row["schedule"].get<std::string>());
    EXPECT_GT(row["step_seconds"].get<double>(), 0) << row.dump();
    EXPECT_GT(row["peak_rss_bytes"].get<int64_t>(), 0) << row.dump();
    EXPECT_EQ(row["steps"], 2);  // 1 step in each of 2 rounds
    EXPECT_EQ(row["round_step_seconds"].size(), 2u) << row.dump();
    for (const char* key : {"schedule", "stages", "chunks", "checkpoint", "ratio_vs_libtorch",
                            "peak_stashed_bytes"}) {
      EXPECT_TRUE(row.contains(key)) << key << " missing in " << row.dump();
    }
  }
  EXPECT_EQ(runtimes, (std::set<std::string>{"libtorch", "libtorch-microbatched", "inprocess",
                                             "multiprocess"}));
  EXPECT_EQ(schedules, (std::set<std::string>{"gpipe", "1f1b", "interleaved-1f1b", "zb-h1"}));
}

double median_of_two(double a, double b) {
  return 0.5 * (a + b);
}

void RatiosAndStepTimesAreMediansOverRounds() {
  const json& configs = tiny_report()["configs"];
  const json* libtorch = find(configs, "libtorch", "none", 1, 1, "never");
  const json* one_stage = find(configs, "inprocess", "gpipe", 1, 1, "never");
  ASSERT_NE(libtorch, nullptr);
  ASSERT_NE(one_stage, nullptr);
  EXPECT_DOUBLE_EQ((*libtorch)["ratio_vs_libtorch"].get<double>(), 1.0);
  const json& ours = (*one_stage)["round_step_seconds"];
  const json& base = (*libtorch)["round_step_seconds"];
  EXPECT_NEAR((*one_stage)["step_seconds"].get<double>(),
              median_of_two(ours[0].get<double>(), ours[1].get<double>()), 1e-12);
  // Each ratio within its round, then the median: not the quotient of the medians.
  EXPECT_NEAR((*one_stage)["ratio_vs_libtorch"].get<double>(),
              median_of_two(ours[0].get<double>() / base[0].get<double>(),
                            ours[1].get<double>() / base[1].get<double>()),
              1e-12);
}

void PipelinedRowsHaveAnEfficiencyAndOneStashFigurePerStage() {
  for (const json& row : tiny_report()["configs"]) {
    if (row["runtime"] != "inprocess" && row["runtime"] != "multiprocess") continue;
    if (row["runtime"] == "inprocess") {
      const int stages = row["stages"].get<int>() * row["virtual_stages"].get<int>();
      EXPECT_EQ(row["peak_stashed_bytes"].size(), static_cast<size_t>(stages)) << row.dump();
    }
    EXPECT_GT(row["efficiency"].get<double>(), 0) << row.dump();
    // The simulated makespan only counts compute, a sub-interval of the measured step.
    EXPECT_LE(row["simulated_seconds"].get<double>(), row["step_seconds"].get<double>() * 1.5)
        << row.dump();
  }
}

void GpipeWithoutCheckpointsStashesEveryMicrobatchOnStageZero() {
  const json& configs = tiny_report()["configs"];
  // GPipe runs every forward before any backward: all M micro-batches are held at once.
  for (int chunks : {4, 8}) {
    const json* gpipe = find(configs, "inprocess", "gpipe", 2, chunks, "never");
    ASSERT_NE(gpipe, nullptr) << "M=" << chunks;
    EXPECT_EQ((*gpipe)["peak_stashed_microbatches"][0], chunks);
    EXPECT_GT((*gpipe)["peak_stashed_bytes"][0].get<int64_t>(), 0);
  }
}

void ChecksCarryMeasuredValueTargetAndVerdict() {
  const json& report = tiny_report();
  ASSERT_TRUE(report.contains("checks"));
  EXPECT_GE(report["checks"].size(), 5u);
  for (const json& check : report["checks"]) {
    EXPECT_TRUE(check.contains("name") && check.contains("target") && check.contains("pass"))
        << check.dump();
    if (check["pass"].is_null()) {
      EXPECT_TRUE(check["measured"].is_null()) << check.dump();  // not run: no figure invented
    } else {
      const double measured = check["measured"].get<double>();
      const double target = check["target_value"].get<double>();
      const bool at_least = check["comparison"] == ">=";
      EXPECT_TRUE(at_least || check["comparison"] == "<=") << check.dump();
      EXPECT_EQ(check["pass"].get<bool>(), at_least ? measured >= target : measured <= target)
          << check.dump();
    }
  }
}

// --bf16 adds bf16 twins of the 1f1b and gpipe rows; the multi-process ones send half the tensor
// bytes of their fp32 twin (the transport's counters), and the check says so.
void Bf16RowsSendHalfTheBytesOfTheirFp32Twins() {
  const json& report = tiny_report();
  int bf16_multiprocess = 0;
  for (const json& row : report["configs"]) {
    if (row.value("precision", "fp32") != "bf16") continue;
    EXPECT_GT(row["ratio_vs_fp32"].get<double>(), 0) << row.dump();
    if (row["runtime"] != "multiprocess") continue;
    ++bf16_multiprocess;
    EXPECT_GT(row["transport_bytes_per_step"].get<double>(), 0) << row.dump();
    EXPECT_DOUBLE_EQ(row["transport_bytes_vs_fp32"].get<double>(), 0.5) << row.dump();
  }
  EXPECT_EQ(bf16_multiprocess, 2);
  bool checked = false;
  for (const json& check : report["checks"]) {
    if (check["name"] != "bf16_transport_bytes_vs_fp32") continue;
    checked = true;
    EXPECT_EQ(check["pass"], true) << check.dump();
  }
  EXPECT_TRUE(checked);
}

// One test for the whole tiny run: ctest runs every TEST in its own process, and each would
// repeat the run (about 20 child processes).
TEST(BenchCli, TinyRunPrintsOneConsistentJsonObject) {
  {
    SCOPED_TRACE("every runtime and schedule, positive times");
    JsonListsEveryRuntimeAndScheduleWithPositiveTimes();
  }
  {
    SCOPED_TRACE("ratio vs libtorch is the quotient of the rows");
    RatiosAndStepTimesAreMediansOverRounds();
  }
  {
    SCOPED_TRACE("pipelined rows: efficiency and one stash figure per stage");
    PipelinedRowsHaveAnEfficiencyAndOneStashFigurePerStage();
  }
  {
    SCOPED_TRACE("gpipe without checkpoints stashes every micro-batch on stage 0");
    GpipeWithoutCheckpointsStashesEveryMicrobatchOnStageZero();
  }
  {
    SCOPED_TRACE("checks carry measured value, target and verdict");
    ChecksCarryMeasuredValueTargetAndVerdict();
  }
  {
    SCOPED_TRACE("bf16 rows send half the bytes of their fp32 twins");
    Bf16RowsSendHalfTheBytesOfTheirFp32Twins();
  }
}

TEST(BenchCli, UnknownSuiteIsAUsageError) {
  EXPECT_EQ(run_bench("--suite nonsense --no-python").exit_code, 2);
}

// The tp suite: pp2 x tp2 rows (with and without sequence parallelism) against pp4 at tp 1, each
// a 4-process job. ratio_vs_tp1 is the quotient of the rows' step times, and sequence parallelism
// halves the bytes the pipeline sends.
TEST(BenchCli, TensorParallelSuiteComparesWithTpOneAtTheSameWorldSize) {
  const pipetrain::testing::CliRun run =
      run_bench("--suite tp --quick --chunks 4 --batch 8 --steps 1 --warmup 0 --no-python --json");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const json report = json::parse(run.output);
  const json* tp2 = nullptr;
  const json* sp = nullptr;
  const json* pp4 = nullptr;
  for (const json& row : report["configs"]) {
    ASSERT_FALSE(row.contains("error")) << row.dump();
    if (row["schedule"] != "1f1b") continue;
    if (row["tp"] == 2 && !row["sequence_parallel"].get<bool>()) tp2 = &row;
    if (row["tp"] == 2 && row["sequence_parallel"].get<bool>()) sp = &row;
    if (row["tp"] == 1) pp4 = &row;
  }
  ASSERT_TRUE(tp2 && sp && pp4) << report.dump(2);
  EXPECT_EQ((*tp2)["stages"], 2);
  EXPECT_EQ((*pp4)["stages"], 4);
  EXPECT_EQ((*tp2)["threads"]["ranks"], 4);
  EXPECT_NEAR((*tp2)["ratio_vs_tp1"].get<double>(),
              (*tp2)["step_seconds"].get<double>() / (*pp4)["step_seconds"].get<double>(), 1e-9);
  EXPECT_EQ((*sp)["transport_bytes_per_step"].get<double>() * 2,
            (*tp2)["transport_bytes_per_step"].get<double>());
  EXPECT_EQ((*tp2)["peak_stashed_bytes"].size(), 2u);
  ASSERT_EQ(report["checks"].size(), 2u);
  EXPECT_TRUE(report["checks"][0]["pass"].is_null()) << "no torch row, so not run";
}

// The long suite at a tiny size: its six rows at one length, each a 4-process `pipetrain train`;
// the ratios are the quotients of the rows', a cp rank keeps fewer activations than a whole row's
// rank, and the overlapped ring is compared with the serial one.
TEST(BenchCli, LongSuiteComparesContextParallelRowsWithCpOne) {
  const pipetrain::testing::CliRun run =
      run_bench("--suite long --seq-lens 64 --width 32 --steps 1 --warmup 0 --no-python --json");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const json report = json::parse(run.output);
  std::map<std::string, json> rows;
  for (const json& row : report["rows"]) {
    ASSERT_FALSE(row.contains("error")) << row.dump();
    rows[row["name"].get<std::string>()] = row;
  }
  ASSERT_EQ(rows.size(), 6u) << report.dump(2);
  const json& one = rows.at("cp1");
  for (const auto& [name, row] : rows) {
    EXPECT_GT(row["step_seconds"].get<double>(), 0) << name;
    EXPECT_EQ(row["batch"].get<int>() * row["cp"].get<int>(), 4) << name;
    if (name == "cp1") continue;
    EXPECT_NEAR(row["tokens_per_second_vs_cp1"].get<double>(),
                row["tokens_per_second"].get<double>() / one["tokens_per_second"].get<double>(),
                1e-9)
        << name;
    EXPECT_LT(row["activations_vs_cp1"].get<double>(), 1.0) << name;
    EXPECT_EQ(row.contains("ring_wait_seconds"), name.rfind("ring", 0) == 0) << name;
  }
  EXPECT_NEAR(rows.at("ring cp4")["ring_wait_vs_serial"].get<double>(),
              rows.at("ring cp4")["ring_wait_seconds"].get<double>() /
                  rows.at("ring cp4 serial")["ring_wait_seconds"].get<double>(),
              1e-9);
}

TEST(BenchCli, TensorParallelSuiteRefusesATpThatDoesNotDivideTheKeyValueHeads) {
  const pipetrain::testing::CliRun run = run_bench("--suite tp --tp 3 --no-python");
  EXPECT_EQ(run.exit_code, 2);
}

}  // namespace
