// OptimizerStateFile: a ZeRO shard's optimizer state in a file (--offload-optimizer nvme), and
// with --offload-params nvme the shard's values too, stepped one sub-group at a time through a
// bounded pool of aligned host buffers (ZeRO-Infinity's offload, issue 61; docs/OFFLOAD.md).
//
// The file holds `fields` (Adam's exp_avg and exp_avg_sq, SGD's momentum_buffer, and "values":
// the shard's own), each `elements` values of one dtype, one region of the file per field. A step
// walks the elements in sub-groups of sub_group_elements(): each field's values of a sub-group are
// read into one buffer, the caller steps them (the inner optimizer's own kernels over views of the
// buffers), and they are written back. While the caller steps sub-group g, the read of g + 1 and
// the write of g - 1 are in flight where the pool has the buffers for them (3 x fields buffers: all
// of it; fewer: the transfers wait for each other), so host memory holds only the pool, whatever
// the shard's size.
//
// A field nothing was written to yet (before the first step, a restore or a fill) reads as zeros,
// as the optimizer's own state starts (and no read is made). The file is removed from the directory
// as soon as it is open (offload/swap_file.h): a killed run leaves nothing that a later one could
// read as state; what resumes is the last checkpoint.
//
// Thread-safety: one thread (the training loop's). Not copyable.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "pipetrain/offload/aligned_buffers.h"
#include "pipetrain/offload/swap_file.h"
#include "pipetrain/train/nvme_options.h"

namespace pipetrain::train {

class OptimizerStateFile {
 public:
  // A file named after `name` in options.dir(). Throws BadInput for options check_nvme_options
  // refuses, a sub-group larger than a buffer, or a pool with fewer buffers than fields;
  // FileError when the directory cannot hold the file (offload/swap_file.h: reserved up front).
  OptimizerStateFile(const NvmeOptions& options, std::vector<std::string> fields, int64_t elements,
                     torch::ScalarType dtype, const std::string& name);
  ~OptimizerStateFile();
  OptimizerStateFile(const OptimizerStateFile&) = delete;
  OptimizerStateFile& operator=(const OptimizerStateFile&) = delete;

  const std::vector<std::string>& fields() const { return fields_; }
  int64_t elements() const { return elements_; }
  int64_t sub_group_elements() const { return sub_group_; }
  // Whether field f holds values (a step, a write or a fill ran): false, it reads as zeros.
  bool written(size_t field) const { return written_.at(field) != 0; }

  // One step: calls step(first, length, windows) for each sub-group in order, windows[f] the
  // `length` values of field f from element `first` (contiguous, in a pool buffer), and writes
  // them back after it returns. A failure of a transfer (FileError) or of `step` is thrown after
  // every transfer in flight has ended; the state in the file is then unspecified.
  using SubGroupStep =
      std::function<void(int64_t first, int64_t length, const std::vector<torch::Tensor>& windows)>;
  void step(const SubGroupStep& step);

  // Field f whole into `out` (contiguous, elements() values of the dtype), or from `in`
  // (checkpoints). Before anything was written, read gives zeros.
  void read(size_t field, torch::Tensor& out);
  void write(size_t field, const torch::Tensor& in);
  // `length` values of field f from element `first` into `out` (anywhere, unaligned: through the
  // pool's buffers, a buffer's worth at a time).
  void read_range(size_t field, int64_t first, int64_t length, void* out);
  // Field f written sub-group by sub-group: fill(first, length, window) puts the values of
  // elements [first, first + length) into `window` (a pool buffer, contents undefined before).
  using Fill = std::function<void(int64_t first, int64_t length, const torch::Tensor& window)>;
  void fill(size_t field, const Fill& fill);
  // Updates field f's values from element `first` with `in` (contiguous, `length` values of the
  // dtype, on the host; anywhere, unaligned: the blocks at the range's ends are read and written
  // whole, so neighbouring ranges are kept), a buffer's worth at a time, each transfer waited
  // for. kAdd: old + x; kAddOntoZeros: 0 + x (the old values count as zeros: the first addition
  // of a step); kCopy: x. The last two read only the blocks the range shares. Each element is what
  // an in-memory add_ or copy_ would make it.
  enum class RangeUpdate { kAdd, kAddOntoZeros, kCopy };
  void update_range(size_t field, int64_t first, int64_t length, const torch::Tensor& in,
                    RangeUpdate how);
  // Field f is read by step() but not written back (a gradient the step only reads).
  void read_only_in_step(size_t field);

  // The last step's figures: bytes moved, sub-groups, seconds the step took and seconds it
  // waited for transfers (the rest is the optimizer's compute with transfers in flight).
  struct Stats {
    int64_t bytes_read = 0, bytes_written = 0;
    int64_t sub_groups = 0;
    double seconds = 0, io_wait_seconds = 0;
  };
  const Stats& last_step() const { return last_; }
  // The pool (host memory) and the file (disk) it holds.
  int64_t host_bytes() const { return buffers_.total_bytes(); }
  int64_t file_bytes() const { return file_.size(); }
  // The most buffers lent at once since construction.
  int peak_buffers_in_use() const { return buffers_.peak_in_use(); }
  bool direct() const { return file_.direct(); }
  const std::string& path() const { return file_.path(); }

 private:
  std::vector<std::string> fields_;
  int64_t elements_;
  torch::ScalarType dtype_;
  int64_t element_size_;
  int64_t sub_group_ = 0;
  offload::AlignedBuffers buffers_;
  offload::SwapFile file_;
  std::vector<int64_t> regions_;  // each field's offset in the file
  std::vector<char> written_;     // per field
  std::vector<char> read_only_;   // per field: step() does not write it back
  Stats last_;
};

}  // namespace pipetrain::train
