// The NCCL seam, CPU-only build: LibTorch has no CUDA, so there is no ProcessGroupNCCL to create.
#include "c10d_internal.h"

#include "pipetrain/base/check.h"

namespace pipetrain::detail {

std::string nccl_unavailable_reason() {
  return "NCCL needs a CUDA build of pipetrain; this one is CPU-only";
}

c10::intrusive_ptr<C10dBackendBase> make_nccl_group(const c10::intrusive_ptr<::c10d::Store>&,
                                                    int rank, int, std::chrono::milliseconds) {
  throw BadInput(
      "backend nccl needs a CUDA build of LibTorch and pipetrain; this build is CPU-only. "
      "Use --backend gloo (CPU stages)",
      ErrorSite{rank, -1, "", -1});
}

}  // namespace pipetrain::detail
