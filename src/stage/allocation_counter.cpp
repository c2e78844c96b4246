// The counting wrapper around LibTorch's CPU allocator
// (include/pipetrain/stage/allocation_counter.h).
//
//   allocate(n) on thread T
//     [1] the wrapped allocator allocates: DataPtr{data, context, deleter}
//     [2] no guard active on T: return it as is (freed as if we were not here)
//     [3] guard active: counter += n; return DataPtr{data, CountedAllocation*, delete_counted},
//         the CountedAllocation owning the original DataPtr and a share of the counter
//   delete_counted(CountedAllocation*), on any thread
//     [4] counter -= n; destroying the original DataPtr frees the memory through its own deleter
//
// Why the CountedAllocations come from a pool of their own: as small heap objects interleaved
// with the large activation blocks they changed how glibc reuses and trims the heap, and the
// next backward got measurably slower (bench_stage_cost B: +4..7%); so did growing each block by
// a header in front of the data. From the pool's slabs the heap sees exactly the allocations it
// sees without counting.
#include "pipetrain/stage/allocation_counter.h"

#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace pipetrain {
namespace {

using Counter = std::shared_ptr<std::atomic<int64_t>>;

// The counter of this thread's active CountAllocations guard; null when none.
thread_local const Counter* current_counter = nullptr;

struct CountedAllocation {
  c10::DataPtr original;
  int64_t bytes;
  Counter counter;
};

// Storage for CountedAllocations, taken and given back from any thread. Slabs are never freed
// (the pool lives as long as the process: a deleter may run during static destruction).
class CountedAllocationPool {
 public:
  void* take() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.empty()) {
      constexpr size_t kSlots = 256;
      auto* slab = static_cast<char*>(::operator new(kSlots * sizeof(CountedAllocation)));
      free_.reserve(free_.size() + kSlots);
      for (size_t s = 0; s < kSlots; ++s) free_.push_back(slab + s * sizeof(CountedAllocation));
    }
    void* slot = free_.back();
    free_.pop_back();
    return slot;
  }
  void give_back(void* slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(slot);
  }

 private:
  std::mutex mutex_;
  std::vector<void*> free_;  // guarded by mutex_
};

CountedAllocationPool& pool() {
  static auto* instance = new CountedAllocationPool();
  return *instance;
}

void delete_counted(void* context) {
  auto* allocation = static_cast<CountedAllocation*>(context);
  allocation->counter->fetch_sub(allocation->bytes, std::memory_order_relaxed);  // [4]
  allocation->~CountedAllocation();
  pool().give_back(allocation);
}

class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* wrapped) : wrapped_(wrapped) {}

  c10::DataPtr allocate(size_t n) const override {
    c10::DataPtr original = wrapped_->allocate(n);  // [1]
    const Counter* counter = current_counter;
    if (counter == nullptr || original.get() == nullptr) return original;  // [2]
    void* data = original.get();
    const c10::Device device = original.device();
    const auto bytes = static_cast<int64_t>(n);
    auto* allocation = new (pool().take()) CountedAllocation{std::move(original), bytes, *counter};
    allocation->counter->fetch_add(bytes, std::memory_order_relaxed);  // [3]
    return c10::DataPtr(data, allocation, &delete_counted, device);
  }

  // Only allocations made outside a guard carry the wrapped allocator's raw deleter; that is
  // what raw_deallocate() is used with (see the header's REQUIRES).
  c10::DeleterFnPtr raw_deleter() const override { return wrapped_->raw_deleter(); }

 private:
  c10::Allocator* wrapped_;
};

void install_counting_allocator() {
  // Installed once and never destroyed: storages made through it keep pointing at it, also
  // during static destruction. Priority 1 outranks LibTorch's own registration (0).
  static const bool installed = [] {
    auto* counting = new CountingCpuAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(counting, /*priority=*/1);
    return true;
  }();
  (void)installed;
}

}  // namespace

AllocationCounter::AllocationCounter() : live_(std::make_shared<std::atomic<int64_t>>(0)) {
  install_counting_allocator();
}

int64_t AllocationCounter::counted_bytes_of(const torch::Tensor& tensor) const {
  if (!tensor.defined() || !tensor.has_storage()) return 0;
  const auto* allocation =
      tensor.storage().data_ptr().cast_context<CountedAllocation>(&delete_counted);
  if (allocation == nullptr || allocation->counter != live_) return 0;
  return allocation->bytes;
}

CountAllocations::CountAllocations(AllocationCounter& counter) : previous_(current_counter) {
  current_counter = &counter.live_;
}

CountAllocations::~CountAllocations() {
  current_counter = previous_;
}

}  // namespace pipetrain
