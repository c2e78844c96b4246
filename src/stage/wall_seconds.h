// wall_seconds(): the CPU half of time_on_device (include/pipetrain/stage/device.h), shared by
// the CUDA and the CPU-only implementation of the device seam.
#pragma once

#include <chrono>
#include <functional>

namespace pipetrain {

inline double wall_seconds(int calls, const std::function<void()>& body) {
  const auto start = std::chrono::steady_clock::now();
  for (int c = 0; c < calls; ++c) body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace pipetrain
