// bench_multiprocess_1f1b: 2 processes x 1 intra-op thread, 2 stages of 4 x (Linear(1024) + ReLU),
// batch 256, chunks 8, 1f1b over loopback Gloo. Prints, measured in one run:
//   - the measured pipeline step (DistributedPipe::train_step: the schedule, gradient sync and
//     loss broadcast; the slowest rank, ranks started together by a barrier) vs the simulator's
//     makespan for the same schedule with the per-action costs measured in that run (median F and
//     B per stage, and the transfer latency from a ping-pong of an activation-sized bundle):
//     ratio, target <= 1.15. Also the whole training step (+ zero_grad and the SGD step);
//   - the speed-up over sequential training in 1 process x 1 thread of the same 8 micro-batches
//     one after another (gradients accumulated), and, for context, of the whole batch at once;
//   - the C10dTransport round trip of a tiny bundle (the per-bundle latency).
// Run it as `bench_multiprocess_1f1b [checkpoint]` (never, except_last or always; default
// except_last, the Pipe's default, in which B includes the recompute of F): it re-launches itself
// as 2 ranks (runtime/launcher.h). `never` makes F and B comparable with the TRACE lines of
// `bench/torch_pipelining.py --trace`, which does not checkpoint.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <numeric>
#include <string>
#include <vector>

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

