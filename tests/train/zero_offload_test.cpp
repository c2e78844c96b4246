// ZeRO-Offload (ZeroOptions::offload, TrainerOptions::offload_optimizer) in one process, through
// the public library. On the CPU nothing moves, but every value takes the offload's path: the
// shard and its gradient in tensors of their own, reduced into a staging buffer and copied, the
// stepped shard copied back before it is written into the parameters. So these tests check the
// offload's bookkeeping (the same weights as the plain optimizer, checkpoints that resume, what
// it refuses, what it reports); tests/train/cuda_zero_offload_test.cpp checks the GPU's memory.
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/multiprocess.h"
#include "pipetrain/base/error.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/train/checkpoint.h"
#include "pipetrain/train/sharded_optimizer.h"
#include "pipetrain/train/step_runner.h"
#include "pipetrain/train/trainer.h"

namespace pipetrain::train::zero_offload_test {
namespace {

TensorBatches offload_batches() {
  torch::manual_seed(21);
  const torch::Tensor x = torch::randn({32, 6});
  return TensorBatches(x, torch::randn({32, 3}), 8);
}

torch::Tensor offload_mse(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::mse_loss(output, target);
}

torch::nn::Sequential offload_model() {
  torch::manual_seed(4);
  torch::nn::Sequential model;
  model->push_back(torch::nn::Linear(6, 24));
  model->push_back(torch::nn::Tanh());
  model->push_back(torch::nn::Linear(24, 24));
  model->push_back(torch::nn::Tanh());
  model->push_back(torch::nn::Linear(24, 3));
  return model;
}

// Worst |a - b| / max(|b|, 1e-3) over the parameters.
double worst_relative(torch::nn::Sequential a, torch::nn::Sequential b) {
  auto pb = b->named_parameters();
  double worst = 0;
  for (const auto& item : a->named_parameters()) {
    const torch::Tensor want = pb[item.key()];
    const torch::Tensor scale = want.abs().clamp_min(1e-3);
    worst = std::max(worst, ((item.value() - want).abs() / scale).max().item<double>());
  }
  return worst;
}

TrainerOptions adamw(int64_t steps) {
  return TrainerOptions(steps).optimizer("adamw").lr(0.01).weight_decay(0.1).clip_grad_norm(0.5);
}

const PipeOptions kPipe = PipeOptions().stages(2).chunks(4).schedule("1f1b");

torch::nn::Sequential trained(const TrainerOptions& options) {
  torch::nn::Sequential model = offload_model();
  auto runner = make_pipe_runner(model, offload_mse, kPipe);
  Trainer(model, *runner, offload_batches(), options).fit();
  return model;
}

TEST(ZeroOffload, OneProcessTrainsLikeThePlainOptimizerAtZeroOneAndTwo) {
  const torch::nn::Sequential plain = trained(adamw(6));
  for (int zero : {1, 2}) {
    const torch::nn::Sequential offloaded = trained(adamw(6).zero(zero).offload_optimizer(true));
    EXPECT_LT(worst_relative(offloaded, plain), 1e-6) << "zero " << zero;
  }
  // The negative control: a step more is visibly elsewhere, so the comparison can fail.
  EXPECT_GT(worst_relative(trained(adamw(7).zero(1).offload_optimizer(true)), plain), 1e-4);
}

TEST(ZeroOffload, ACheckpointOfAnOffloadedRunResumesWithAndWithoutTheOffload) {
  const torch::nn::Sequential plain = trained(adamw(6));
  const std::string dir = ::testing::TempDir() + "pipetrain_zero_offload_ckpt";
  std::filesystem::remove_all(dir);
  {
    torch::nn::Sequential model = offload_model();
    auto runner = make_pipe_runner(model, offload_mse, kPipe);
    Trainer(model, *runner, offload_batches(),
            adamw(3).zero(1).offload_optimizer(true).checkpoint_format("file").checkpoint_dir(dir))
        .fit();
  }
  const Checkpoint saved = load_checkpoint(checkpoint_path(dir));
  EXPECT_EQ(saved.step, 3);
  EXPECT_FALSE(saved.optimizer_state.empty());
  for (bool offload : {true, false}) {
    torch::nn::Sequential model = offload_model();
    restore_model(saved, *model);
    auto runner = make_pipe_runner(model, offload_mse, kPipe);
    const TensorBatches batches = offload_batches();  // the trainer keeps a reference
    Trainer trainer(model, *runner, batches,
                    adamw(6).zero(offload ? 2 : 0).offload_optimizer(offload));
    trainer.resume(saved);
    trainer.fit();
    EXPECT_LT(worst_relative(model, plain), 1e-6) << "resumed with offload " << offload;
  }
  std::filesystem::remove_all(dir);
}

TEST(ZeroOffload, TheShardLivesApartFromTheParametersAndIsReportedAsHostMemory) {
  torch::nn::Sequential model = offload_model();
  std::vector<torch::Tensor> parameters = model->parameters();
  int64_t elements = 0;
  for (const auto& p : parameters) elements += p.numel();
  ShardedOptimizer sharded(nullptr, parameters, parameters, "adam", OptimizerOptions().lr(0.1),
                           ZeroOptions().stage(1).offload(true));
  EXPECT_TRUE(sharded.offloaded());
  EXPECT_EQ(sharded.shard_elements(), elements);  // one replica: the shard is everything
  std::vector<torch::Tensor> before, flat;
  for (auto& p : parameters) {
    before.push_back(p.detach().clone());
    p.mutable_grad() = torch::ones_like(p);
  }
  sharded.reduce_gradients();
  sharded.step();
  // Adam's two moments and its step count, the shard and its gradient: all on the host.
  const int64_t state = sharded.state_bytes();
  EXPECT_GE(state, 2 * elements * 4);
  EXPECT_EQ(sharded.host_bytes(), state + 2 * elements * 4);
  // The device keeps the parameters' own gradients only (none of the shard's).
  EXPECT_EQ(sharded.gradient_bytes(), elements * 4);
  // The step moved every parameter and wrote the stepped shard, a tensor of its own, into them.
  for (size_t q = 0; q < parameters.size(); ++q) {
    EXPECT_FALSE(torch::equal(parameters[q], before[q])) << "parameter " << q;
    flat.push_back(parameters[q].detach().reshape({-1}));
  }
  // The inner optimizer steps the shard a slice (one parameter's piece) at a time.
  const std::vector<torch::Tensor>& slices = sharded.shard_optimizer().param_groups()[0].params();
  EXPECT_EQ(slices.size(), parameters.size());
  EXPECT_TRUE(torch::equal(torch::cat(slices), torch::cat(flat)));
  for (const auto& slice : slices) {
    for (const auto& p : parameters) EXPECT_NE(slice.data_ptr(), p.data_ptr());
  }
}

// Two replicas (the dp group's collectives between the staging copies), ZeRO 1, 2 and 3, each
// blocking and overlapped (two segments reduce-scattered as they are final): the weights and the
// captured optimizer state equal the plain sharded optimizer's bit for bit.
TEST(ZeroOffload, TwoReplicasTrainLikeThePlainShardedOptimizerAtEveryStage) {
  const testing::RanksRun run = testing::run_ranks(2, {"zero_offload", "1"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  EXPECT_EQ(run.count("OK zero_offload"), 2) << run.output();
}

TEST(ZeroOffload, WhatOneProcessCannotOffloadIsRefusedNamingTheFlag) {
  torch::nn::Sequential model = offload_model();
  auto runner = make_pipe_runner(model, offload_mse, kPipe);
  const TensorBatches batches = offload_batches();
  try {
    Trainer(model, *runner, batches, adamw(1).zero(3).offload_optimizer(true));
    FAIL() << "--zero 3 in one process was accepted";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("--zero 3"), std::string::npos) << e.what();
  }
  try {
    Trainer(model, *runner, batches, adamw(1).offload_optimizer(true));
    FAIL() << "offload at zero 0 was accepted";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("needs --zero 1, 2 or 3"), std::string::npos) << e.what();
  }
  try {
    Trainer(model, *runner, batches, adamw(1).zero(1));
    FAIL() << "ZeRO without replicas or offload was accepted";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("--dp 2 or more"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pipetrain::train::zero_offload_test
