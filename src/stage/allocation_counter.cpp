// The counting wrapper around LibTorch's CPU allocator
// (include/pipetrain/stage/allocation_counter.h).
//
//   allocate(n) on thread T
//     [1] no guard active on T (or n == 0): the wrapped allocator's DataPtr, as is
//     [2] guard active: the wrapped allocator allocates kHeader + n bytes; the header at the
//         start holds the original DataPtr, n and a share of the counter; counter += n; the
//         tensor gets DataPtr{start + kHeader, context = header, deleter = delete_counted}
//   delete_counted(header), on any thread
//     [3] counter -= n; destroying the original DataPtr frees the whole block
//
// Why the header lives in the block rather than in a small object of its own: small heap
// objects interleaved with the large activation blocks changed how glibc reuses and trims the
// heap and made the next backward measurably slower (bench_stage_cost, B: +4%); inside the block
// the heap sees one allocation per tensor, as without counting.
#include "pipetrain/stage/allocation_counter.h"

#include <new>
#include <utility>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace pipetrain {
namespace {

using Counter = std::shared_ptr<std::atomic<int64_t>>;

// The counter of this thread's active CountAllocations guard; null when none.
thread_local const Counter* current_counter = nullptr;

struct CountedHeader {
  c10::DataPtr original;
  int64_t bytes;
  Counter counter;
};

// A multiple of the CPU allocator's alignment (64), so the tensor's data stays as aligned as the
// block's start.
constexpr size_t kHeader = 64;
static_assert(sizeof(CountedHeader) <= kHeader, "the header must fit in front of the data");

void delete_counted(void* context) {
  auto* header = static_cast<CountedHeader*>(context);
  header->counter->fetch_sub(header->bytes, std::memory_order_relaxed);  // [3]
  c10::DataPtr block = std::move(header->original);
  header->~CountedHeader();
}  // `block` frees the memory here

class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* wrapped) : wrapped_(wrapped) {}

  c10::DataPtr allocate(size_t n) const override {
    const Counter* counter = current_counter;
    if (counter == nullptr || n == 0) return wrapped_->allocate(n);  // [1]
    c10::DataPtr block = wrapped_->allocate(kHeader + n);            // [2]
    auto* start = static_cast<char*>(block.get());
    const c10::Device device = block.device();
    const auto bytes = static_cast<int64_t>(n);
    auto* header = new (start) CountedHeader{std::move(block), bytes, *counter};
    header->counter->fetch_add(bytes, std::memory_order_relaxed);
    return c10::DataPtr(start + kHeader, header, &delete_counted, device);
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
  const auto* header = tensor.storage().data_ptr().cast_context<CountedHeader>(&delete_counted);
  if (header == nullptr || header->counter != live_) return 0;
  return header->bytes;
}

CountAllocations::CountAllocations(AllocationCounter& counter) : previous_(current_counter) {
  current_counter = &counter.live_;
}

CountAllocations::~CountAllocations() {
  current_counter = previous_;
}

}  // namespace pipetrain
