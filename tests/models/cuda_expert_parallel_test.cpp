// Expert parallelism with CUDA tensors (`make gpu-check`): `pipetrain train --dp 2 --ep 2` with
// both ranks on one GPU over Gloo (NCCL refuses two ranks on one device), the dispatch and
// combine all-to-alls of CUDA rows, against one process on the same GPU: the weights after 3
// AdamW steps within 1e-4. The Qwen3-MoE fixture (its routers drawn with std 1, so no top-k
// choice flips on a rounding difference; docs/MODELS.md). Skips, saying so, where no CUDA device
// is visible or transformers (which writes the fixture) is missing.
#include <string>

#include <gtest/gtest.h>

#include "../helpers/cli_run.h"
#include "../helpers/hf_models.h"
#include "../helpers/params_file.h"
#include "pipetrain/stage/device.h"

namespace pipetrain::models::cuda_expert_parallel_test {
namespace {

TEST(CudaExpertParallel, TwoRanksSharingOneGpuOverGlooTrainLikeOneProcess) {
  if (cuda_device_count() < 1) GTEST_SKIP() << "no CUDA device is visible to this process";
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string dir = testing::scratch_dir("cuda-ep");
  const std::string flags = "train --model " + testing::hf_fixtures() +
                            "/qwen3_moe --data tokens --token-file " + testing::hf_fixtures() +
                            "/tokens.bin --seq-len 16 --batch-size 8 --steps 3 --chunks 2 "
                            "--optimizer adamw --lr 1e-2 --weight-decay 0.1 --adam-betas 0.9,0.95 "
                            "--adam-eps 1e-4 --device cuda ";
  const testing::CliRun one = testing::run_pipetrain(flags + "--save-params " + dir + "/one.pt");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const testing::CliRun ep = testing::run_pipetrain(
      flags + "--nproc 2 --dp 2 --ep 2 --backend gloo --devices cuda:0,cuda:0 --save-params " +
      dir + "/ep.pt");
  ASSERT_EQ(ep.exit_code, 0) << ep.output;
  EXPECT_NE(ep.output.find("expert all-to-all:"), std::string::npos) << ep.output;
  EXPECT_LE(testing::max_relative_difference(dir + "/ep.pt", dir + "/one.pt"), 1e-4);
}

}  // namespace
}  // namespace pipetrain::models::cuda_expert_parallel_test
