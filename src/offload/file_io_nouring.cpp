// FileIo's io_uring engine where the build has no liburing (CMakeLists.txt picks this file or
// file_io_uring.cpp): never available, and says why.
#include "pipetrain/base/error.h"
#include "pipetrain/offload/file_io.h"

namespace pipetrain::offload::detail {

std::unique_ptr<FileIo> make_uring_io(int) {
  throw BadInput("--offload-io uring: " + uring_unavailable_reason());
}

std::string uring_unavailable_reason() {
  return "this build has no liburing (Debian's liburing-dev; scripts/bootstrap installs it)";
}

}  // namespace pipetrain::offload::detail
