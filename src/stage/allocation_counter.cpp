// The counting wrapper around LibTorch's CPU allocator
// (include/pipetrain/stage/allocation_counter.h).
//
//   allocate(n) on thread T
//     [1] the wrapped allocator allocates: DataPtr{data, context, deleter}
//     [2] no guard active on T: return it as is (freed as if we were not here)
//     [3] guard active: counter += n; record data -> CountedAllocation (owning the original
//         DataPtr and a share of the counter) in a table; return DataPtr{data, data,
//         delete_counted}: context == data, as Allocator::raw_allocate requires (CPU convolutions
//         allocate their workspaces that way, inside a stage's forward)
//   delete_counted(data), on any thread; also raw_deleter() for raw_deallocate
//     [4] counted: counter -= n; destroying the original DataPtr frees the memory through its own
//         deleter. Not in the table: an uncounted raw allocation, freed by the wrapped deleter.
//
// Why the CountedAllocations come from a pool of their own: as small heap objects interleaved
// with the large activation blocks they changed how glibc reuses and trims the heap, and the
// next backward got measurably slower (bench_stage_cost B: +4..7%); so did growing each block by
// a header in front of the data. The pointer table's nodes come from slabs of their own too.
#include "pipetrain/stage/allocation_counter.h"

#include <cstdint>
#include <mutex>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include "pipetrain/stage/device.h"

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

// Fixed-size slots from slabs that are never returned to the heap, taken and given back from any
// thread (the pools live as long as the process: a deleter may run during static destruction).
class SlabPool {
 public:
  explicit SlabPool(size_t slot_bytes) : slot_bytes_(slot_bytes) {}
  void* take() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.empty()) {
      constexpr size_t kSlots = 256;
      auto* slab = static_cast<char*>(::operator new(kSlots* slot_bytes_));
      free_.reserve(free_.size() + kSlots);
      for (size_t s = 0; s < kSlots; ++s) free_.push_back(slab + s * slot_bytes_);
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
  const size_t slot_bytes_;
  std::mutex mutex_;
  std::vector<void*> free_;  // guarded by mutex_
};

// The slots of type T.
template <typename T>
SlabPool& pool_of() {
  static auto* instance = new SlabPool(sizeof(T));
  return *instance;
}

// Single objects (the table's nodes) from pool_of<T>(); arrays (the bucket array, rare after
// reserve) from the heap.
template <typename T>
struct SlabAllocator {
  using value_type = T;
  SlabAllocator() = default;
  template <typename U>
  SlabAllocator(const SlabAllocator<U>&) {}
  T* allocate(size_t n) {
    if (n != 1) return static_cast<T*>(::operator new(n * sizeof(T)));
    return static_cast<T*>(pool_of<T>().take());
  }
  void deallocate(T* p, size_t n) {
    if (n != 1) {
      ::operator delete(p);
      return;
    }
    pool_of<T>().give_back(p);
  }
  template <typename U>
  bool operator==(const SlabAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const SlabAllocator<U>&) const {
    return false;
  }
};

// data pointer -> its CountedAllocation.
class CountedTable {
 public:
  CountedTable() { records_.reserve(4096); }
  void insert(void* data, CountedAllocation* allocation) {
    std::lock_guard<std::mutex> lock(mutex_);
    records_[data] = allocation;
  }
  // Removes and returns the record of `data`; null when it was not counted.
  CountedAllocation* take(void* data) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = records_.find(data);
    if (found == records_.end()) return nullptr;
    CountedAllocation* allocation = found->second;
    records_.erase(found);
    return allocation;
  }
  CountedAllocation* find(void* data) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = records_.find(data);
    return found == records_.end() ? nullptr : found->second;
  }

 private:
  std::mutex mutex_;
  using Entry = std::pair<void* const, CountedAllocation*>;
  std::unordered_map<void*, CountedAllocation*, std::hash<void*>, std::equal_to<void*>,
                     SlabAllocator<Entry>>
      records_;  // guarded by mutex_
};

CountedTable& table() {
  static auto* instance = new CountedTable();
  return *instance;
}

c10::DeleterFnPtr wrapped_raw_deleter = nullptr;  // set once, before any counted allocation

void delete_counted(void* data) {
  CountedAllocation* allocation = table().take(data);
  if (allocation == nullptr) {  // an uncounted raw allocation (raw_deleter() serves both)
    if (wrapped_raw_deleter != nullptr) wrapped_raw_deleter(data);
    return;
  }
  allocation->counter->fetch_sub(allocation->bytes, std::memory_order_relaxed);  // [4]
  allocation->~CountedAllocation();
  pool_of<CountedAllocation>().give_back(allocation);
}

class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* wrapped) : wrapped_(wrapped) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr original = wrapped_->allocate(n);  // [1]
    const Counter* counter = current_counter;
    if (counter == nullptr || original.get() == nullptr) return original;  // [2]
    void* data = original.get();
    const c10::Device device = original.device();
    const auto bytes = static_cast<int64_t>(n);
    auto* allocation = new (pool_of<CountedAllocation>().take())
        CountedAllocation{std::move(original), bytes, *counter};
    allocation->counter->fetch_add(bytes, std::memory_order_relaxed);  // [3]
    table().insert(data, allocation);
    return c10::DataPtr(data, data, &delete_counted, device);
  }

  // raw_deallocate(ptr) of a raw_allocate()d block: counted or not, delete_counted finds out.
  // REQUIRES (as LibTorch's own): the wrapped allocator's raw allocations have context == data.
  c10::DeleterFnPtr raw_deleter() const override { return &delete_counted; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  c10::Allocator* wrapped_;
};

void install_counting_allocator() {
  // Installed once and never destroyed: storages made through it keep pointing at it, also
  // during static destruction. Priority 1 outranks LibTorch's own registration (0).
  static const bool installed = [] {
    c10::Allocator* wrapped = c10::GetCPUAllocator();
    wrapped_raw_deleter = wrapped->raw_deleter();
    auto* counting = new CountingCpuAllocator(wrapped);
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
  const c10::DataPtr& data = tensor.storage().data_ptr();
  if (data.device().is_cuda()) return device_counted_bytes(data.get(), live_);
  if (data.get_deleter() != &delete_counted) return 0;
  const CountedAllocation* allocation = table().find(data.get());
  if (allocation == nullptr || allocation->counter != live_) return 0;
  return allocation->bytes;
}

const Counter* active_allocation_counter() {
  return current_counter;
}

CountAllocations::CountAllocations(AllocationCounter& counter) : previous_(current_counter) {
  current_counter = &counter.live_;
}

CountAllocations::~CountAllocations() {
  current_counter = previous_;
}

}  // namespace pipetrain
