// check_finite_loss: stop a diverged run with an error that names the step.
//
// Thread-safety: pure.
#pragma once

#include <cstdint>
#include <stdexcept>

#include "pipetrain/base/error.h"

namespace pipetrain::train {

// Training diverged: a failure while running (CLI exit code 1), not bad input.
class NonFiniteLossError : public Error {
 public:
  NonFiniteLossError(const std::string& message, int64_t step)
      : Error(ErrorKind::Runtime, message), step_(step) {}
  int64_t step() const { return step_; }

 private:
  int64_t step_;
};

// Throws NonFiniteLossError("loss is nan at step 12 (epoch 0, batch 12); ...") when `loss` is NaN
// or infinite. epoch/batch < 0 leaves them out of the message.
void check_finite_loss(double loss, int64_t step, int64_t epoch = -1, int64_t batch = -1);

}  // namespace pipetrain::train
