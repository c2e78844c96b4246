// CUDA implementation of the device seam (include/pipetrain/stage/device.h). Built only against
// a CUDA LibTorch (CMake drops *_cuda.cpp otherwise).
//
// One stream per rank: rank_stream takes a pooled stream for the rank's device once per process,
// and RankStreamGuard makes it current for the worker thread each step. Transfers between ranks:
// the sender records an event on its stream (mark_ready), the receiver makes its stream wait on it
// (wait_ready) before copying, so non_blocking copies never read a tensor that is still being
// written.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "pipetrain/base/check.h"
#include "pipetrain/stage/allocation_counter.h"
#include "pipetrain/stage/device.h"
#include "wall_seconds.h"

namespace pipetrain {

void check_device_usable(const torch::Device& device) {
  if (device.is_cpu()) return;
  PIPETRAIN_CHECK_INPUT(device.is_cuda(), "device ", device.str(),
                        " is not supported; use torch::kCPU or a CUDA device");
  const int count = static_cast<int>(c10::cuda::device_count());
  PIPETRAIN_CHECK_INPUT(device.has_index() && device.index() < count, "device ", device.str(),
                        " is not usable: ", count,
                        " CUDA devices are visible; give an explicit index below ", count);
}

std::string device_name(const torch::Device& device) {
  if (!device.is_cuda()) return "cpu";
  check_device_usable(device);
  return at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index())->name;
}

int cuda_device_count() {
  return static_cast<int>(c10::cuda::device_count());
}

RankStream rank_stream(const torch::Device& device, int rank) {
  check_device_usable(device);
  if (!device.is_cuda()) return {};
  static std::mutex mutex;
  static std::map<std::pair<c10::DeviceIndex, int>, std::shared_ptr<c10::cuda::CUDAStream>> streams;
  std::lock_guard<std::mutex> lock(mutex);
  auto& stream = streams[{device.index(), rank}];
  if (!stream) {
    stream = std::make_shared<c10::cuda::CUDAStream>(
        c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index()));
  }
  return {stream};
}

RankStreamGuard::RankStreamGuard(const RankStream& stream) {
  if (!stream.stream) return;
  impl_ = std::make_shared<c10::cuda::CUDAStreamGuard>(
      *static_cast<const c10::cuda::CUDAStream*>(stream.stream.get()));
}
RankStreamGuard::~RankStreamGuard() = default;

ReadyMarker mark_ready(const torch::Device& device) {
  if (!device.is_cuda()) return {};
  auto event = std::make_shared<at::cuda::CUDAEvent>();
  event->record(c10::cuda::getCurrentCUDAStream(device.index()));
  return {event};
}

void wait_ready(const ReadyMarker& marker, const torch::Device& device) {
  if (!marker.event) return;
  auto* event = static_cast<at::cuda::CUDAEvent*>(marker.event.get());
  if (device.is_cuda()) {
    event->block(c10::cuda::getCurrentCUDAStream(device.index()));
  } else {
    event->synchronize();  // a CPU consumer of a CUDA producer waits on the host
  }
}

namespace {

// One copy stream per device for activation offload, taken from the pool on first use: copies to
// and from the host run there, beside the ranks' compute streams.
c10::cuda::CUDAStream copy_stream(c10::DeviceIndex index) {
  static std::mutex mutex;
  static std::map<c10::DeviceIndex, c10::cuda::CUDAStream> streams;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = streams.find(index);
  if (found == streams.end()) {
    found = streams.emplace(index, c10::cuda::getStreamFromPool(false, index)).first;
  }
  return found->second;
}

}  // namespace

HostCopies copy_to_host(const std::vector<torch::Tensor>& tensors, const torch::Device& device) {
  if (!device.is_cuda()) return HostCopies{tensors, false};
  const c10::DeviceIndex index = device.index();
  const c10::cuda::CUDAStream stream = copy_stream(index);
  // The copies start after what the caller queued (the forward that read the tensors).
  at::cuda::CUDAEvent queued;
  queued.record(c10::cuda::getCurrentCUDAStream(index));
  queued.block(stream);
  HostCopies copies;
  copies.moved = true;
  const c10::cuda::CUDAStreamGuard guard(stream);
  for (const auto& t : tensors) {
    if (!t.defined()) {
      copies.tensors.push_back(t);
      continue;
    }
    torch::Tensor host =
        torch::empty(t.sizes(), torch::TensorOptions().dtype(t.scalar_type()).pinned_memory(true));
    host.copy_(t.detach(), /*non_blocking=*/true);
    // The device memory goes back to the allocator when the stage drops t; it is not handed out
    // again before the copy stream's work so far is done.
    c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream);
    copies.tensors.push_back(std::move(host));
  }
  return copies;
}

