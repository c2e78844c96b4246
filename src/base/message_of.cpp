// message_of() (pipetrain/base/message_of.h).
#include "pipetrain/base/message_of.h"

#include <cstdlib>
#include <cstring>

#include <c10/util/Exception.h>

namespace pipetrain {

std::string message_of(const std::exception& error) {
  const char* show = std::getenv("TORCH_SHOW_CPP_STACKTRACES");
  if (show != nullptr && std::strcmp(show, "1") == 0) return error.what();
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) {
    return c10_error->what_without_backtrace();
  }
  return error.what();
}

}  // namespace pipetrain
