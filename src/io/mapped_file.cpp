// Read-only memory maps (io/mapped_file.h).
#include "pipetrain/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "pipetrain/base/error.h"

namespace pipetrain::io {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& step, int error) {
  throw FileError("cannot read '" + path + "': " + step + ": " + std::strerror(error));
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "open", errno);
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    fail(path, "stat", error);
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    throw FileError("cannot read '" + path + "': not a regular file");
  }
  size_ = static_cast<uint64_t>(info.st_size);
  if (size_ > 0) {
    void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      fail(path, "mmap of " + std::to_string(size_) + " bytes", error);
    }
    data_ = static_cast<const char*>(mapped);
  }
  ::close(fd);  // the mapping keeps the file open
}

MappedFile::~MappedFile() {
  unmap();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::release(uint64_t begin, uint64_t end) const {
  if (data_ == nullptr) return;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  end = std::min(end, size_);
  // Whole pages inside [begin, end) only: a page shared with bytes outside stays.
  const uint64_t first = (begin + page - 1) / page * page;
  const uint64_t last = end == size_ ? (end + page - 1) / page * page : end / page * page;
  if (last > first) {
    ::madvise(const_cast<char*>(data_) + first, static_cast<size_t>(last - first), MADV_DONTNEED);
  }
}

void MappedFile::unmap() {
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace pipetrain::io