std::vector<torch::Tensor> copy_to_device(const HostCopies& copies, const torch::Device& device,
                                          ReadyMarker& ready) {
  if (!copies.moved || !device.is_cuda()) {
    ready = ReadyMarker{};
    return copies.tensors;
  }
  const c10::DeviceIndex index = device.index();
  const c10::cuda::CUDAStream consumer = c10::cuda::getCurrentCUDAStream(index);
  const c10::cuda::CUDAStream stream = copy_stream(index);
  std::vector<torch::Tensor> out;
  {
    const c10::cuda::CUDAStreamGuard guard(stream);
    for (const auto& host : copies.tensors) {
      if (!host.defined()) {
        out.push_back(host);
        continue;
      }
      torch::Tensor on_device = host.to(device, /*non_blocking=*/true);
      // Allocated on the copy stream, read and freed on the consumer's.
      c10::cuda::CUDACachingAllocator::recordStream(on_device.storage().data_ptr(), consumer);
      out.push_back(std::move(on_device));
    }
    ready = mark_ready(device);  // the copy stream is current here
  }
  return out;
}

void record_use_on_current_stream(const torch::Tensor& tensor) {
  if (!tensor.defined() || !tensor.is_cuda() || !tensor.storage().data_ptr()) return;
  c10::cuda::CUDACachingAllocator::recordStream(
      tensor.storage().data_ptr(), c10::cuda::getCurrentCUDAStream(tensor.device().index()));
}

int64_t device_peak_allocated_bytes(const torch::Device& device) {
  if (!device.is_cuda()) return 0;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .peak;
}

void reset_device_peak_allocated_bytes(const torch::Device& device) {
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
}

int64_t device_allocated_bytes(const torch::Device& device) {
  if (!device.is_cuda()) return 0;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .current;
}

namespace {

using Counter = std::shared_ptr<std::atomic<int64_t>>;

// The CUDA blocks counted by some AllocationCounter, by address, and the table's lock. The trace
// callback runs with the caching allocator's per-device lock held; it takes only this one and
// calls nothing of torch, so the two locks are always taken in the same order.
struct CountedBlocks {
  std::mutex mutex;
  std::unordered_map<size_t, std::pair<Counter, int64_t>> blocks;
};

CountedBlocks& counted_blocks() {
  static auto* table = new CountedBlocks();  // never destroyed: frees may come at exit
  return *table;
}

void on_trace(const c10::cuda::CUDACachingAllocator::TraceEntry& entry) {
  using Action = c10::cuda::CUDACachingAllocator::TraceEntry::Action;
  if (entry.action_ == Action::ALLOC) {
    const Counter* counter = active_allocation_counter();
    if (counter == nullptr) return;
    const auto bytes = static_cast<int64_t>(entry.size_);
    (*counter)->fetch_add(bytes, std::memory_order_relaxed);
    CountedBlocks& table = counted_blocks();
    std::lock_guard<std::mutex> lock(table.mutex);
    table.blocks[entry.addr_] = {*counter, bytes};
  } else if (entry.action_ == Action::FREE_REQUESTED) {
    CountedBlocks& table = counted_blocks();
    std::lock_guard<std::mutex> lock(table.mutex);
    const auto found = table.blocks.find(entry.addr_);
    if (found == table.blocks.end()) return;
    found->second.first->fetch_sub(found->second.second, std::memory_order_relaxed);
    table.blocks.erase(found);
  }
}

}  // namespace

bool count_device_allocations(const torch::Device& device) {
  if (!device.is_cuda()) return false;
  static const bool counting = [&] {
    // The allocator attaches a callback to the devices it has set up, so set them up first.
    (void)at::empty({1}, at::TensorOptions().device(device));
    try {
      c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker(&on_trace);
    } catch (const c10::Error&) {
      return false;  // a backend without trace callbacks (cudaMallocAsync)
    }
    return true;
  }();
  return counting;
}

int64_t device_counted_bytes(const void* data, const Counter& counter) {
  CountedBlocks& table = counted_blocks();
  std::lock_guard<std::mutex> lock(table.mutex);
  const auto found = table.blocks.find(reinterpret_cast<size_t>(data));
  if (found == table.blocks.end() || found->second.first != counter) return 0;
  return found->second.second;
}

double time_on_device(const torch::Device& device, int calls, const std::function<void()>& body) {
  PIPETRAIN_CHECK_INPUT(calls >= 1, "time_on_device: calls must be >= 1, got ", calls);
  if (!device.is_cuda()) return wall_seconds(calls, body);
  check_device_usable(device);
  const c10::cuda::CUDAGuard on_device(device.index());
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device.index());
  c10::cuda::CUDAEvent start(cudaEventDefault);  // timing enabled (the default disables it)
  c10::cuda::CUDAEvent end(cudaEventDefault);
  start.record(stream);
  for (int c = 0; c < calls; ++c) body();
  end.record(stream);
  end.synchronize();
  return static_cast<double>(start.elapsed_time(end)) / 1e3;
}

torch::Tensor device_rng_state(const torch::Device& device) {
  if (!device.is_cuda()) return {};
  auto generator = at::cuda::detail::getDefaultCUDAGenerator(device.index());
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_device_rng_state(const torch::Device& device, const torch::Tensor& state) {
  if (!device.is_cuda() || !state.defined()) return;
  auto generator = at::cuda::detail::getDefaultCUDAGenerator(device.index());
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

}  // namespace pipetrain
