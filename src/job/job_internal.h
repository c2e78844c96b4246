// Small helpers the job's sources share (private to src/job/; one definition for the unity
// build, which compiles several of these files as one).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "pipetrain/base/as_bad_input.h"

namespace pipetrain::job::detail {

using pipetrain::as_bad_input;

inline bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace pipetrain::job::detail
