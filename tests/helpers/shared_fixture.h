// A directory of test inputs made once per build directory and shared by the test processes that
// need it (ctest runs each test in a process of its own, so a fixture made in SetUpTestSuite would
// otherwise be made again by every test of the suite).
//
//   shared_fixture("train-cli", stamp, [](const std::string& partial) { ...fill partial... })
//
// returns PIPETRAIN_BINARY_DIR/test-fixtures/<name>. The first process to ask makes it under a
// file lock, in a temporary directory renamed into place; the others wait for the lock and reuse
// it. `stamp` (a script's mtime, the commands that made it) is kept in the directory: another stamp
// makes it again. `make` throws to fail; nothing half-made is ever reused.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>

namespace pipetrain::testing {

inline std::string shared_fixture(const std::string& name, const std::string& stamp,
                                  const std::function<void(const std::string& partial)>& make) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(PIPETRAIN_BINARY_DIR) / "test-fixtures";
  fs::create_directories(root);
  const fs::path done = root / name;
  const int lock = ::open((root / (name + ".lock")).c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock < 0 || ::flock(lock, LOCK_EX) != 0) {
    throw std::runtime_error("cannot lock the test fixture " + name);
  }
  try {
    const fs::path stamp_file = done / "stamp";
    std::string found;
    if (fs::exists(stamp_file)) std::getline(std::ifstream(stamp_file), found);
    if (found != stamp) {
      const fs::path partial = root / (name + ".partial-" + std::to_string(::getpid()));
      fs::remove_all(partial);
      fs::create_directories(partial);
      make(partial.string());
      std::ofstream(partial / "stamp") << stamp << "\n";
      fs::remove_all(done);
      fs::rename(partial, done);
    }
  } catch (...) {
    ::close(lock);
    throw;
  }
  ::close(lock);  // releases the lock
  return done.string();
}

}  // namespace pipetrain::testing
