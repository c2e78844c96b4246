// Tests for the peak MFU divides by (include/pipetrain/train/device_peak.h).
#include "pipetrain/train/device_peak.h"

#include <gtest/gtest.h>

namespace pipetrain::train::device_peak_test {
namespace {

TEST(DevicePeak, KnownGpusAreFoundByTheirDriversNameAndOthersGiveZero) {
  EXPECT_DOUBLE_EQ(known_gpu_peak_flops("NVIDIA H100 80GB HBM3", true), 989e12);
  EXPECT_DOUBLE_EQ(known_gpu_peak_flops("NVIDIA H100 PCIe", true), 756e12);
  EXPECT_DOUBLE_EQ(known_gpu_peak_flops("NVIDIA H200", true), 989e12);
  EXPECT_DOUBLE_EQ(known_gpu_peak_flops("NVIDIA A100-SXM4-80GB", false), 156e12);
  EXPECT_DOUBLE_EQ(known_gpu_peak_flops("NVIDIA A10", true), 125e12);  // not the A100
  EXPECT_DOUBLE_EQ(known_gpu_peak_flops("NVIDIA L4", true), 121e12);   // not the L40S
  EXPECT_DOUBLE_EQ(known_gpu_peak_flops("Some Future GPU", true), 0);
}

TEST(DevicePeak, TheCpuIsMeasuredWithAMatrixProduct) {
  const double peak = measure_cpu_peak_flops(1, 256, 2);
  EXPECT_GT(peak, 1e8);   // any CPU of this century
  EXPECT_LT(peak, 1e13);  // and not a supercomputer's
  EXPECT_EQ(describe_peak({152.34e9, "measured: x"}), "152.3 GFLOP/s (measured: x)");
  EXPECT_EQ(describe_peak({989e12, "table: H100"}), "989 TFLOP/s (table: H100)");
}

}  // namespace
}  // namespace pipetrain::train::device_peak_test
