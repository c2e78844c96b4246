// The project's Python: the interpreter of the venv with the pinned torch that scripts/bootstrap
// installs (CMake's PIPETRAIN_PYTHON, compiled in). Interoperability tests run it; they skip, with
// a message naming the interpreter, only when it cannot import torch.
#pragma once

#include <cstdlib>
#include <string>

namespace pipetrain::testing {

inline const std::string kPython = PIPETRAIN_PYTHON;

// True when kPython imports torch (checked once per test binary).
inline bool python_has_torch() {
  static const bool has_torch =
      std::system((kPython + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
  return has_torch;
}

inline std::string no_python_torch_message() {
  return kPython + " cannot import torch; run scripts/bootstrap";
}

}  // namespace pipetrain::testing
