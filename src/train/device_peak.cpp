// Peak FLOP/s for MFU (train/device_peak.h).
#include "pipetrain/train/device_peak.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/torch.h>

namespace pipetrain::train {
namespace {

struct KnownGpu {
  const char* name_contains;  // matched in order: the first that the device's name contains
  double bf16_tflops;
  double fp32_tflops;  // TF32 tensor cores where the device has them
};

const std::vector<KnownGpu>& known_gpus() {
  static const std::vector<KnownGpu> table = {
      {"H100 PCIe", 756, 378}, {"H100", 989, 494}, {"H200", 989, 494},
      {"H20", 148, 74},        {"A100", 312, 156}, {"L40S", 362, 91.6},
      {"L4", 121, 60},         {"A10", 125, 62.5}, {"V100", 125, 15.7}};
  return table;
}

}  // namespace

double known_gpu_peak_flops(const std::string& name, bool bf16) {
  for (const KnownGpu& gpu : known_gpus()) {
    if (name.find(gpu.name_contains) != std::string::npos) {
      return (bf16 ? gpu.bf16_tflops : gpu.fp32_tflops) * 1e12;
    }
  }
  return 0;
}

double measure_cpu_peak_flops(int threads, int n, int repeats) {
  const int before = at::get_num_threads();
  at::set_num_threads(std::max(1, threads));
  torch::NoGradGuard no_grad;
  const torch::Tensor a = torch::randn({n, n}), b = torch::randn({n, n});
  torch::Tensor c = torch::mm(a, b);  // warm-up: thread pool, caches
  double best = 0;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    const auto start = std::chrono::steady_clock::now();
    torch::mm_out(c, a, b);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds > 0) best = std::max(best, 2.0 * n * n * static_cast<double>(n) / seconds);
  }
  at::set_num_threads(before);
  return best;
}

DevicePeak run_peak(double given_tflops, const std::string& cuda_name, bool bf16, int devices,
                    int cpu_threads) {
  const std::string times = " x " + std::to_string(std::max(1, devices));
  if (given_tflops > 0) {
    char given[64];
    std::snprintf(given, sizeof given, "given: --peak-tflops %g", given_tflops);
    return {given_tflops * 1e12 * std::max(1, devices), given + times};
  }
  if (!cuda_name.empty()) {
    const double each = known_gpu_peak_flops(cuda_name, bf16);
    if (each <= 0) return {0, "unknown device " + cuda_name + ": give --peak-tflops"};
    return {each * std::max(1, devices),
            "table: " + cuda_name + (bf16 ? " bf16" : " tf32") + times};
  }
  return {measure_cpu_peak_flops(cpu_threads), "measured: fp32 1024 x 1024 matrix products, " +
                                                   std::to_string(cpu_threads) + " threads"};
}

std::string describe_peak(const DevicePeak& peak) {
  char text[64];
  if (peak.flops >= 1e12) {
    std::snprintf(text, sizeof text, "%.0f TFLOP/s", peak.flops / 1e12);
  } else {
    std::snprintf(text, sizeof text, "%.1f GFLOP/s", peak.flops / 1e9);
  }
  return std::string(text) + " (" + peak.source + ")";
}

}  // namespace pipetrain::train
