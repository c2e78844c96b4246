#include "pipetrain/train/nvme_options.h"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "pipetrain/base/check.h"
#include "pipetrain/base/error.h"
#include "pipetrain/offload/aligned_buffers.h"
#include "pipetrain/partition/memory.h"

namespace pipetrain::train {

const char* to_string(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::kNone:
      return "none";
    case OffloadDevice::kCpu:
      return "cpu";
    case OffloadDevice::kNvme:
      return "nvme";
  }
  return "?";
}

OffloadDevice parse_offload_device(const std::string& text, const std::string& flag) {
  if (text == "none") return OffloadDevice::kNone;
  if (text == "cpu") return OffloadDevice::kCpu;
  if (text == "nvme") return OffloadDevice::kNvme;
  throw BadInput(flag + " must be none, cpu or nvme, got '" + text + "'");
}

offload::IoEngine parse_offload_io(const std::string& text) {
  if (text == "auto") {
    return offload::uring_available() ? offload::IoEngine::kUring : offload::IoEngine::kThreads;
  }
  if (text == "uring" || text == "threads") return offload::parse_io_engine(text);
  throw BadInput("--offload-io must be auto, uring or threads, got '" + text + "'");
}

int64_t pool_bytes(const NvmeOptions& o) {
  return offload::align_up(o.buffer_bytes(), 4096) * static_cast<int64_t>(o.buffer_count());
}

NvmeOptions default_nvme_options() {
  return NvmeOptions().io(parse_offload_io("auto"));
}

void check_nvme_options(const NvmeOptions& o) {
  PIPETRAIN_CHECK_INPUT(o.buffer_bytes() >= 1, "--offload-buffer-bytes must be at least 1, got ",
                        o.buffer_bytes());
  PIPETRAIN_CHECK_INPUT(o.buffer_count() >= 1, "--offload-buffer-count must be at least 1, got ",
                        o.buffer_count());
  PIPETRAIN_CHECK_INPUT(o.sub_group_size() >= 0,
                        "--sub-group-size must be 0 (a buffer's worth) or more elements, got ",
                        o.sub_group_size());
  // The state is float32 where the job sets these (a sub-group's field fills one buffer).
  const int64_t per_buffer = offload::align_up(o.buffer_bytes(), 4096) / 4;
  PIPETRAIN_CHECK_INPUT(o.sub_group_size() <= per_buffer, "--sub-group-size ", o.sub_group_size(),
                        " elements of 4 bytes do not fit one offload buffer: "
                        "--offload-buffer-bytes ",
                        o.buffer_bytes(), " holds ", per_buffer);
  PIPETRAIN_CHECK_INPUT(o.io_depth() >= 1, "the offload I/O depth must be at least 1, got ",
                        o.io_depth());
  if (o.io() == offload::IoEngine::kUring && !offload::uring_available()) {
    throw BadInput(
        "--offload-io uring: io_uring is not available to this process (use threads or auto)");
  }
}

void check_nvme_directory(const NvmeOptions& o, int64_t bytes, const std::string& what) {
  if (o.dir().empty()) {
    throw FileError(what + " puts its state in files: give the directory with --offload-dir DIR");
  }
  struct stat info {};
  if (::stat(o.dir().c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    throw FileError("--offload-dir '" + o.dir() + "' is not a directory" +
                    (errno != 0 ? std::string(": ") + std::strerror(errno) : std::string()));
  }
  // Writable, tried as the files will be made (root passes access() where a write would fail).
  std::string name = o.dir() + "/.pipetrain-offload-XXXXXX";
  std::vector<char> buffer(name.begin(), name.end());
  buffer.push_back('\0');
  const int fd = ::mkstemp(buffer.data());
  if (fd < 0) {
    throw FileError("--offload-dir '" + o.dir() + "' is not writable: " + std::strerror(errno));
  }
  ::close(fd);
  ::unlink(buffer.data());
  if (bytes <= 0) return;
  struct statvfs fs {};
  if (::statvfs(o.dir().c_str(), &fs) != 0) return;  // no figure: the reservation will tell
  const int64_t free = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  if (free < bytes) {
    throw FileError("--offload-dir '" + o.dir() + "' has " + partition::format_bytes(free) +
                    " free, and " + what + " needs " + partition::format_bytes(bytes) + " there");
  }
}

}  // namespace pipetrain::train
