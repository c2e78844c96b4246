// as_bad_input(flag, load): runs `load` -- reading a file or a setting a user named -- and turns a
// library error (pipetrain::Error) or one of torch's (c10::Error) into BadInput("<flag>: <what>")
// ("<what>" alone for an empty flag), so that a caller reports bad input as bad input (exit 2 in
// the CLI) naming what to change. Other exceptions pass through.
//
//   const Checkpoint c = as_bad_input("--resume", [&] { return load_checkpoint(path); });
//
// Needs LibTorch (part of pipetrain::pipetrain, not pipetrain::schedule). Thread-safety: pure.
#pragma once

#include <string>

#include <c10/util/Exception.h>

#include "pipetrain/base/error.h"

namespace pipetrain {

template <typename Load>
auto as_bad_input(const std::string& flag, Load&& load) -> decltype(load()) {
  auto fail = [&flag](const std::string& message) {
    throw BadInput(flag.empty() ? message : flag + ": " + message);
  };
  try {
    return load();
  } catch (const pipetrain::Error& error) {
    fail(error.what());
  } catch (const c10::Error& error) {
    fail(error.what_without_backtrace());
  }
  throw BadInput(flag);  // not reached: fail() throws
}

}  // namespace pipetrain
