// CPU-only stand-in for the device seam (include/pipetrain/stage/device.h): CUDA devices are an
// error naming the device, everything else is a no-op.
#include <c10/util/Exception.h>

#include "pipetrain/base/check.h"
#include "pipetrain/stage/device.h"
#include "wall_seconds.h"

namespace pipetrain {

void check_device_usable(const torch::Device& device) {
  PIPETRAIN_CHECK_INPUT(device.is_cpu(), "device ", device.str(),
                        " is not usable: this pipetrain was built against a CPU-only LibTorch; use "
                        "torch::kCPU devices or rebuild with a CUDA LibTorch");
}

int cuda_device_count() {
  return 0;
}

std::string device_name(const torch::Device& device) {
  check_device_usable(device);
  return "cpu";
}

RankStream rank_stream(const torch::Device& device, int) {
  check_device_usable(device);
  return {};
}

RankStreamGuard::RankStreamGuard(const RankStream&) {}
RankStreamGuard::~RankStreamGuard() = default;

ReadyMarker mark_ready(const torch::Device&) {
  return {};
}
void wait_ready(const ReadyMarker&, const torch::Device&) {}

HostCopies copy_to_host(const std::vector<torch::Tensor>& tensors, const torch::Device& device) {
  check_device_usable(device);
  return HostCopies{tensors, false};
}

std::vector<torch::Tensor> copy_to_device(const HostCopies& copies, const torch::Device&,
                                          ReadyMarker& ready) {
  ready = ReadyMarker{};
  return copies.tensors;
}

void record_use_on_current_stream(const torch::Tensor&) {}

int64_t device_peak_allocated_bytes(const torch::Device&) {
  return 0;
}
void reset_device_peak_allocated_bytes(const torch::Device&) {}

int64_t device_allocated_bytes(const torch::Device&) {
  return 0;
}

bool count_device_allocations(const torch::Device&) {
  return false;
}

int64_t device_counted_bytes(const void*, const std::shared_ptr<std::atomic<int64_t>>&) {
  return 0;
}

double time_on_device(const torch::Device& device, int calls, const std::function<void()>& body) {
  PIPETRAIN_CHECK_INPUT(calls >= 1, "time_on_device: calls must be >= 1, got ", calls);
  check_device_usable(device);
  return wall_seconds(calls, body);
}

torch::Tensor device_rng_state(const torch::Device&) {
  return {};
}
void set_device_rng_state(const torch::Device&, const torch::Tensor&) {}

}  // namespace pipetrain
