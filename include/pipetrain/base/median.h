// Medians of timings. median(): the middle value, or the mean of the two middle values for an
// even count (the profiler, the planner, `plan --verify`, the bench). upper_median(): the upper
// of the two middle values, always one of the measured values (the calibration, which must not
// invent a time nobody measured).
//
// Both are 0 for an empty list (a bench row with no timed step). Thread-safety: pure.
#pragma once

#include <algorithm>
#include <vector>

namespace pipetrain {

inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

inline double upper_median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace pipetrain
