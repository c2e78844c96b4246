// scripts/gpu-mfu, the throughput step of `make gpu-check` (tokens/s and MFU of a
// Llama-3.2-1B-shaped model: pipetrain with one stage and with two sharing the device, and
// transformers' own loop), run here in its --tiny mode on the CPU so that the script keeps working
// where no GPU is: every run trains, reports a rate and an MFU, and the FLOPs a token it divides by
// are the config's count (models::LlamaConfig::training_flops_per_token), the same for all three.
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../helpers/cli_run.h"
#include "../helpers/hf_models.h"
#include "pipetrain/models/llama_config.h"

namespace pipetrain {
namespace {

TEST(GpuMfuScript, TinyOnTheCpuReportsEveryRunsRateAndMfuOverTheConfigsFlops) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string out = ::testing::TempDir() + "gpu_mfu.json";
  const testing::CliRun run = testing::run_command(
      "PIPETRAIN_PYTHON=" + std::string(PIPETRAIN_PYTHON) + " " +
      std::string(PIPETRAIN_SOURCE_DIR) + "/scripts/gpu-mfu " + PIPETRAIN_BINARY_DIR +
      " --device cpu --tiny --seq-len 32 --batch-size 2 --steps 2 --out " + out);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("goal: 45% MFU for pipetrain"), std::string::npos) << run.output;
  std::ifstream file(out);
  const nlohmann::json result = nlohmann::json::parse(file);
  const models::LlamaConfig config = models::parse_llama_config(result["config"]);
  const double expected = config.training_flops_per_token(32);
  EXPECT_NEAR(result["flops_per_token"].get<double>(), expected, 1e-6 * expected);
  ASSERT_EQ(result["runs"].size(), 3u) << result.dump(2);
  for (const auto& [name, r] : result["runs"].items()) {
    EXPECT_GT(r["tokens_per_second"].get<double>(), 0) << name;
    EXPECT_GT(r["mfu"].get<double>(), 0) << name;
    EXPECT_LT(r["mfu"].get<double>(), 1) << name;
    EXPECT_EQ(r["tokens"].get<int64_t>(), 2 * 2 * 32) << name;
  }
}

}  // namespace
}  // namespace pipetrain
