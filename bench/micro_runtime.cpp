// Micro-benchmarks of the in-process runtime's fixed costs (Google Benchmark; not a test).
//
//   BM_PipeTinyStep/K/M/s    one train_step of a Pipe over 2K tiny Linear(4, 4) layers, batch
//                            2M rows, schedule s (0 gpipe, 1 1f1b, 2 zb-h1): the compute is
//                            negligible, so the time is the interpreter's + transport's per
//                            action. Counter us_per_action = step time / actions of the lowered
//                            schedule (F, B, I, W, SF, RF, SB, RB); overhead_us_per_action
//                            subtracts the same micro-batches run plainly (BM_PlainTinyStep).
//   BM_PlainTinyStep/M       the same layers and micro-batches in a plain loop (the baseline).
//   BM_LocalTransportSameThread/bytes    send then recv of one tensor on one thread: mailbox cost.
//   BM_LocalTransportPingPong/bytes      two threads bounce a tensor: hand-over latency (one
//                                        way = half of a round trip, counter one_way_us).
//
// Usage: build/bench/bench_micro_runtime [--benchmark_filter=Pipe] (see --help)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include <torch/torch.h>

#include "pipetrain/runtime/pipe.h"
#include "pipetrain/stage/microbatch.h"
#include "pipetrain/transport/local.h"

namespace {

using pipetrain::Pipe;
using pipetrain::PipeOptions;

const char* kSchedules[] = {"gpipe", "1f1b", "zb-h1"};

torch::nn::Sequential tiny_model(int layers) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int l = 0; l < layers; ++l) model->push_back(torch::nn::Linear(4, 4));
  return model;
}

torch::Tensor mse(const torch::Tensor& out, const torch::Tensor& target) {
  return torch::mse_loss(out, target);
}

double plain_step_seconds(int microbatches, int layers, int repeats) {
  torch::nn::Sequential model = tiny_model(layers);
  const torch::Tensor x = torch::randn({2 * microbatches, 4});
  const torch::Tensor y = torch::randn({2 * microbatches, 4});
  const auto sizes = pipetrain::microbatch_sizes(x.size(0), microbatches);
  const auto xs = pipetrain::split_microbatches({x}, sizes);
  const auto ys = pipetrain::split_microbatches({y}, sizes);
  auto step = [&] {
    model->zero_grad();
    for (size_t i = 0; i < sizes.size(); ++i) {
      (mse(model->forward(xs[i][0]), ys[i][0]) * (sizes[i] / double(x.size(0)))).backward();
    }
  };
  step();
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < repeats; ++k) step();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeats;
}

void BM_PipeTinyStep(benchmark::State& state) {
  at::set_num_threads(1);
  const int K = static_cast<int>(state.range(0));
  const int M = static_cast<int>(state.range(1));
  const char* schedule = kSchedules[state.range(2)];
  Pipe pipe(tiny_model(2 * K), PipeOptions()
                                   .stages(K)
                                   .chunks(M)
                                   .schedule(schedule)
                                   .checkpoint(pipetrain::Checkpoint::kNever)
                                   .threads_per_stage(1));
  const torch::Tensor x = torch::randn({2 * M, 4});
  const torch::Tensor y = torch::randn({2 * M, 4});
  pipe->train_step(x, y, mse);  // builds and caches the schedule
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    pipe->zero_grad();
    benchmark::DoNotOptimize(pipe->train_step(x, y, mse));
  }
  const double step_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
      static_cast<double>(std::max<int64_t>(1, state.iterations()));
  size_t actions = 0;
  for (const auto& rank : pipe->schedule().actions) actions += rank.size();
  const double plain_us = plain_step_seconds(M, 2 * K, 20) * 1e6;
  state.counters["actions"] = static_cast<double>(actions);
  state.counters["us_per_action"] = step_us / static_cast<double>(actions);
  state.counters["plain_step_us"] = plain_us;
  state.counters["overhead_us_per_action"] = (step_us - plain_us) / static_cast<double>(actions);
  state.SetLabel(schedule);
}
BENCHMARK(BM_PipeTinyStep)
    ->ArgsProduct({{1, 2, 4}, {8}, {0, 1, 2}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_PlainTinyStep(benchmark::State& state) {
  at::set_num_threads(1);
  const int M = static_cast<int>(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(plain_step_seconds(M, 4, 1));
}
BENCHMARK(BM_PlainTinyStep)->Arg(8)->Unit(benchmark::kMicrosecond);

void BM_LocalTransportSameThread(benchmark::State& state) {
  pipetrain::LocalTransport transport({torch::kCPU, torch::kCPU});
  const torch::Tensor t = torch::zeros({state.range(0) / 4});
  const pipetrain::Envelope envelope{0, 1, 0, pipetrain::Payload::kActivation};
  for (auto _ : state) {
    transport.send(envelope, pipetrain::Bundle{{t}, {}});
    benchmark::DoNotOptimize(transport.recv(envelope));
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_LocalTransportSameThread)->Range(4 << 10, 64 << 20)->Unit(benchmark::kMicrosecond);

void BM_LocalTransportPingPong(benchmark::State& state) {
  pipetrain::LocalTransport transport({torch::kCPU, torch::kCPU});
  const torch::Tensor t = torch::zeros({state.range(0) / 4});
  // The echo side: returns every activation as a gradient until a bundle named "stop" comes.
  std::thread echo([&] {
    for (int i = 0;; ++i) {
      pipetrain::Bundle b = transport.recv({0, 1, i % 1024, pipetrain::Payload::kActivation});
      if (!b.skip_names.empty()) break;
      transport.send({1, 0, i % 1024, pipetrain::Payload::kGradient}, std::move(b));
    }
  });
  int i = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    transport.send({0, 1, i % 1024, pipetrain::Payload::kActivation}, pipetrain::Bundle{{t}, {}});
    benchmark::DoNotOptimize(transport.recv({1, 0, i % 1024, pipetrain::Payload::kGradient}));
    ++i;
  }
  const double round_trip_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
      static_cast<double>(std::max<int64_t>(1, state.iterations()));
  transport.send({0, 1, i % 1024, pipetrain::Payload::kActivation},
                 pipetrain::Bundle{{torch::zeros({1})}, {"stop"}});
  echo.join();
  state.counters["one_way_us"] = round_trip_us / 2;
  state.SetBytesProcessed(state.iterations() * state.range(0) * 2);
}
BENCHMARK(BM_LocalTransportPingPong)
    ->Range(4 << 10, 64 << 20)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
