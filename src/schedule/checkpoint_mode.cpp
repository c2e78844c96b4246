// Checkpoint policy names (include/pipetrain/schedule/checkpoint_mode.h).
#include "pipetrain/schedule/checkpoint_mode.h"

#include "pipetrain/base/error.h"

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

Checkpoint parse_checkpoint(std::string_view text) {
  for (Checkpoint mode : all_checkpoint_modes()) {
    if (to_string(mode) == text) return mode;
  }
  throw BadInput("unknown checkpoint mode '" + std::string(text) +
                 "'; valid modes: always, except_last, never");
}

const std::vector<Checkpoint>& all_checkpoint_modes() {
  static const std::vector<Checkpoint> modes = {Checkpoint::kNever, Checkpoint::kExceptLast,
                                                Checkpoint::kAlways};
  return modes;
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
