// The project's Python: the interpreter of the venv with the pinned torch that scripts/bootstrap
// installs (CMake's PIPETRAIN_PYTHON, compiled in). Interoperability tests run it; they skip, with
// a message naming the interpreter, only when it cannot import torch.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <system_error>

namespace pipetrain::testing {

inline const std::string kPython = PIPETRAIN_PYTHON;

// True when kPython imports `modules` (comma-separated). Checked once per build directory: a
// success is remembered in test-fixtures/ (ctest runs each test in a process of its own, and
// importing torch takes seconds), keyed by the interpreter, the modules and the mtime of the venv's
// pyvenv.cfg (a venv made again is checked again); a failure is checked again by every process.
inline bool python_imports(const std::string& modules) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path venv_config = fs::path(kPython).parent_path().parent_path() / "pyvenv.cfg";
  const auto made = fs::last_write_time(venv_config, error);
  const std::string key =
      kPython + " " + modules + " " +
      (error ? std::string("?") : std::to_string(made.time_since_epoch().count()));
  const fs::path remembered = fs::path(PIPETRAIN_BINARY_DIR) / "test-fixtures" /
                              ("python-imports-" + std::to_string(std::hash<std::string>()(key)));
  std::string found;
  if (fs::exists(remembered)) std::getline(std::ifstream(remembered), found);
  if (found == key) return true;
  if (std::system((kPython + " -c 'import " + modules + "' >/dev/null 2>&1").c_str()) != 0) {
    return false;
  }
  fs::create_directories(remembered.parent_path(), error);
  const fs::path partial = remembered.string() + ".partial-" + std::to_string(::getpid());
  std::ofstream(partial) << key << "\n";
  fs::rename(partial, remembered, error);
  return true;
}

// True when kPython imports torch (checked once per build directory: python_imports).
inline bool python_has_torch() {
  static const bool has_torch = python_imports("torch");
  return has_torch;
}

inline std::string no_python_torch_message() {
  return kPython + " cannot import torch; run scripts/bootstrap";
}

}  // namespace pipetrain::testing
