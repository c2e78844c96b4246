// BlendWalk: which dataset each sample of a blend comes from, as Megatron's blended dataset
// (`--data-path 0.7 A 0.3 B`) draws them.
//
//   weights w_d, normalized to sum 1
//   sample g (g = 0, 1, ... over the whole run, epochs included): the dataset d with the largest
//     w_d * max(g, 1) - c_d (the first on a tie), where c_d counts the samples taken from d
//     before g; then c_d += 1. It is d's c_d-th sample (counted from 0).
//
// So after g samples each dataset has given within one of w_d * g, and the walk is a pure function
// of g: a resumed run and every rank draw the same samples.
//
// Torch-free. Thread-safety: source_of() caches the walk so far under a mutex; safe concurrently.
#pragma once

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace pipetrain::data {

class BlendWalk {
 public:
  // REQUIRES at least one weight, each finite and > 0: BadInput naming the dataset otherwise.
  explicit BlendWalk(std::vector<double> weights);

  size_t datasets() const { return weights_.size(); }
  const std::vector<double>& weights() const { return weights_; }  // normalized
  // (dataset, its sample index) of blend sample g. REQUIRES g >= 0.
  std::pair<size_t, int64_t> source_of(int64_t g) const;

 private:
  std::vector<double> weights_;
  mutable std::mutex mutex_;
  mutable int64_t walked_ = 0;          // samples walked (guarded by mutex_)
  mutable std::vector<int64_t> taken_;  // c_d after walked_ samples (guarded by mutex_)
};

}  // namespace pipetrain::data
