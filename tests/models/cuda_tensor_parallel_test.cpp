// Tensor parallelism with CUDA tensors (`make gpu-check`): `pipetrain train --tp 2` with both
// ranks on one GPU over Gloo (NCCL refuses two ranks on one device), with and without sequence
// parallelism, against one process on the same GPU: the weights after 3 AdamW steps within 1e-4.
// Needs no transformers: the config.json is written here, the weights drawn by --init random, the
// token file written here. Skips, saying so, where no CUDA device is visible.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/cli_run.h"
#include "../helpers/params_file.h"
#include "pipetrain/models/llama.h"
#include "pipetrain/models/llama_config.h"
#include "pipetrain/stage/device.h"

namespace pipetrain::models::cuda_tensor_parallel_test {
namespace {

// A model directory (config.json only) and a token file of 4000 uint16 ids below the vocabulary.
std::string write_model(const std::string& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/model");
  const LlamaConfig config = llama_config(96, 64, 128, /*layers=*/2, /*heads=*/4, /*kv_heads=*/2);
  std::ofstream(dir + "/model/config.json") << llama_config_json(config, "float32").dump(2);
  torch::manual_seed(5);
  const torch::Tensor ids = torch::randint(96, {4000}, torch::kInt16);
  std::ofstream tokens(dir + "/tokens.bin", std::ios::binary);
  tokens.write(static_cast<const char*>(ids.data_ptr()), ids.numel() * 2);
  return dir;
}

TEST(CudaTensorParallel, TwoRanksSharingOneGpuOverGlooTrainLikeOneProcess) {
  if (cuda_device_count() < 1) GTEST_SKIP() << "no CUDA device is visible to this process";
  const std::string dir = write_model(::testing::TempDir() + "pipetrain_cuda_tp");
  const std::string flags = "train --model " + dir +
                            "/model --init random --seed 3 --data tokens "
                            "--token-file " +
                            dir +
                            "/tokens.bin --seq-len 16 --batch-size 8 "
                            "--steps 3 --chunks 2 --optimizer adamw --lr 1e-2 --weight-decay 0.1 "
                            "--adam-betas 0.9,0.95 --adam-eps 1e-6 --device cuda ";
  const testing::CliRun one = testing::run_pipetrain(flags + "--save-params " + dir + "/one.pt");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  for (const std::string extra : {"", "--sequence-parallel"}) {
    const testing::CliRun tp =
        testing::run_pipetrain(flags + "--nproc 2 --tp 2 --backend gloo --devices cuda:0,cuda:0 " +
                               extra + " --save-params " + dir + "/tp.pt");
    ASSERT_EQ(tp.exit_code, 0) << extra << "\n" << tp.output;
    EXPECT_LE(testing::max_relative_difference(dir + "/tp.pt", dir + "/one.pt"), 1e-4) << extra;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pipetrain::models::cuda_tensor_parallel_test
