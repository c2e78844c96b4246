// bench_stage_cost: what one pipeline action costs inside pipetrain's Stage vs the same work done
// with plain LibTorch autograd, on one thread, measured in one run (not a test).
//
// Work: one stage of 4 x (Linear(1024) + ReLU) on a 32-row micro-batch (the per-stage, per-micro-
// batch work of the 2-stage, 8-chunk MLP benchmark). Plain: y = block(x); y.backward(g).
// Stage: Stage::forward(i, x) then Stage::backward(i, g). The two alternate micro-batch by
// micro-batch so load changes hit both alike. Prints the median F and B of each and their ratios.
// Usage: bench_stage_cost [rounds=40] [intra-op threads=1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <torch/torch.h>

#include "pipetrain/base/median.h"
#include "pipetrain/stage/stage.h"

namespace {

using Clock = std::chrono::steady_clock;
using pipetrain::median;

double micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

torch::nn::Sequential make_block() {
  torch::nn::Sequential block;
  for (int l = 0; l < 4; ++l) {
    block->push_back(torch::nn::Linear(1024, 1024));
    block->push_back(torch::nn::ReLU());
  }
  return block;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 40;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 1;
  torch::set_num_threads(threads);
  torch::manual_seed(0);
  auto plain = make_block();
  auto staged = make_block();
  pipetrain::Stage stage(1, 0, pipetrain::slice_layers(staged, 0, 8, torch::kCPU), torch::kCPU, 1);
  const auto x = torch::randn({32, 1024});
  const auto g = torch::randn({32, 1024});

  std::vector<double> plain_f, plain_b, stage_f, stage_b;
  for (int k = 0; k < rounds + 3; ++k) {
    auto t0 = Clock::now();
    auto leaf = x.detach().requires_grad_(true);
    auto y = plain->forward(leaf);
    auto t1 = Clock::now();
    y.backward(g);
    auto t2 = Clock::now();

    pipetrain::Bundle input{{x}, {}};
    auto t3 = Clock::now();
    pipetrain::Bundle out = stage.forward(k, std::move(input), {});
    auto t4 = Clock::now();
    pipetrain::Bundle grads = stage.backward(k, pipetrain::Bundle{{g}, {}});
    auto t5 = Clock::now();
    if (k < 3) continue;
    plain_f.push_back(micros(t0, t1));
    plain_b.push_back(micros(t1, t2));
    stage_f.push_back(micros(t3, t4));
    stage_b.push_back(micros(t4, t5));
  }
  const double pf = median(plain_f), pb = median(plain_b), sf = median(stage_f),
               sb = median(stage_b);
  std::printf("4 x (Linear(1024)+ReLU), 32 rows, %d thread(s), median of %d\n", threads, rounds);
  std::printf("plain autograd: F %.2f ms  B %.2f ms\n", pf / 1e3, pb / 1e3);
  std::printf("pipetrain Stage: F %.2f ms  B %.2f ms\n", sf / 1e3, sb / 1e3);
  std::printf("ratio Stage/plain: F %.3f  B %.3f\n", sf / pf, sb / pb);
  return 0;
}
