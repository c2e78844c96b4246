// message_of() (pipetrain/base/message_of.h).
#include "pipetrain/base/message_of.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include <c10/util/Exception.h>

namespace pipetrain {

namespace {

// A TorchScript error's message is the interpreter's traceback (serialized and original code)
// ending in the Python-style exception line; a person needs that last line only.
std::string without_torchscript_traceback(const std::string& message) {
  if (message.find("Traceback of TorchScript") == std::string::npos) return message;
  std::string last;
  std::size_t start = 0;
  while (start < message.size()) {
    std::size_t end = message.find('\n', start);
    if (end == std::string::npos) end = message.size();
    const std::string line = message.substr(start, end - start);
    if (line.find_first_not_of(" \t") != std::string::npos) last = line;
    start = end + 1;
  }
  for (const char* prefix : {"RuntimeError: ", "ValueError: ", "TypeError: ", "IndexError: "}) {
    if (last.rfind(prefix, 0) == 0) return last.substr(std::strlen(prefix));
  }
  return last;
}

}  // namespace

std::string message_of(const std::exception& error) {
  const char* show = std::getenv("TORCH_SHOW_CPP_STACKTRACES");
  if (show != nullptr && std::strcmp(show, "1") == 0) return error.what();
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) {
    return without_torchscript_traceback(c10_error->what_without_backtrace());
  }
  return without_torchscript_traceback(error.what());
}

}  // namespace pipetrain
