// Where ZeRO's offloaded values live (--offload-optimizer, --offload-params: none, cpu, nvme), and
// the settings of the files that hold them under nvme (ZeRO-Infinity, issue 61): the directory,
// the bounded pool of aligned host buffers every transfer goes through, the optimizer's sub-group
// and the I/O engine. docs/OFFLOAD.md describes the whole; train/optimizer_state_file.h is what
// uses them for the optimizer state.
//
// Example:
//   ZeroOptions().stage(2).offload(true).offload_to_nvme(true)
//       .nvme(NvmeOptions().dir("/mnt/nvme/run1").buffer_bytes(32 << 20).buffer_count(6));
#pragma once

#include <cstdint>
#include <string>

#include <torch/arg.h>

#include "pipetrain/offload/file_io.h"

namespace pipetrain::train {

enum class OffloadDevice { kNone, kCpu, kNvme };
// "none", "cpu", "nvme". The parser throws BadInput naming `flag` and the text.
const char* to_string(OffloadDevice device);
OffloadDevice parse_offload_device(const std::string& text, const std::string& flag);

// "auto" (uring where uring_available(), else threads), "uring" or "threads" (offload/file_io.h);
// throws BadInput naming --offload-io and the text.
offload::IoEngine parse_offload_io(const std::string& text);

struct NvmeOptions {
  // The directory the offload files are made in (they are removed from it as soon as they are
  // open: offload/swap_file.h). Required under nvme.
  TORCH_ARG(std::string, dir) = "";
  // The pool every transfer goes through: `buffer_count` buffers of `buffer_bytes` (rounded up to
  // 4096), the whole of the host memory the files' transfers use (DeepSpeed's buffer_size and
  // buffer_count, there counted in elements).
  TORCH_ARG(int64_t, buffer_bytes) = int64_t{16} << 20;
  TORCH_ARG(int, buffer_count) = 6;
  // Elements the optimizer steps at once (DeepSpeed's sub_group_size): each state field of a
  // sub-group fills one buffer, so at most buffer_bytes / element size; 0: that many. Rounded down
  // to whole 4096-byte blocks.
  TORCH_ARG(int64_t, sub_group_size) = 0;
  TORCH_ARG(offload::IoEngine, io) = offload::IoEngine::kThreads;
  // Transfers in the kernel (or the thread pool) at once.
  TORCH_ARG(int, io_depth) = 8;
};

// The pool's host memory: buffer_count buffers of buffer_bytes rounded up to 4096.
int64_t pool_bytes(const NvmeOptions& options);

// NvmeOptions with the engine "auto" resolves to.
NvmeOptions default_nvme_options();

// Throws BadInput naming the flag and value: buffer bytes or count below 1, a negative sub-group
// or one whose float32 values do not fit a buffer, an io depth below 1, an unavailable engine.
void check_nvme_options(const NvmeOptions& options);
// Throws FileError naming the directory when it is not given, is not a directory this process
// can create files in, or has fewer than `bytes` free (what the files will hold; 0: no test).
void check_nvme_directory(const NvmeOptions& options, int64_t bytes, const std::string& what);

}  // namespace pipetrain::train
