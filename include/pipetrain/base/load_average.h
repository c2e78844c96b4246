// The machine's load average, printed beside every measured figure (bench, plan --verify) so a
// reader can tell a quiet run from a busy one.
//
// Thread-safety: safe; reads /proc/loadavg on each call.
#pragma once

#include <string>

namespace pipetrain {

struct LoadAverage {
  double one_minute = 0;
  double five_minutes = 0;
  double fifteen_minutes = 0;
  bool known = false;  // false where /proc/loadavg cannot be read (the figures are then 0)

  // "0.52 0.61 0.70", or "unknown".
  std::string to_string() const;
};

LoadAverage read_load_average();

}  // namespace pipetrain
