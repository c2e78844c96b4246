// Small helpers the job's sources share (private to src/job/; one definition for the unity
// build, which compiles several of these files as one).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include "pipetrain/base/error.h"

namespace pipetrain::job::detail {

// Runs `load` (reading a file or a setting the user named); an error of the library or of torch
// becomes BadInput("<flag>: <message>") ("<message>" alone for an empty flag).
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

inline bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace pipetrain::job::detail
