// BufferPool: host buffers of the sizes ZeRO allocates over and over (a bucket's packed
// gradients, a segment's gathered parameters), handed back after use and given out again, so
// that a step does not allocate and fault them anew for every micro-batch and layer.
//
// Why: glibc's allocator returns a freed block of 32 MiB or more to the kernel at once, but it
// raises its mmap threshold to the size of the last such block freed, so smaller multi-megabyte
// blocks then come from its heaps, where what a step frees in between stays resident
// (fragmentation). Freeing every block to the kernel instead costs a page fault per 4 KiB on every
// reuse. So the pool's buffers of a MiB or more are pages of their own (mmap: never in the heap
// the step's tensors come from), and of each size it keeps as many spares as were ever in use at
// once, less those in use now: the pool never holds more than its busiest moment did.
//
// A buffer handed back with `keep` false (what gather_all makes whole outside a step) is freed:
// it does not raise what the pool keeps. So is one of kLargestSpareBytes or more: such a size is
// rare (a vocabulary table's gathered values and its piece, 890 and 445 MiB at Qwen2-1.5B's
// width, taken a few times a step), and a spare of it would stay resident between its uses;
// taking it anew costs its page faults (about 0.3 s a GiB here), not the memory.
//
// On a GPU it passes everything through: the caching allocator does this already.
//
// Ownership: shared (shared_ptr), so that a lease outliving its owner still returns its buffer.
// Thread-safety: take and give may be called from any thread (one mutex).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <torch/types.h>

namespace pipetrain::train {

class BufferPool {
 public:
  static constexpr int64_t kLargestSpareBytes = int64_t{256} << 20;

  // A 1-D tensor of `elements` of `options`' dtype and device, contents undefined: a spare of
  // exactly that many bytes (and the same dtype and device) if the pool has one, else a new one.
  torch::Tensor take(int64_t elements, const torch::TensorOptions& options);
  // Hands `buffer` back (it must not be used after): kept as a spare while fewer are kept and in
  // use than were in use at once before (and `keep`), else freed. REQUIRES: from take().
  void give(const torch::Tensor& buffer, bool keep = true);
  // The bytes of spares held now.
  int64_t spare_bytes() const;

 private:
  using Key = std::tuple<int64_t, int, std::string>;  // bytes, dtype, device
  struct Size {
    std::vector<torch::Tensor> spares;
    int in_use = 0;
    int peak = 0;  // the most in use at once
  };
  mutable std::mutex mutex_;
  std::map<Key, Size> sizes_;  // GUARDED_BY(mutex_)
};

}  // namespace pipetrain::train
