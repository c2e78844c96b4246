// MappedFile: a whole file mapped read-only into memory (mmap), for readers that look at a few
// parts of a large file (the tensors of one stage in a safetensors shard, the samples of one
// mini-batch in a token file) without reading the rest. Pages are read from disk when touched and
// can be dropped again by the kernel; nothing is copied until the caller copies.
//
// Ownership: owns the mapping; move-only; unmapped by the destructor. An empty file maps to
// data() == nullptr, size() == 0. Thread-safety: the bytes are read-only, so concurrent readers
// are safe.
//
// Torch-free.
#pragma once

#include <cstdint>
#include <string>

namespace pipetrain::io {

class MappedFile {
 public:
  // Throws pipetrain::FileError naming `path` when it cannot be opened, is not a regular file or
  // cannot be mapped.
  explicit MappedFile(const std::string& path);
  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Drops the pages wholly inside bytes [begin, end) from this process's memory (madvise
  // MADV_DONTNEED; the file's bytes are unchanged and read again from the page cache or disk when
  // next touched): a reader that has copied a part out keeps its resident size to what it holds.
  void release(uint64_t begin, uint64_t end) const;

 private:
  void unmap();

  std::string path_;
  const char* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace pipetrain::io