double median_of(const torch::Tensor& t) {
  std::vector<double> v(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

torch::Tensor as_tensor(const std::vector<double>& v) {
  return torch::tensor(v, torch::kDouble);
}

// [1] This rank's figures of the pipelined steps, gathered on rank 0 by name (forward.r,
// backward.r: F and B durations in ms; pipeline.r: train_step; step.r: the whole training step).
std::map<std::string, torch::Tensor> pipelined_steps(Distributed& d, DistributedPipe& pipe,
                                                     const torch::Tensor& x,
                                                     const torch::Tensor& y) {
  torch::optim::SGD sgd(pipe.parameters(), 0.01);
  std::vector<double> pipeline_times, step_times, forwards, backwards;
  for (int k = 0; k < kWarmup + kSteps; ++k) {
    d.barrier();
    const auto start = Clock::now();
    sgd.zero_grad();
    const auto pipeline_start = Clock::now();
    pipe.train_step(x, y, mse);
    const double pipeline = seconds_since(pipeline_start);
    sgd.step();
    const double step = seconds_since(start);
    if (k < kWarmup) continue;
    pipeline_times.push_back(pipeline);
    step_times.push_back(step);
    for (const auto& event : pipe.last_events()) {
      const double ms = (event.end_us - event.start_us) / 1e3;
      if (event.action.op == schedule::Op::kForward) forwards.push_back(ms);
      if (event.action.op == schedule::Op::kBackward) backwards.push_back(ms);
    }
  }
  const std::string me = std::to_string(d.rank());
  return d.gather_named_parameters({{"forward." + me, as_tensor(forwards)},
                                    {"backward." + me, as_tensor(backwards)},
                                    {"pipeline." + me, as_tensor(pipeline_times)},
                                    {"step." + me, as_tensor(step_times)}});
}

// [2] Baselines in this process, 1 thread: the same 8 micro-batches one after another (loss
// weighted by rows, gradients accumulated), and the whole batch at once. Median seconds of each.
std::pair<double, double> sequential_steps(const torch::Tensor& x, const torch::Tensor& y) {
  auto reference = make_model();
  torch::optim::SGD reference_sgd(reference->parameters(), 0.01);
  const auto x_parts = x.chunk(kChunks);
  const auto y_parts = y.chunk(kChunks);
  std::vector<double> microbatched_times, whole_times;
  for (int k = 0; k < kWarmup + kSteps; ++k) {
    auto start = Clock::now();
    reference_sgd.zero_grad();
    for (size_t i = 0; i < x_parts.size(); ++i) {
      (mse(reference->forward(x_parts[i]), y_parts[i]) *
       (static_cast<double>(x_parts[i].size(0)) / kRows))
          .backward();
    }
    reference_sgd.step();
    if (k >= kWarmup) microbatched_times.push_back(seconds_since(start));
    start = Clock::now();
    reference_sgd.zero_grad();
    mse(reference->forward(x), y).backward();
    reference_sgd.step();
    if (k >= kWarmup) whole_times.push_back(seconds_since(start));
  }
  return {median_of(as_tensor(microbatched_times)), median_of(as_tensor(whole_times))};
}

void rank_main(Distributed& d, Checkpoint checkpoint) {
  torch::set_num_threads(1);
  const double tiny_round_trip = ping_pong(d, 1, 200);
  const double activation_round_trip = ping_pong(d, int64_t{kRows / kChunks} * kWidth, 50);

  torch::manual_seed(1);
  const auto x = torch::randn({kRows, kWidth});
  const auto y = torch::randn({kRows, kWidth});
  auto model = make_model();
  DistributedPipe pipe(
      d, model, PipeOptions().stages(2).chunks(kChunks).schedule("1f1b").checkpoint(checkpoint));
  const auto all = pipelined_steps(d, pipe, x, y);  // [1]
  if (d.rank() != 0) return;

  // Per step, the slowest rank; then the median over steps.
  auto slowest = [&](const std::string& what) {
    return median_of(torch::maximum(all.at(what + ".0"), all.at(what + ".1")));
  };
  const double measured = slowest("pipeline");
  const double measured_step = slowest("step");
  schedule::Costs model_costs;
  for (int j = 0; j < 2; ++j) {
    const std::string stage = std::to_string(j);
    model_costs.forward_per_stage.push_back(median_of(all.at("forward." + stage)) / 1e3);
    model_costs.backward_per_stage.push_back(median_of(all.at("backward." + stage)) / 1e3);
  }
  model_costs.comm = activation_round_trip / 2;
  const double makespan = schedule::simulate(pipe.schedule(), model_costs).makespan;
  const auto [sequential, whole] = sequential_steps(x, y);  // [2]

  std::printf("checkpoint %s\n", to_string(checkpoint).c_str());
  std::printf("per-action costs (ms): F %.2f / %.2f, B %.2f / %.2f (stage 0 / 1), transfer %.3f\n",
              model_costs.forward_per_stage[0] * 1e3, model_costs.forward_per_stage[1] * 1e3,
              model_costs.backward_per_stage[0] * 1e3, model_costs.backward_per_stage[1] * 1e3,
              model_costs.comm * 1e3);
  std::printf("transport round trip: 1-float bundle %.1f us, %d KiB bundle %.1f us\n",
              tiny_round_trip * 1e6, kRows / kChunks * kWidth * 4 / 1024,
              activation_round_trip * 1e6);
  std::printf(
      "1f1b pipeline step: measured %.1f ms, simulated makespan %.1f ms, ratio %.3f (target <= "
      "1.15)\n",
      measured * 1e3, makespan * 1e3, measured / makespan);
  std::printf("whole training step (+ zero_grad, SGD step): %.1f ms, ratio to makespan %.3f\n",
              measured_step * 1e3, measured_step / makespan);
  std::printf(
      "sequential, 1 process x 1 thread, the same 8 micro-batches: %.1f ms; speed-up of 2 "
      "processes: %.2fx\n",
      sequential * 1e3, sequential / measured_step);
  std::printf(
      "sequential, 1 process x 1 thread, whole batch (for context): %.1f ms; speed-up: %.2fx\n",
      whole * 1e3, whole / measured_step);
}

}  // namespace

int main(int argc, char** argv) {
  if (!DistributedEnvironment::present()) {
    return launch_self(2, strip_launcher_flags(argc, argv));
  }
  Checkpoint checkpoint = Checkpoint::kExceptLast;
  try {
    if (argc > 1) checkpoint = parse_checkpoint(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_multiprocess_1f1b [checkpoint]: %s\n", e.what());
    return 2;
  }
  return run_distributed(DistributedOptions().timeout(std::chrono::seconds(120)),
                         [checkpoint](Distributed& d) { rank_main(d, checkpoint); });
}
