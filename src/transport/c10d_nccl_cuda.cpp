// The NCCL seam, CUDA build: a ProcessGroupNCCL per group. Built only with a CUDA LibTorch
// (CMake drops *_cuda.cpp otherwise); not compiled on the CPU-only development machine.
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "c10d_internal.h"

namespace pipetrain::detail {

bool nccl_available() {
  return true;
}

c10::intrusive_ptr<C10dBackendBase> make_nccl_group(const c10::intrusive_ptr<::c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  auto options = ::c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<::c10d::ProcessGroupNCCL>(store, rank, size, options);
}

}  // namespace pipetrain::detail
