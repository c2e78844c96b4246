// The buffers ZeRO reuses (pipetrain/train/buffer_pool.h).
#include "pipetrain/train/buffer_pool.h"

#include <sys/mman.h>

#include <torch/torch.h>

namespace pipetrain::train {
namespace {

// Below this a buffer comes from LibTorch's allocator; from it on, straight from the kernel.
constexpr int64_t kMappedBytes = int64_t{1} << 20;

// A host buffer of its own pages: freeing it returns them at once, and it never sits in (and
// splits) the heap the step's own tensors come from.
torch::Tensor mapped(int64_t elements, const torch::TensorOptions& options) {
  const size_t bytes =
      static_cast<size_t>(elements) * c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) return torch::empty({elements}, options);  // let LibTorch say why
  return torch::from_blob(
      data, {elements}, [bytes](void* p) { ::munmap(p, bytes); }, options);
}

bool pooled(const torch::Device& device, bool pinned) {
  return device.is_cpu() && !pinned;
}

}  // namespace

torch::Tensor BufferPool::take(int64_t elements, const torch::TensorOptions& options) {
  const torch::ScalarType dtype = c10::typeMetaToScalarType(options.dtype());
  const torch::Device device = options.device();
  if (!pooled(device, options.pinned_memory())) return torch::empty({elements}, options);
  const int64_t bytes = elements * static_cast<int64_t>(c10::elementSize(dtype));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Size& size = sizes_[Key{bytes, static_cast<int>(dtype), device.str()}];
    size.peak = std::max(size.peak, ++size.in_use);
    if (!size.spares.empty()) {
      torch::Tensor buffer = std::move(size.spares.back());
      size.spares.pop_back();
      return buffer;
    }
  }
  return bytes >= kMappedBytes ? mapped(elements, options) : torch::empty({elements}, options);
}

void BufferPool::give(const torch::Tensor& buffer, bool keep) {
  if (!buffer.defined() || !pooled(buffer.device(), buffer.is_pinned())) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found =
      sizes_.find(Key{static_cast<int64_t>(buffer.nbytes()), static_cast<int>(buffer.scalar_type()),
                      buffer.device().str()});
  if (found == sizes_.end()) return;
  Size& size = found->second;
  --size.in_use;
  // Only a buffer that is all of its storage, and nobody else's: a view would keep more alive.
  const bool whole = buffer.storage_offset() == 0 && buffer.is_contiguous() &&
                     buffer.storage().nbytes() == buffer.nbytes() &&
                     buffer.storage().use_count() == 1;
  if (keep && whole && std::get<0>(found->first) < kLargestSpareBytes &&
      static_cast<int>(size.spares.size()) + size.in_use < size.peak) {
    size.spares.push_back(buffer.detach().view({-1}));
  }
}

int64_t BufferPool::spare_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t bytes = 0;
  for (const auto& [key, size] : sizes_) {
    bytes += std::get<0>(key) * static_cast<int64_t>(size.spares.size());
  }
  return bytes;
}

}  // namespace pipetrain::train
