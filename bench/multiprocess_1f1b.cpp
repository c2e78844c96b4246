// bench_multiprocess_1f1b: 2 processes x 1 intra-op thread, 2 stages of 4 x (Linear(1024) + ReLU),
// batch 256, chunks 8, 1f1b over loopback Gloo. Prints, measured in one run:
//   - the measured step time vs the simulator's makespan for the same schedule with the per-action
//     costs measured in that run (mean F and B per stage, and the transfer latency from a ping-pong
//     of an activation-sized bundle): ratio, target <= 1.15;
//   - the speed-up over sequential training in 1 process x 1 thread on the same machine;
//   - the C10dTransport round trip of a tiny bundle (the per-bundle header/latency cost).
// Run without arguments: it re-launches itself as 2 ranks (runtime/launcher.h).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <numeric>

#include <torch/torch.h>

#include "pipetrain/runtime/distributed.h"
#include "pipetrain/runtime/distributed_pipe.h"
#include "pipetrain/runtime/launcher.h"
#include "pipetrain/schedule/simulate.h"

using namespace pipetrain;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kWidth = 1024;
constexpr int kRows = 256;
constexpr int kChunks = 8;
constexpr int kSteps = 6;
constexpr int kWarmup = 2;

torch::nn::Sequential make_model() {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int l = 0; l < 8; ++l) {
    model->push_back(torch::nn::Linear(kWidth, kWidth));
    model->push_back(torch::nn::ReLU());
  }
  return model;
}

torch::Tensor mse(const torch::Tensor& out, const torch::Tensor& target) {
  return torch::mse_loss(out, target);
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Mean round-trip seconds of a bundle of `floats` floats between ranks 0 and 1 (stages 0 and 1).
double ping_pong(Distributed& d, int64_t floats, int rounds) {
  auto transport = d.make_transport({0, 1});
  Bundle bundle{{torch::ones({floats})}, {}};
  d.barrier();
  const auto start = Clock::now();
  for (int k = 0; k < rounds; ++k) {
    if (d.rank() == 0) {
      transport->send({0, 1, k % 4096, Payload::kActivation}, bundle);
      transport->recv({1, 0, k % 4096, Payload::kGradient});
    } else {
      auto got = transport->recv({0, 1, k % 4096, Payload::kActivation});
      transport->send({1, 0, k % 4096, Payload::kGradient}, got);
    }
  }
  const double per_round = seconds_since(start) / rounds;
  transport->flush();
  d.barrier();
  return per_round;
}

void rank_main(Distributed& d) {
  torch::set_num_threads(1);
  const double tiny_round_trip = ping_pong(d, 1, 200);
  const double activation_round_trip = ping_pong(d, int64_t{kRows / kChunks} * kWidth, 50);

  torch::manual_seed(1);
  const auto x = torch::randn({kRows, kWidth});
  const auto y = torch::randn({kRows, kWidth});
  auto model = make_model();
  DistributedPipe pipe(d, model, PipeOptions().stages(2).chunks(kChunks).schedule("1f1b"));
  torch::optim::SGD sgd(pipe.parameters(), 0.01);
  std::vector<double> step_times;
  // Per stage j: summed F and B durations over the measured steps.
  double forward_us = 0, backward_us = 0;
  int forwards = 0, backwards = 0;
  for (int k = 0; k < kWarmup + kSteps; ++k) {
    d.barrier();
    const auto start = Clock::now();
    sgd.zero_grad();
    pipe.train_step(x, y, mse);
    sgd.step();
    d.barrier();
    if (k < kWarmup) continue;
    step_times.push_back(seconds_since(start));
    for (const auto& event : pipe.last_events()) {
      if (event.action.op == schedule::Op::kForward) {
        forward_us += event.end_us - event.start_us;
        ++forwards;
      } else if (event.action.op == schedule::Op::kBackward) {
        backward_us += event.end_us - event.start_us;
        ++backwards;
      }
    }
  }
  // Rank 0 collects rank 1's mean costs (through the parameter gather: any named tensors).
  auto costs =
      d.gather_named_parameters({{"forward." + std::to_string(d.rank()),
                                  torch::tensor({forward_us / forwards}, torch::kDouble)},
                                 {"backward." + std::to_string(d.rank()),
                                  torch::tensor({backward_us / backwards}, torch::kDouble)}});
  if (d.rank() != 0) return;

  std::sort(step_times.begin(), step_times.end());
  const double measured = step_times[step_times.size() / 2];  // median
  schedule::Costs model_costs;
  for (int j = 0; j < 2; ++j) {
    model_costs.forward_per_stage.push_back(
        costs.at("forward." + std::to_string(j)).item<double>() / 1e6);
    model_costs.backward_per_stage.push_back(
        costs.at("backward." + std::to_string(j)).item<double>() / 1e6);
  }
  model_costs.comm = activation_round_trip / 2;
  const double makespan = schedule::simulate(pipe.schedule(), model_costs).makespan;

  // Baseline: the same model trained sequentially, whole batch, 1 process x 1 thread.
  auto reference = make_model();
  torch::optim::SGD reference_sgd(reference->parameters(), 0.01);
  std::vector<double> sequential_times;
  for (int k = 0; k < kWarmup + kSteps; ++k) {
    const auto start = Clock::now();
    reference_sgd.zero_grad();
    mse(reference->forward(x), y).backward();
    reference_sgd.step();
    if (k >= kWarmup) sequential_times.push_back(seconds_since(start));
  }
  std::sort(sequential_times.begin(), sequential_times.end());
  const double sequential = sequential_times[sequential_times.size() / 2];

  std::printf("per-action costs (ms): F %.2f / %.2f, B %.2f / %.2f (stage 0 / 1), transfer %.3f\n",
              model_costs.forward_per_stage[0] * 1e3, model_costs.forward_per_stage[1] * 1e3,
              model_costs.backward_per_stage[0] * 1e3, model_costs.backward_per_stage[1] * 1e3,
              model_costs.comm * 1e3);
  std::printf("transport round trip: 1-float bundle %.1f us, %d KiB bundle %.1f us\n",
              tiny_round_trip * 1e6, kRows / kChunks * kWidth * 4 / 1024,
              activation_round_trip * 1e6);
  std::printf(
      "1f1b step: measured %.1f ms, simulated makespan %.1f ms, ratio %.3f (target <= 1.15)\n",
      measured * 1e3, makespan * 1e3, measured / makespan);
  std::printf("sequential 1 process x 1 thread: %.1f ms; speed-up of 2 processes: %.2fx\n",
              sequential * 1e3, sequential / measured);
}

}  // namespace

int main(int argc, char** argv) {
  if (!DistributedEnvironment::present()) {
    return launch_self(2, strip_launcher_flags(argc, argv));
  }
  return run_distributed(DistributedOptions().timeout(std::chrono::seconds(120)),
                         [](Distributed& d) { rank_main(d); });
}
