// bench_alloc_trace: what the CUDA caching allocator's trace callback costs a training step.
// pipetrain attaches it (count_device_allocations, stage/device.h) the first time a CUDA stage
// measures its stash, and it then sees every CUDA allocation and free of the process, whoever
// makes them. The step is launch-bound, so that host-side costs show: 8 x (Linear(W) + ReLU) on
// cuda:0, batch N, MSE, backward, SGD (W = 1024, N = 256 unless given), each ended by a device
// synchronisation.
//
// Processes differ from one another by far more than the callback can cost (a GPU's and a core's
// clocks: single processes of the same code were 0.77 to 1.43 of each other), and the callback
// cannot be detached once attached. So each process times the step twice, a block A without the
// callback and then a block B, and reports B / A; modes differ only in what happens between:
//
//   control    nothing: B / A is the drift within a process
//   attached   the callback attached, no counter active in B: what every allocation of the process
//              pays once a CUDA stage exists (a thread-local read; a free looks its address up
//              under a lock)
//   counting   the callback attached and a CountAllocations guard active around B's forwards, as
//              a stage measuring its stash has: each allocation of the forward is recorded
//
// A mode's figure is its B / A over control's B / A in the same round (one process per mode and
// round, in reverse order on odd rounds), medians over rounds.
//
// Run: bench_alloc_trace [rounds (6)] [timed steps per block (200)] [W] [N]. Without a CUDA device
// it says so and exits with 2.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <torch/cuda.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "pipetrain/base/median.h"
#include "pipetrain/runtime/launcher.h"
#include "pipetrain/stage/allocation_counter.h"
#include "pipetrain/stage/device.h"

using namespace pipetrain;

namespace {

const char* const kPrefix = "ALLOC_TRACE_BENCH ";
const std::vector<std::string> kModes = {"control", "attached", "counting"};
constexpr int kWarmup = 30;

// One process: prints kPrefix {"a": median seconds of block A, "b": of block B, "counted": the
// bytes of B's last forward still alive after it, as the guard counted them}.
int run_child(const std::string& mode, int steps, int64_t width, int64_t batch) {
  const torch::Device device(torch::kCUDA, 0);
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int l = 0; l < 8; ++l) {
    model->push_back(torch::nn::Linear(width, width));
    model->push_back(torch::nn::ReLU());
  }
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(1e-3));
  const torch::Tensor x = torch::randn({batch, width}, device);
  const torch::Tensor y = torch::randn({batch, width}, device);
  int64_t counted = 0;
  // Median seconds of `timed` steps after `warmup` ones; `guarded`: forwards under a guard.
  auto block = [&](int warmup, int timed, bool guarded) {
    std::vector<double> seconds;
    for (int step = 0; step < warmup + timed; ++step) {
      const auto start = std::chrono::steady_clock::now();
      optimizer.zero_grad();
      torch::Tensor out;
      AllocationCounter counter;  // a stage makes one per micro-batch
      if (guarded) {
        {
          CountAllocations guard(counter);
          out = model->forward(x);
        }
        counted = counter.live_bytes();
      } else {
        out = model->forward(x);
      }
      torch::mse_loss(out, y).backward();
      optimizer.step();
      torch::cuda::synchronize();
      const double took =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (step >= warmup) seconds.push_back(took);
    }
    return median(seconds);
  };
  const double a = block(kWarmup, steps, false);
  if (mode != "control" && !count_device_allocations(device)) {
    std::fprintf(stderr, "bench_alloc_trace: this allocator backend has no trace callbacks\n");
    return 2;
  }
  const double b = block(kWarmup / 3, steps, mode == "counting");
  std::cout << kPrefix << nlohmann::json{{"a", a}, {"b", b}, {"counted", counted}}.dump()
            << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 6 && std::string(argv[1]) == "--child") {
    return run_child(argv[2], std::atoi(argv[3]), std::atoll(argv[4]), std::atoll(argv[5]));
  }
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 6;
  const int steps = argc > 2 ? std::max(1, std::atoi(argv[2])) : 200;
  const int64_t width = argc > 3 ? std::max(1LL, std::atoll(argv[3])) : 1024;
  const int64_t batch = argc > 4 ? std::max(1LL, std::atoll(argv[4])) : 256;
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "bench_alloc_trace: needs a CUDA device; none is visible\n");
    return 2;
  }
  std::printf(
      "bench_alloc_trace: 8 x Linear(%lld) + ReLU, batch %lld, SGD, on cuda:0; %d rounds of a "
      "process per mode, %d timed steps each after %d warm-up\n",
      static_cast<long long>(width), static_cast<long long>(batch), rounds, steps, kWarmup);
  std::map<std::string, std::vector<double>> a_us, b_over_a, ratio;
  int64_t counted = 0;
  for (int round = 0; round < rounds; ++round) {
    std::map<std::string, double> drift;
    for (size_t n = 0; n < kModes.size(); ++n) {
      const std::string& mode = kModes[round % 2 == 0 ? n : kModes.size() - 1 - n];
      const CollectedRun run = launch_self_collecting(
          1, {"--child", mode, std::to_string(steps), std::to_string(width), std::to_string(batch)},
          kPrefix);
      if (run.launched.exit_code != 0 || run.results.empty() || !run.results[0]) {
        std::fprintf(stderr, "bench_alloc_trace: the %s process exited with %d\n", mode.c_str(),
                     run.launched.exit_code);
        return 1;
      }
      const nlohmann::json result = nlohmann::json::parse(*run.results[0]);
      const double a = result["a"].get<double>();
      drift[mode] = result["b"].get<double>() / a;
      a_us[mode].push_back(1e6 * a);
      b_over_a[mode].push_back(drift[mode]);
      if (mode == "counting") counted = result["counted"].get<int64_t>();
    }
    for (const std::string& mode : kModes) ratio[mode].push_back(drift[mode] / drift["control"]);
  }
  std::printf("%-10s %12s %8s %12s   per round\n", "mode", "A step (us)", "B / A", "vs control");
  for (const std::string& mode : kModes) {
    std::printf("%-10s %12.1f %8.4f %12.4f  ", mode.c_str(), median(a_us[mode]),
                median(b_over_a[mode]), median(ratio[mode]));
    for (double r : ratio[mode]) std::printf(" %.4f", r);
    std::printf("\n");
  }
  std::printf("counting: B's last forward left %lld bytes alive that the guard counted\n",
              static_cast<long long>(counted));
  return 0;
}
