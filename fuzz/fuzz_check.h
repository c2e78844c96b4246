// What every fuzz target holds a reader to: on any input it returns, or throws a pipetrain::Error
// (bad input, named). Anything else -- another exception, a crash, a sanitizer report, a hang,
// memory past libFuzzer's limit -- is a bug, and libFuzzer stops on it with the input saved.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>

#include "pipetrain/base/error.h"

namespace pipetrain::fuzz {

// Runs `read`; a pipetrain::Error is the reader saying no, anything else aborts.
template <typename Read>
void expect_only_pipetrain_errors(Read read) {
  try {
    read();
  } catch (const pipetrain::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: a reader threw something other than pipetrain::Error: %s\n",
                 e.what());
    std::abort();
  }
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

}  // namespace pipetrain::fuzz
