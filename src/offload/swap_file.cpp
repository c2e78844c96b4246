#include "pipetrain/offload/swap_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "pipetrain/base/error.h"
#include "pipetrain/offload/aligned_buffers.h"

namespace pipetrain::offload {

SwapFile::SwapFile(const std::string& directory, const std::string& name,
                   std::shared_ptr<FileIo> io, int64_t alignment, bool direct)
    : path_(directory + "/" + name), io_(std::move(io)), alignment_(alignment) {
  if (alignment < 1 || (alignment & (alignment - 1)) != 0) {
    throw BadInput("offload file alignment " + std::to_string(alignment) +
                   " is not a power of two");
  }
  constexpr int kFlags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  if (direct) {
    fd_ = ::open(path_.c_str(), kFlags | O_DIRECT, 0600);
    direct_ = fd_ >= 0;
  }
  if (!direct || (fd_ < 0 && errno == EINVAL)) {  // asked so, or no O_DIRECT here
    fd_ = ::open(path_.c_str(), kFlags, 0600);
  }
  if (fd_ < 0) {
    throw FileError("cannot create offload file '" + path_ + "': " + std::strerror(errno) +
                    " (--offload-dir must name a directory this process can write)");
  }
  ::unlink(path_.c_str());  // the space lives as long as the descriptor (header comment)
}

SwapFile::~SwapFile() {
  if (fd_ >= 0) ::close(fd_);
}

int64_t SwapFile::reserve(int64_t bytes) {
  if (bytes < 0) throw Error(ErrorKind::Runtime, "SwapFile::reserve of a negative size");
  const int64_t offset = size_;
  const int64_t length = align_up(bytes, alignment_);
  if (length == 0) return offset;
  int rc = ::fallocate(fd_, 0, static_cast<off_t>(offset), static_cast<off_t>(length));
  if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
    rc = ::ftruncate(fd_, static_cast<off_t>(offset + length));
  }
  if (rc != 0) {
    throw FileError("cannot reserve " + std::to_string(length) + " bytes in offload file '" +
                    path_ + "' (" + std::to_string(offset) +
                    " reserved before): " + std::strerror(errno));
  }
  size_ = offset + length;
  return offset;
}

int64_t SwapFile::checked_length(int64_t offset, const void* data, int64_t bytes,
                                 const char* what) const {
  const int64_t length = direct_ ? align_up(bytes, alignment_) : bytes;
  const auto fail = [&](const std::string& why) {
    throw Error(ErrorKind::Runtime, std::string("SwapFile::") + what + " of '" + path_ +
                                        "' at offset " + std::to_string(offset) + " (" +
                                        std::to_string(bytes) + " bytes): " + why);
  };
  if (offset < 0 || bytes < 0 || offset + length > size_) {
    fail("outside the " + std::to_string(size_) + " bytes reserved");
  }
  if (direct_ && (offset % alignment_ != 0 ||
                  reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(alignment_) != 0)) {
    fail("memory or offset not aligned to " + std::to_string(alignment_) + " under O_DIRECT");
  }
  return length;
}

IoTicket SwapFile::write(int64_t offset, const void* data, int64_t bytes) {
  const int64_t length = checked_length(offset, data, bytes, "write");
  return io_->write(fd_, offset, data, length, path_);
}

IoTicket SwapFile::read(int64_t offset, void* data, int64_t bytes) {
  const int64_t length = checked_length(offset, data, bytes, "read");
  return io_->read(fd_, offset, data, length, path_);
}

}  // namespace pipetrain::offload
