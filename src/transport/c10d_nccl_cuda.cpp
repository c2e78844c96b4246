// The NCCL seam, CUDA build: a ProcessGroupNCCL per group. Built only with a CUDA LibTorch
// (CMake drops *_cuda.cpp otherwise). ProcessGroupNCCL runs its collectives and point-to-point
// operations on streams of its own and orders them after the current stream's work, so the
// transport does not make a stream for them.
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "c10d_internal.h"

namespace pipetrain::detail {

std::string nccl_unavailable_reason() {
  // device_count() is 0, not an error, without a driver: nothing here initialises CUDA.
  if (c10::cuda::device_count() > 0) return "";
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return std::string("NCCL needs a CUDA device and this machine has none visible") +
         (visible ? std::string(" (CUDA_VISIBLE_DEVICES='") + visible + "')" : "");
}

c10::intrusive_ptr<C10dBackendBase> make_nccl_group(const c10::intrusive_ptr<::c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  auto options = ::c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<::c10d::ProcessGroupNCCL>(store, rank, size, options);
}

}  // namespace pipetrain::detail
