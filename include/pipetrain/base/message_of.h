// message_of(): an exception's message for a person, without c10's C++ frame list (a c10::Error's
// what() carries the backtrace) and without the TorchScript interpreter's traceback (only its last
// line, the error itself): users see one line, the rest only on request with
// TORCH_SHOW_CPP_STACKTRACES=1.
//
// Needs LibTorch (part of pipetrain::pipetrain, not pipetrain::schedule). Thread-safety: pure.
#pragma once

#include <exception>
#include <string>

namespace pipetrain {

std::string message_of(const std::exception& error);

}  // namespace pipetrain
