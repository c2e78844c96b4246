// AlignedBuffers: a bounded pool of equal host buffers, aligned for direct I/O, through which
// offloaded tensors move between memory and their files (offload/swap_file.h). The pool is the
// whole of the host memory the transfers use: `count` buffers of `bytes`, allocated once, handed
// out and back; a caller that wants one while all are out waits until one comes back. A tensor
// larger than a buffer streams through it in slices, so no buffer is ever sized by the largest
// tensor (DeepSpeed's swap buffers are, which is what takes its memory: issue 61).
//
// Alignment: `alignment` bytes (4096 by default: the logical block size of every NVMe drive and
// file system that takes O_DIRECT here); each buffer's size is rounded up to it.
//
// Torch-free (part of pipetrain::schedule). Thread-safety: acquire, try_acquire and a lease's
// release may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace pipetrain::offload {

class AlignedBuffers;

// One buffer, lent until destroyed (or released): then it goes back to its pool.
class BufferLease {
 public:
  BufferLease() = default;
  BufferLease(BufferLease&& other) noexcept;
  BufferLease& operator=(BufferLease&& other) noexcept;
  BufferLease(const BufferLease&) = delete;
  BufferLease& operator=(const BufferLease&) = delete;
  ~BufferLease() { release(); }

  char* data() const { return data_; }
  int64_t size() const;
  explicit operator bool() const { return data_ != nullptr; }
  void release();

 private:
  friend class AlignedBuffers;
  BufferLease(AlignedBuffers* pool, int index, char* data)
      : pool_(pool), index_(index), data_(data) {}
  AlignedBuffers* pool_ = nullptr;
  int index_ = -1;
  char* data_ = nullptr;
};

class AlignedBuffers {
 public:
  // Throws pipetrain::BadInput naming the value for bytes < 1, count < 1, or an alignment that is
  // not a power of two; pipetrain::Error when the memory cannot be had.
  AlignedBuffers(int64_t bytes, int count, int64_t alignment = 4096);
  ~AlignedBuffers();
  AlignedBuffers(const AlignedBuffers&) = delete;
  AlignedBuffers& operator=(const AlignedBuffers&) = delete;

  // A free buffer; waits while every one is lent. Contents undefined.
  BufferLease acquire();
  // A free buffer, or none when every one is lent.
  std::optional<BufferLease> try_acquire();

  int64_t buffer_bytes() const { return bytes_; }
  int count() const { return static_cast<int>(buffers_.size()); }
  int64_t alignment() const { return alignment_; }
  // The host memory the pool holds: count() x buffer_bytes().
  int64_t total_bytes() const { return bytes_ * count(); }
  int in_use() const;
  // The most lent at once since construction.
  int peak_in_use() const;

 private:
  friend class BufferLease;
  void give_back(int index);
  BufferLease lend_locked();  // REQUIRES: mutex_ held, free_ not empty

  int64_t bytes_;
  int64_t alignment_;
  std::vector<char*> buffers_;
  mutable std::mutex mutex_;
  std::condition_variable returned_;
  std::vector<int> free_;  // GUARDED_BY(mutex_)
  int peak_ = 0;           // GUARDED_BY(mutex_)
};

// `value` rounded up to a multiple of `alignment` (a power of two).
inline int64_t align_up(int64_t value, int64_t alignment) {
  return (value + alignment - 1) & ~(alignment - 1);
}

}  // namespace pipetrain::offload
