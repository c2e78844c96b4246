// Crash-safe file replacement (pipetrain/base/atomic_file.h).
#include "pipetrain/base/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

namespace pipetrain {
namespace {

[[noreturn]] void fail_write(const std::string& path, const std::string& step, int error) {
  throw FileError("cannot write '" + path + "': " + step + ": " + std::strerror(error));
}

std::string directory_of(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_name_of(const std::string& path) {
  auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The process's file mode creation mask, read without changing it (umask(2) can only set it).
mode_t current_umask() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Umask:", 0) == 0)
      return static_cast<mode_t>(std::stoul(line.substr(6), nullptr, 8));
  }
  return 022;
}

}  // namespace

void write_file_atomically(const std::string& path, std::string_view bytes) {
  write_file_atomically(path, std::vector<std::string_view>{bytes});
}

void write_file_atomically(const std::string& path, const std::vector<std::string_view>& pieces) {
  AtomicFileWriter file(path);
  for (std::string_view bytes : pieces) file.write(bytes.data(), bytes.size());
  file.commit();
}

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  const std::string directory = directory_of(path_);
  // [1]
  temporary_ = directory + "/." + base_name_of(path_) + ".tmp-XXXXXX";
  std::vector<char> name(temporary_.begin(), temporary_.end());
  name.push_back('\0');
  fd_ = ::mkstemp(name.data());
  if (fd_ < 0) fail_write(path_, "creating a temporary file in '" + directory + "'", errno);
  temporary_ = name.data();
  // mkstemp makes the file 0600; give it the mode a plain open(2) would (0666 less the umask), so
  // that what pipetrain writes (checkpoints, exported models) is readable as any file is.
  if (::fchmod(fd_, 0666 & ~current_umask()) != 0) abandon("chmod of '" + temporary_ + "'", errno);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temporary_.c_str());
  }
}

void AtomicFileWriter::abandon(const std::string& step, int error) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temporary_.c_str());
  fail_write(path_, step, error);
}

void AtomicFileWriter::write(const void* data, size_t size) {
  // [2]
  if (fd_ < 0) throw FileError("cannot write '" + path_ + "': written after commit or a failure");
  const char* bytes = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd_, bytes + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      abandon("writing " + std::to_string(size) + " bytes to '" + temporary_ + "'", errno);
    }
    done += static_cast<size_t>(n);
  }
  written_ += size;
  write_back();
}

void AtomicFileWriter::write_back() {
#ifdef __linux__
  // Writeback begins as the bytes come instead of at [3]: each whole window is handed to the disk
  // at once (asynchronous), and the window before it is waited for and dropped from the page
  // cache, so the disk writes while the caller produces the next bytes, and the file's dirty pages
  // stay within two windows. Advice only: a file system that refuses it is written as before, and
  // [3]'s fsync is what makes the file durable either way.
  while (written_ - started_ >= kWriteBackWindow) {
    const uint64_t begin = started_;
    started_ += kWriteBackWindow;
    ::sync_file_range(fd_, static_cast<off64_t>(begin), kWriteBackWindow, SYNC_FILE_RANGE_WRITE);
    if (begin >= kWriteBackWindow) {
      const uint64_t previous = begin - kWriteBackWindow;
      ::sync_file_range(
          fd_, static_cast<off64_t>(previous), kWriteBackWindow,
          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
      ::posix_fadvise(fd_, static_cast<off_t>(previous), kWriteBackWindow, POSIX_FADV_DONTNEED);
    }
  }
#endif
}

void AtomicFileWriter::commit() {
  if (fd_ < 0) throw FileError("cannot write '" + path_ + "': committed twice or after a failure");
  // [3]
  if (::fsync(fd_) != 0) abandon("fsync of '" + temporary_ + "'", errno);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(temporary_.c_str());
    fail_write(path_, "closing '" + temporary_ + "'", error);
  }
  // [4]
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary_.c_str());
    fail_write(path_, "renaming '" + temporary_ + "' over it", error);
  }
  // [5] Best effort on file systems that cannot fsync a directory (EINVAL): the data is safe.
  const std::string directory = directory_of(path_);
  const int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir_fd >= 0) {
    if (::fsync(dir_fd) != 0 && errno != EINVAL) {
      const int error = errno;
      ::close(dir_fd);
      fail_write(path_, "fsync of directory '" + directory + "'", error);
    }
    ::close(dir_fd);
  }
}

void check_writable(const std::string& path, bool directory) {
  std::error_code error;
  std::string where = directory ? path : directory_of(path);
  if (directory) {
    std::filesystem::create_directories(path, error);
    if (error) fail_write(path, "cannot create the directory", error.value());
  } else {
    if (!std::filesystem::is_directory(where, error)) {
      throw FileError("cannot write '" + path + "': its directory '" + where + "' does not exist");
    }
    if (std::filesystem::is_directory(path, error)) {
      throw FileError("cannot write '" + path + "': it is a directory; give a file name");
    }
  }
  std::string probe = where + "/.pipetrain-write-check-XXXXXX";
  std::vector<char> name(probe.begin(), probe.end());
  name.push_back('\0');
  const int fd = ::mkstemp(name.data());
  if (fd < 0) fail_write(path, "creating a file in '" + where + "'", errno);
  ::close(fd);
  ::unlink(name.data());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FileError("cannot read '" + path + "': " + std::strerror(errno));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw FileError("cannot read '" + path + "': read error");
  return buffer.str();
}

}  // namespace pipetrain
