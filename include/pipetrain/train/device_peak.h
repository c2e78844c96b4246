// The peak FLOP/s that MFU (model FLOPs utilization, train/progress.h) divides by: given by the
// user, from a table of known GPUs, or measured on the CPU.
//
//   --peak-tflops T           T x 1e12 per device of the run                 source "given"
//   a CUDA device             the table below, dense bf16 (fp32: its TF32)     source "table: NAME"
//   the CPU                   measured once: the best of a few fp32 matrix     source "measured:
//   ..."
//                             products of 1024 x 1024 with every intra-op
//                             thread (what the machine's cores can do at best)
//
// The table (dense tensor-core figures from the vendors' data sheets, sparsity not counted; bf16,
// and TF32 for fp32): H100 SXM 989 / 494 TFLOP/s, H100 PCIe 756 / 378, H200 989 / 494, H20
// 148 / 74, A100 312 / 156, L40S 362 / 91.6, L4 121 / 60, A10 125 / 62.5, V100 125 (fp16) / 15.7.
// Unknown devices give 0: pass --peak-tflops.
//
// Thread-safety: pure functions; measure_cpu_peak_flops runs torch kernels with `threads` intra-op
// threads on the calling thread and puts its thread count back.
#pragma once

#include <string>

namespace pipetrain::train {

struct DevicePeak {
  double flops = 0;    // per device; 0 when unknown
  std::string source;  // "given", "table: NVIDIA H100 80GB HBM3", "measured: fp32 ..."
};

// The table's figure for a device named `name` (stage/device.h's device_name), bf16 or not; 0 for
// a device the table does not know.
double known_gpu_peak_flops(const std::string& name, bool bf16);

// This machine's fp32 matrix-product rate with `threads` intra-op threads, the best of `repeats`
// products of n x n. REQUIRES threads >= 1.
double measure_cpu_peak_flops(int threads, int n = 1024, int repeats = 5);

// The peak of a run's hardware, in the order of the top: `given_tflops` (> 0) per device, else the
// table's figure for `cuda_name` (a CUDA run's device_name; "" on the CPU), else the CPU measured
// with `cpu_threads`. `devices`: the GPUs of the run (the table's and the given figure times that).
DevicePeak run_peak(double given_tflops, const std::string& cuda_name, bool bf16, int devices,
                    int cpu_threads);

// "989 TFLOP/s (table: NVIDIA H100 80GB HBM3)", "152.3 GFLOP/s (measured: ...)".
std::string describe_peak(const DevicePeak& peak);

}  // namespace pipetrain::train
