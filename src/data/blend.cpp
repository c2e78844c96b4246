// Which dataset each blend sample comes from (data/blend.h).
#include "pipetrain/data/blend.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "pipetrain/base/error.h"

namespace pipetrain::data {

BlendWalk::BlendWalk(std::vector<double> weights) : weights_(std::move(weights)) {
  if (weights_.empty()) throw BadInput("a blend needs at least one dataset");
  double total = 0;
  for (size_t d = 0; d < weights_.size(); ++d) {
    if (!std::isfinite(weights_[d]) || weights_[d] <= 0) {
      throw BadInput("blend dataset " + std::to_string(d) + " has weight " +
                     std::to_string(weights_[d]) + "; weights must be > 0");
    }
    total += weights_[d];
  }
  for (double& w : weights_) w /= total;
  taken_.assign(weights_.size(), 0);
}

std::pair<size_t, int64_t> BlendWalk::source_of(int64_t g) const {
  if (g < 0) throw BadInput("blend sample " + std::to_string(g) + " is negative");
  std::lock_guard<std::mutex> lock(mutex_);
  if (g < walked_) {  // an earlier sample (a resumed run reads forward from its step): walk again
    walked_ = 0;
    taken_.assign(weights_.size(), 0);
  }
  for (;; ++walked_) {
    const double at = static_cast<double>(std::max<int64_t>(walked_, 1));
    size_t best = 0;
    double best_error = weights_[0] * at - static_cast<double>(taken_[0]);
    for (size_t d = 1; d < weights_.size(); ++d) {
      const double error = weights_[d] * at - static_cast<double>(taken_[d]);
      if (error > best_error) {
        best = d;
        best_error = error;
      }
    }
    const int64_t count = taken_[best]++;
    if (walked_ == g) {
      ++walked_;
      return {best, count};
    }
  }
}

}  // namespace pipetrain::data
