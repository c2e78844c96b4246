// DataError: a data set file is missing, unreadable or malformed.
//
// Thrown by every reader in pipetrain_examples (Fashion-MNIST, the text corpus). The message names
// the file and what is wrong with it. It is bad *input*, not a failure while running, so the CLI
// maps it to exit code 2 (apps/pipetrain/commands.h).
//
// Thread-safety: a plain exception value.
#pragma once

#include <stdexcept>
#include <string>

#include "pipetrain/base/error.h"

namespace pipetrain::examples {

class DataError : public pipetrain::BadInput {
 public:
  using pipetrain::BadInput::BadInput;
};

}  // namespace pipetrain::examples
