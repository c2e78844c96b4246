// Micro-benchmark of the multi-process transport: C10dTransport (transport/c10d.h) over Gloo on
// the loopback interface, 4 KiB to 64 MiB tensors (Google Benchmark; not a test).
//
// Two ranks live in this one process as two threads, each with its own C10dWorld (its own
// ProcessGroupGloo) over one TCPStore hosted by rank 0 -- the same wire path as two processes,
// without a launcher:
//
//   main thread (rank 0)                     echo thread (rank 1)
//   send activation i  ---- Gloo/TCP ---->   recv activation i
//   recv gradient i    <--- Gloo/TCP -----   send the same bundle back as gradient i
//
// One iteration is a round trip. Counters: one_way_us (half a round trip, including pipetrain's
// header message and metadata), and bytes_per_second (payload bytes moved, both directions).
//
// Usage: build/bench/bench_micro_gloo [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include <torch/torch.h>

#include "pipetrain/runtime/launcher.h"
#include "pipetrain/transport/c10d.h"

namespace {

using pipetrain::Bundle;
using pipetrain::C10dTransport;
using pipetrain::C10dWorld;
using pipetrain::Envelope;
using pipetrain::Payload;

constexpr int kMicrobatchSlots = 4096;  // micro-batch field of the tag, reused cyclically

std::unique_ptr<C10dTransport> g_rank0;
int g_next = 0;  // the next micro-batch slot of rank 0's messages

void BM_GlooRoundTrip(benchmark::State& state) {
  const torch::Tensor t = torch::zeros({state.range(0) / 4});
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    const int i = g_next++ % kMicrobatchSlots;
    g_rank0->send({0, 1, i, Payload::kActivation}, Bundle{{t}, {}});
    benchmark::DoNotOptimize(g_rank0->recv({1, 0, i, Payload::kGradient}));
  }
  const double round_trip_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
      static_cast<double>(std::max<int64_t>(1, state.iterations()));
  state.counters["one_way_us"] = round_trip_us / 2;
  state.counters["one_way_GiB_per_s"] =
      static_cast<double>(state.range(0)) / (round_trip_us / 2 * 1e-6) / (1 << 30);
  state.SetBytesProcessed(state.iterations() * state.range(0) * 2);
}
BENCHMARK(BM_GlooRoundTrip)
    ->RangeMultiplier(4)
    ->Range(4 << 10, 64 << 20)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  at::set_num_threads(1);

  pipetrain::RendezvousOptions options;
  options.master_addr = "127.0.0.1";
  options.master_port = pipetrain::find_free_port();
  options.world_size = 2;
  options.timeout = std::chrono::seconds(60);

  // Rank 1: connect, then echo every activation back as a gradient until a "stop" bundle.
  std::thread echo([options]() mutable {
    options.rank = 1;
    auto world = C10dWorld::connect(options);
    {
      C10dTransport transport(world, {0, 1});
      for (int i = 0;; i = (i + 1) % kMicrobatchSlots) {
        Bundle b = transport.recv({0, 1, i, Payload::kActivation});
        if (!b.skip_names.empty()) break;
        transport.send({1, 0, i, Payload::kGradient}, std::move(b));
      }
      transport.flush();
    }
    world->finalize();
  });

  options.rank = 0;
  auto world = C10dWorld::connect(options);
  g_rank0 = std::make_unique<C10dTransport>(world, std::vector<int>{0, 1});
  benchmark::RunSpecifiedBenchmarks();
  g_rank0->send({0, 1, g_next % kMicrobatchSlots, Payload::kActivation},
                Bundle{{torch::zeros({1})}, {"stop"}});
  g_rank0->flush();
  g_rank0.reset();
  world->finalize();
  echo.join();
  benchmark::Shutdown();
  return 0;
}
