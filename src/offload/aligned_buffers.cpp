#include "pipetrain/offload/aligned_buffers.h"

#include <cstdlib>
#include <string>
#include <utility>

#include "pipetrain/base/error.h"

namespace pipetrain::offload {

BufferLease::BufferLease(BufferLease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      index_(std::exchange(other.index_, -1)),
      data_(std::exchange(other.data_, nullptr)) {}

BufferLease& BufferLease::operator=(BufferLease&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = std::exchange(other.pool_, nullptr);
    index_ = std::exchange(other.index_, -1);
    data_ = std::exchange(other.data_, nullptr);
  }
  return *this;
}

int64_t BufferLease::size() const {
  return pool_ ? pool_->buffer_bytes() : 0;
}

void BufferLease::release() {
  if (pool_) pool_->give_back(index_);
  pool_ = nullptr;
  index_ = -1;
  data_ = nullptr;
}

AlignedBuffers::AlignedBuffers(int64_t bytes, int count, int64_t alignment)
    : alignment_(alignment) {
  if (alignment < 1 || (alignment & (alignment - 1)) != 0) {
    throw BadInput("offload buffer alignment " + std::to_string(alignment) +
                   " is not a power of two");
  }
  if (bytes < 1) {
    throw BadInput("--offload-buffer-bytes " + std::to_string(bytes) + " must be at least 1");
  }
  if (count < 1) {
    throw BadInput("--offload-buffer-count " + std::to_string(count) + " must be at least 1");
  }
  bytes_ = align_up(bytes, alignment);
  buffers_.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    void* memory = std::aligned_alloc(static_cast<size_t>(alignment), static_cast<size_t>(bytes_));
    if (!memory) {
      for (char* b : buffers_) std::free(b);
      throw Error(ErrorKind::Runtime, "cannot allocate offload buffer " + std::to_string(i + 1) +
                                          " of " + std::to_string(count) + " (" +
                                          std::to_string(bytes_) + " bytes)");
    }
    buffers_.push_back(static_cast<char*>(memory));
    free_.push_back(count - 1 - i);  // handed out in order 0, 1, ...
  }
}

AlignedBuffers::~AlignedBuffers() {
  for (char* b : buffers_) std::free(b);
}

BufferLease AlignedBuffers::acquire() {
  std::unique_lock<std::mutex> lock(mutex_);
  returned_.wait(lock, [&] { return !free_.empty(); });
  return lend_locked();
}

std::optional<BufferLease> AlignedBuffers::try_acquire() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_.empty()) return std::nullopt;
  return lend_locked();
}

BufferLease AlignedBuffers::lend_locked() {
  const int index = free_.back();
  free_.pop_back();
  const int used = count() - static_cast<int>(free_.size());
  if (used > peak_) peak_ = used;
  return BufferLease(this, index, buffers_[static_cast<size_t>(index)]);
}

int AlignedBuffers::in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return count() - static_cast<int>(free_.size());
}

int AlignedBuffers::peak_in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

void AlignedBuffers::give_back(int index) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(index);
  }
  returned_.notify_one();
}

}  // namespace pipetrain::offload
