// Test support: the message of the BadInput a call throws, and a failure where it throws none.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "pipetrain/base/error.h"

namespace pipetrain::testing {

inline std::string message_of_bad_input(const std::function<void()>& call) {
  try {
    call();
  } catch (const pipetrain::BadInput& e) {
    return e.what();
  }
  ADD_FAILURE() << "no BadInput was thrown";
  return "";
}

}  // namespace pipetrain::testing
