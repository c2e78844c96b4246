// CUDA implementation of the device seam (include/pipetrain/stage/device.h). Built only against
// a CUDA LibTorch (CMake drops *_cuda.cpp otherwise).
//
// One stream per rank: RankStreamGuard takes a pooled stream for the rank's device and makes it
// current for the worker thread. Transfers between ranks: the sender records an event on its
// stream (mark_ready), the receiver makes its stream wait on it (wait_ready) before copying, so
// non_blocking copies never read a tensor that is still being written.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "pipetrain/base/check.h"
#include "pipetrain/stage/device.h"

namespace pipetrain {

void check_device_usable(const torch::Device& device) {
  if (device.is_cpu()) return;
  PIPETRAIN_CHECK_INPUT(device.is_cuda(), "device ", device.str(),
                        " is not supported; use torch::kCPU or a CUDA device");
  const int count = static_cast<int>(c10::cuda::device_count());
  PIPETRAIN_CHECK_INPUT(device.has_index() && device.index() < count, "device ", device.str(),
                        " is not usable: ", count,
                        " CUDA devices are visible; give an explicit index below ", count);
}

RankStreamGuard::RankStreamGuard(const torch::Device& device) {
  check_device_usable(device);
  if (!device.is_cuda()) return;
  auto stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  impl_ = std::make_shared<c10::cuda::CUDAStreamGuard>(stream);
}
RankStreamGuard::~RankStreamGuard() = default;

ReadyMarker mark_ready(const torch::Device& device) {
  if (!device.is_cuda()) return {};
  auto event = std::make_shared<at::cuda::CUDAEvent>();
  event->record(c10::cuda::getCurrentCUDAStream(device.index()));
  return {event};
}

void wait_ready(const ReadyMarker& marker, const torch::Device& device) {
  if (!marker.event) return;
  auto* event = static_cast<at::cuda::CUDAEvent*>(marker.event.get());
  if (device.is_cuda()) {
    event->block(c10::cuda::getCurrentCUDAStream(device.index()));
  } else {
    event->synchronize();  // a CPU consumer of a CUDA producer waits on the host
  }
}

torch::Tensor device_rng_state(const torch::Device& device) {
  if (!device.is_cuda()) return {};
  auto generator = at::cuda::detail::getDefaultCUDAGenerator(device.index());
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_device_rng_state(const torch::Device& device, const torch::Tensor& state) {
  if (!device.is_cuda() || !state.defined()) return;
  auto generator = at::cuda::detail::getDefaultCUDAGenerator(device.index());
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

}  // namespace pipetrain
