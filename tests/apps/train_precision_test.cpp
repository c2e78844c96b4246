// `pipetrain train --precision` end to end: bf16 halves the bytes that cross between ranks
// (counted by the c10d transport, activations and gradients, every rank), trains like fp32 in one
// process and in two, and fp16 without CUDA exits 2 saying what it needs.
#include <filesystem>
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "../helpers/cli_run.h"

namespace {

using pipetrain::testing::CliRun;

CliRun train(const std::string& extra) {
  return pipetrain::testing::run_pipetrain(
      "train --data synthetic --synthetic-samples 256 --model mlp "
      "--model-options '{\"widths\": [784, 64, 32, 10]}' --batch-size 32 --seed 3 --steps 16 "
      "--optimizer adam " +
      extra);
}

// The number after `prefix` in the output (-1 when absent).
double number_after(const CliRun& run, const std::string& pattern) {
  std::smatch m;
  if (!std::regex_search(run.output, m, std::regex(pattern)) || m.size() < 2) {
    ADD_FAILURE() << "no match for " << pattern << " in:\n" << run.output;
    return -1;
  }
  return std::stod(m[1].str());
}

double last_loss(const CliRun& run) {
  return number_after(run, "loss [0-9.]+ -> ([0-9.]+)");
}

TEST(TrainPrecision, Bf16SendsHalfTheBytesOfFp32BetweenRanksAndTrainsAlike) {
  const std::string two = "--nproc 2 --chunks 4 --precision ";
  const CliRun fp32 = train(two + "fp32");
  const CliRun bf16 = train(two + "bf16");
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  const std::string sent = "transport: ([0-9]+) tensor bytes sent";
  const double fp32_bytes = number_after(fp32, sent);
  const double bf16_bytes = number_after(bf16, sent);
  ASSERT_GT(fp32_bytes, 0);
  EXPECT_EQ(bf16_bytes, 0.5 * fp32_bytes);
  // bf16 follows fp32's loss curve to about a percent (16 steps from the same weights).
  EXPECT_NEAR(last_loss(bf16), last_loss(fp32), 0.02 * last_loss(fp32));
  EXPECT_NE(bf16.output.find(", bf16,"), std::string::npos) << "the start line names it";
}

TEST(TrainPrecision, Bf16TrainsSequentiallyAndInOneProcessPipeline) {
  const CliRun fp32 = train("--precision fp32");
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  for (std::string layout : {"", "--stages 2 --chunks 4 --schedule zb-h1"}) {
    const CliRun bf16 = train(layout + " --precision bf16");
    ASSERT_EQ(bf16.exit_code, 0) << layout << "\n" << bf16.output;
    EXPECT_NEAR(last_loss(bf16), last_loss(fp32), 0.02 * last_loss(fp32)) << layout;
  }
}

// A bf16 run keeps float32 master weights and optimizer state, so its checkpoint resumes at fp32
// and an fp32 one at bf16, both without conversion loss (issue #18: lossless conversions load).
TEST(TrainPrecision, CheckpointsResumeAcrossPrecisions) {
  const std::string dir = ::testing::TempDir() + "pipetrain_precision_resume";
  std::filesystem::remove_all(dir);
  for (const std::string from : {"bf16", "fp32"}) {
    const std::string to = from == "bf16" ? "fp32" : "bf16";
    const std::string saved = dir + "/" + from;
    const std::string run =
        "train --data synthetic --synthetic-samples 256 --model mlp --model-options "
        "'{\"widths\": [784, 64, 32, 10]}' --batch-size 32 --seed 3 --optimizer adam --stages 2 "
        "--chunks 2 --precision ";
    const CliRun first = pipetrain::testing::run_pipetrain(
        run + from + " --steps 3 --checkpoint-format file --checkpoint-dir " + saved);
    ASSERT_EQ(first.exit_code, 0) << first.output;
    const CliRun resumed = pipetrain::testing::run_pipetrain(run + to + " --resume " + saved +
                                                             "/checkpoint.pt --steps 6");
    EXPECT_EQ(resumed.exit_code, 0) << from << " -> " << to << "\n" << resumed.output;
    EXPECT_NE(resumed.output.find("done: 3 steps"), std::string::npos) << resumed.output;
  }
  std::filesystem::remove_all(dir);
}

// The auto plan profiles, calibrates and measures its candidates in the run's precision.
TEST(TrainPrecision, Bf16AutoPlanProfilesAndMeasuresBf16Stages) {
  const CliRun run = pipetrain::testing::run_pipetrain(
      "train --data synthetic --synthetic-samples 128 --model mlp --model-options "
      "'{\"widths\": [784, 64, 32, 10]}' --batch-size 32 --seed 3 --stages 2 --schedule auto "
      "--precision bf16 --steps 2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("auto plan:"), std::string::npos) << run.output;
}

TEST(TrainPrecision, Fp16WithoutCudaAndUnknownNamesExitTwoNamingTheFlag) {
  const CliRun fp16 = train("--precision fp16");
  EXPECT_EQ(fp16.exit_code, 2) << fp16.output;
  EXPECT_NE(fp16.output.find("--precision fp16 needs CUDA"), std::string::npos) << fp16.output;
  const CliRun fp8 = train("--precision fp8");
  EXPECT_EQ(fp8.exit_code, 2) << fp8.output;
  EXPECT_NE(fp8.output.find("--precision fp8"), std::string::npos) << fp8.output;
}

}  // namespace
