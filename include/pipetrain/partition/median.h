// The median of a list of timings: the middle value, or the mean of the two middle values for an
// even count. The profiler, the planner's step 5 and `pipetrain plan --verify` take their medians
// with it.
//
// REQUIRES: values not empty.
#pragma once

#include <algorithm>
#include <vector>

namespace pipetrain::partition {

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace pipetrain::partition
