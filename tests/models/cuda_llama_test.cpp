// The Llama model on a GPU (`make gpu-check`): stages sharing one GPU train like sequential
// training on the CPU, in fp32 and in bf16. Skips, saying so, where no CUDA device is visible.
// Needs no transformers: the config is made here and the weights drawn by init_llama_random.
#include <algorithm>
#include <cstdio>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/models/llama.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/stage/device.h"

namespace pipetrain::models {
namespace {

LlamaConfig small_config() {
  LlamaConfig c = llama_config(96, 64, 128, /*layers=*/4, /*heads=*/8, /*kv_heads=*/2);
  c.rope.type = "llama3";
  c.rope.factor = 8;
  c.rope.low_freq_factor = 1;
  c.rope.high_freq_factor = 4;
  c.rope.original_max_position_embeddings = 32;
  return c;
}

struct Batch {
  torch::Tensor ids, targets;
};

Batch batch_of(int64_t step) {
  torch::manual_seed(100 + step);
  return {torch::randint(96, {8, 24}, torch::kInt64), torch::randint(96, {8, 24}, torch::kInt64)};
}

// `steps` AdamW steps of `model`'s Sequential: sequentially on its device (no pipe) or through
// `pipe`. Returns the losses.
std::vector<double> train(LlamaModel& model, std::optional<Pipe>& pipe, int steps) {
  torch::optim::AdamW adamw(model.sequential->parameters(), torch::optim::AdamWOptions(3e-3));
  std::vector<double> losses;
  const torch::Device device = model.sequential->parameters()[0].device();
  for (int k = 0; k < steps; ++k) {
    const Batch b = batch_of(k);
    adamw.zero_grad();
    if (pipe) {
      losses.push_back((*pipe)->train_step(b.ids, b.targets, causal_lm_loss).item<double>());
    } else {
      torch::Tensor loss =
          causal_lm_loss(model.sequential->forward(b.ids.to(device)), b.targets.to(device));
      loss.backward();
      losses.push_back(loss.item<double>());
    }
    adamw.step();
  }
  return losses;
}

TEST(CudaLlama, StagesSharingOneGpuTrainLikeSequentialTrainingInFp32AndBf16) {
  if (cuda_device_count() < 1) GTEST_SKIP() << "no CUDA device is visible to this process";
  LlamaModel reference = make_llama(small_config());
  init_llama_random(reference, 3);
  std::optional<Pipe> none;
  train(reference, none, 3);  // on the CPU

  const torch::Device gpu(torch::kCUDA, 0);
  LlamaModel fp32 = make_llama(small_config());
  init_llama_random(fp32, 3);
  std::optional<Pipe> pipe;
  pipe.emplace(fp32.sequential,
               PipeOptions().stages(3).chunks(4).schedule("1f1b").devices({gpu, gpu, gpu}));
  train(fp32, pipe, 3);
  // Compared as norms: float32's rounding, magnified by AdamW's normalised update where a gradient
  // is near zero, leaves single elements far apart. On a Llama of this size, torch's 3 AdamW
  // steps in float32 against float64 were 1.5e-4 of the largest weight apart in one element of
  // o_proj, and 1.0e-5 as a norm; the first GPU run of this test saw 5.6e-4 in one element of
  // layer 2's gate_proj (the GPU's pipeline against the host's sequential training).
  const auto expected = reference.sequential->named_parameters();
  double worst = 0;
  for (const auto& item : fp32.sequential->named_parameters()) {
    const torch::Tensor got = item.value().cpu();
    const torch::Tensor want = expected[item.key()];
    const double relative = (got - want).norm().item<double>() / want.norm().item<double>();
    EXPECT_LT(relative, 1e-4) << item.key() << ": worst element off by "
                              << (got - want).abs().max().item<double>();
    worst = std::max(worst, relative);
  }
  std::printf("fp32 on the GPU against the host: weights apart by %.2e (norm)\n", worst);

  // bf16 on the GPU: 20 steps' losses within 2% of fp32's on the GPU.
  std::vector<double> losses[2];
  for (int precise = 0; precise < 2; ++precise) {
    LlamaModel model = make_llama(small_config());
    init_llama_random(model, 5);
    std::optional<Pipe> p;
    p.emplace(model.sequential,
              PipeOptions()
                  .stages(2)
                  .chunks(4)
                  .schedule("gpipe")
                  .devices({gpu, gpu})
                  .precision(precise ? Precision::kFloat32 : Precision::kBFloat16));
    losses[precise] = train(model, p, 20);
  }
  for (size_t k = 0; k < losses[0].size(); ++k) {
    EXPECT_LT(std::abs(losses[0][k] - losses[1][k]) / losses[1][k], 0.02) << "step " << k;
  }
}

}  // namespace
}  // namespace pipetrain::models
