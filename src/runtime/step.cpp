// Checkpoint policy names (include/pipetrain/runtime/step.h).
#include "pipetrain/runtime/step.h"

#include <c10/util/Exception.h>

#include "pipetrain/base/check.h"

namespace pipetrain {

std::string to_string(Checkpoint mode) {
  switch (mode) {
    case Checkpoint::kAlways:
      return "always";
    case Checkpoint::kExceptLast:
      return "except_last";
    case Checkpoint::kNever:
      return "never";
  }
  return "unknown";
}

Checkpoint parse_checkpoint(const std::string& text) {
  if (text == "always") return Checkpoint::kAlways;
  if (text == "except_last") return Checkpoint::kExceptLast;
  if (text == "never") return Checkpoint::kNever;
  throw BadInput(
      c10::str("unknown checkpoint mode '", text, "'; valid modes: always, except_last, never"));
}

bool is_checkpointed(Checkpoint mode, int i, int microbatches) {
  switch (mode) {
    case Checkpoint::kAlways:
      return true;
    case Checkpoint::kExceptLast:
      return i < microbatches - 1;
    case Checkpoint::kNever:
      return false;
  }
  return false;
}

}  // namespace pipetrain
