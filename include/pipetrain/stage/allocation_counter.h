// AllocationCounter: the bytes of CPU tensor memory allocated on one thread while counting, that
// are still alive now. How a Stage measures what a micro-batch's forward keeps (the tensors
// autograd saved for backward, its outputs), instead of estimating it from the tensors it holds.
//
// How it works: the first AllocationCounter installs a wrapper around LibTorch's CPU allocator
// (c10::SetCPUAllocator, once per process). While a CountAllocations guard is active on a thread,
// every CPU allocation made on that thread is wrapped: its DataPtr carries the original DataPtr,
// its byte count and a share of the counter; the counter is incremented now and decremented when
// the memory is freed, on whatever thread frees it. Without an active guard the wrapper hands the
// original DataPtr through untouched (cost: one thread_local read per allocation).
//
//   thread T:  CountAllocations guard(counter)     counter.live_bytes()
//              |-- at::empty(...)  ->  +n bytes    (the allocation, wrapped)
//              '-- guard ends                      tensors made above live on, counted
//   any thread: last reference to that storage dropped  ->  -n bytes
//
// CUDA: once count_device_allocations (stage/device.h) has started it, the caching allocator's
// allocations made on a thread with an active guard count too, through the allocator's trace
// callbacks (a block counts until its free is asked for). A Stage on a GPU measures its stash so.
//
// What it does not see: memory from neither allocator (from_blob, the BLAS library's own
// buffers), allocations made on other threads (intra-op workers), and CPU tensors allocated
// before the wrapper was installed. Counts are the bytes requested, not the allocators' rounding.
//
// Ownership: a counter is shared (shared_ptr) with every allocation it counted, so it may be
// destroyed before them. Thread-safety: live_bytes() and counted_bytes_of() may be called from any
// thread; a CountAllocations guard affects only the thread that made it.
// Allocator::raw_allocate / raw_deallocate work inside a guard too (CPU convolutions take their
// workspaces that way): a counted block's DataPtr context is its data pointer, and the record is
// found by that pointer.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include <torch/types.h>

namespace pipetrain {

class AllocationCounter {
 public:
  // Installs the counting CPU allocator on first use (thread-safe).
  AllocationCounter();
  AllocationCounter(const AllocationCounter&) = delete;
  AllocationCounter& operator=(const AllocationCounter&) = delete;

  // Bytes counted by this counter and not yet freed.
  int64_t live_bytes() const { return live_->load(std::memory_order_relaxed); }

  // The bytes of `tensor`'s storage if this counter counted its allocation, else 0 (an undefined
  // tensor, a storage allocated elsewhere or by another counter).
  int64_t counted_bytes_of(const torch::Tensor& tensor) const;

 private:
  friend class CountAllocations;
  std::shared_ptr<std::atomic<int64_t>> live_;
};

// The counter of this thread's active CountAllocations guard; null when none. For the CUDA
// allocator's trace callback (stage/device_cuda.cpp).
const std::shared_ptr<std::atomic<int64_t>>* active_allocation_counter();

// Counts this thread's CPU allocations (and CUDA ones, once counted: above) into `counter` until
// the guard ends; guards nest (the inner one wins, the outer one resumes after it).
// REQUIRES: `counter` outlives the guard.
class CountAllocations {
 public:
  explicit CountAllocations(AllocationCounter& counter);
  ~CountAllocations();
  CountAllocations(const CountAllocations&) = delete;
  CountAllocations& operator=(const CountAllocations&) = delete;

 private:
  const std::shared_ptr<std::atomic<int64_t>>* previous_;
};

}  // namespace pipetrain
