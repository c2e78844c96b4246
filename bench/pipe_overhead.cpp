// Runtime overhead of the in-process Pipe, as ratios measured in one run (not a test).
//
//   [a] Pipe (S stages on the CPU, gpipe, 8 micro-batches, checkpoint never) vs a plain LibTorch
//       loop over the same 8 micro-batches (forward, weighted loss, backward)     target <= 1.10
//   [b] Pipe with 1 stage and 1 chunk vs plain LibTorch on the whole batch          target <= 1.03
//   [c] one stage, 8 micro-batches: F + I + W (split backward) vs F + B               target
//   <= 1.10
//
// Model: 8 x (Linear(W, W) + ReLU), batch N (W = 1024, N = 256 unless given). Each ratio is the
// median over >= 5 steps after a warm-up, the two sides alternating step by step so load changes
// hit both alike. With a CUDA device every stage and the plain loop run on it, and each timed step
// ends with a device synchronisation.
// Usage: bench_pipe_overhead [steps=7] [stages for a=2] [device=cpu] [W=1024] [N=256]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "pipetrain/base/median.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/stage/microbatch.h"
#include "pipetrain/stage/stage.h"

namespace {

using pipetrain::Checkpoint;
using pipetrain::median;
using pipetrain::Pipe;
using pipetrain::PipeOptions;

torch::nn::Sequential make_model(int64_t width) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int l = 0; l < 8; ++l) {
    model->push_back(torch::nn::Linear(width, width));
    model->push_back(torch::nn::ReLU());
  }
  return model;
}

torch::nn::Sequential clone_of(const torch::nn::Sequential& model) {
  return torch::nn::Sequential(
      std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone()));
}

torch::Tensor mse(const torch::Tensor& out, const torch::Tensor& target) {
  return torch::mse_loss(out, target);
}

bool on_gpu = false;

double seconds(const std::function<void()>& f) {
  auto start = std::chrono::steady_clock::now();
  f();
  if (on_gpu) torch::cuda::synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Alternates a and b, `steps` times after one warm-up each; prints and returns median(a)/median(b).
double compare(const char* label, int steps, const std::function<void()>& a,
               const std::function<void()>& b) {
  a();
  b();
  if (on_gpu) torch::cuda::synchronize();
  std::vector<double> ta;
  std::vector<double> tb;
  for (int k = 0; k < steps; ++k) {
    ta.push_back(seconds(a));
    tb.push_back(seconds(b));
  }
  const double ratio = median(ta) / median(tb);
  std::printf("%-58s %8.1f ms vs %8.1f ms   ratio %.3f\n", label, median(ta) * 1e3,
              median(tb) * 1e3, ratio);
  return ratio;
}

// The plain loop over micro-batches: what the pipeline computes, without the pipeline.
void plain_microbatches(torch::nn::Sequential& model, const torch::Tensor& x,
                        const torch::Tensor& y, int chunks) {
  model->zero_grad();
  auto sizes = pipetrain::microbatch_sizes(x.size(0), chunks);
  auto xs = pipetrain::split_microbatches({x}, sizes);
  auto ys = pipetrain::split_microbatches({y}, sizes);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const double weight = static_cast<double>(sizes[i]) / x.size(0);
    (mse(model->forward(xs[i][0]), ys[i][0]) * weight).backward();
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::max(5, std::atoi(argv[1])) : 7;
  const int stages = argc > 2 ? std::atoi(argv[2]) : 2;
  const torch::Device device(argc > 3 ? argv[3] : "cpu");
  const int64_t width = argc > 4 ? std::atoll(argv[4]) : 1024;
  const int64_t batch = argc > 5 ? std::atoll(argv[5]) : 256;
  on_gpu = device.is_cuda();
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({batch, width}).to(device);
  const torch::Tensor y = torch::randn({batch, width}).to(device);
  if (on_gpu) {
    std::printf("device %s, %d steps (median), batch %lld, 8 x Linear(%lld)+ReLU\n",
                device.str().c_str(), steps, static_cast<long long>(batch),
                static_cast<long long>(width));
  } else {
    std::printf("intra-op threads %d, %d steps (median), batch %lld, 8 x Linear(%lld)+ReLU\n",
                at::get_num_threads(), steps, static_cast<long long>(batch),
                static_cast<long long>(width));
  }
  const std::vector<torch::Device> on_device(static_cast<size_t>(std::max(stages, 1)), device);

  torch::nn::Sequential model = make_model(width);
  torch::nn::Sequential plain = clone_of(model);
  plain->to(device);

  {  // [a]
    Pipe pipe(clone_of(model), PipeOptions()
                                   .stages(stages)
                                   .chunks(8)
                                   .schedule("gpipe")
                                   .checkpoint(Checkpoint::kNever)
                                   .devices(on_device));
    char label[128];
    std::snprintf(label, sizeof label, "[a] Pipe %d stages, 8 chunks / plain 8 micro-batches",
                  stages);
    compare(
        label, steps,
        [&] {
          pipe->zero_grad();
          pipe->train_step(x, y, mse);
        },
        [&] { plain_microbatches(plain, x, y, 8); });
  }
  {  // [b]
    Pipe pipe(clone_of(model),
              PipeOptions().stages(1).chunks(1).checkpoint(Checkpoint::kNever).devices({device}));
    compare(
        "[b] Pipe 1 stage, 1 chunk / plain whole batch", steps,
        [&] {
          pipe->zero_grad();
          pipe->train_step(x, y, mse);
        },
        [&] { plain_microbatches(plain, x, y, 1); });
  }
  {  // [c]
    torch::nn::Sequential split_model = clone_of(model);
    torch::nn::Sequential full_model = clone_of(model);
    split_model->to(device);
    full_model->to(device);
    auto layers_of = [](torch::nn::Sequential& m) {
      std::vector<pipetrain::StageLayer> layers;
      int l = 0;
      for (auto& module : *m) layers.push_back({std::to_string(l++), module});
      return layers;
    };
    pipetrain::Stage split_stage(1, 0, layers_of(split_model), device, 1);
    pipetrain::Stage full_stage(1, 0, layers_of(full_model), device, 1);
    auto xs = pipetrain::split_microbatches({x}, pipetrain::microbatch_sizes(batch, 8));
    const torch::Tensor grad = torch::randn({batch / 8, width}).to(device);
    pipetrain::StageForwardOptions split_options;
    split_options.split_backward = true;
    compare(
        "[c] one stage, 8 micro-batches: F+I+W / F+B", steps,
        [&] {
          for (int i = 0; i < 8; ++i) {
            split_stage.forward(i, pipetrain::Bundle{{xs[i][0]}, {}}, split_options);
            split_stage.backward_input(i, pipetrain::Bundle{{grad}, {}});
            split_stage.backward_weight(i);
          }
        },
        [&] {
          for (int i = 0; i < 8; ++i) {
            full_stage.forward(i, pipetrain::Bundle{{xs[i][0]}, {}}, {});
            full_stage.backward(i, pipetrain::Bundle{{grad}, {}});
          }
        });
  }
  return 0;
}
