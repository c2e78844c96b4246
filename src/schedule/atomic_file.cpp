// write_file_atomically(): temporary file + rename.
#include "pipetrain/schedule/atomic_file.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace pipetrain::schedule {

void write_file_atomically(const std::string& path, const std::string& content) {
  static std::atomic<unsigned> counter{0};
  const std::string temporary =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw std::runtime_error("cannot write '" + temporary + "' (for '" + path +
                               "'): " + std::strerror(errno) +
                               "; check that the directory exists and is writable");
    }
    out << content;
    out.flush();
    if (!out) {
      std::remove(temporary.c_str());
      throw std::runtime_error("failed writing '" + temporary + "': " + std::strerror(errno));
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temporary.c_str());
    throw std::runtime_error("cannot rename '" + temporary + "' to '" + path + "': " + reason);
  }
}

}  // namespace pipetrain::schedule
