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
  const std::string directory = directory_of(path);
  // [1]
  std::string temporary = directory + "/." + base_name_of(path) + ".tmp-XXXXXX";
  std::vector<char> name(temporary.begin(), temporary.end());
  name.push_back('\0');
  int fd = ::mkstemp(name.data());
  if (fd < 0) fail_write(path, "creating a temporary file in '" + directory + "'", errno);
  temporary = name.data();
  auto abandon = [&](const std::string& step, int error) {
    ::close(fd);
    ::unlink(temporary.c_str());
    fail_write(path, step, error);
  };
  // mkstemp makes the file 0600; give it the mode a plain open(2) would (0666 less the umask), so
  // that what pipetrain writes (checkpoints, exported models) is readable as any file is.
  if (::fchmod(fd, 0666 & ~current_umask()) != 0) abandon("chmod of '" + temporary + "'", errno);
  // [2]
  for (std::string_view bytes : pieces) {
    size_t written = 0;
    while (written < bytes.size()) {
      ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
      if (n < 0) {
        if (errno == EINTR) continue;
        abandon("writing " + std::to_string(bytes.size()) + " bytes to '" + temporary + "'", errno);
      }
      written += static_cast<size_t>(n);
    }
  }
  // [3]
  if (::fsync(fd) != 0) abandon("fsync of '" + temporary + "'", errno);
  if (::close(fd) != 0) {
    int error = errno;
    ::unlink(temporary.c_str());
    fail_write(path, "closing '" + temporary + "'", error);
  }
  // [4]
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    int error = errno;
    ::unlink(temporary.c_str());
    fail_write(path, "renaming '" + temporary + "' over it", error);
  }
  // [5] Best effort on file systems that cannot fsync a directory (EINVAL): the data is safe.
  int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir_fd >= 0) {
    if (::fsync(dir_fd) != 0 && errno != EINVAL) {
      int error = errno;
      ::close(dir_fd);
      fail_write(path, "fsync of directory '" + directory + "'", error);
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
