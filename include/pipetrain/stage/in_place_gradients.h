// InPlaceGradients: which weights may take their gradient into .grad() from inside the operation
// that computes it, while a backward runs.
//
// An embedding's or an output layer's weight gradient is vocabulary x hidden (933 MB at
// Qwen2-1.5B's size). Returned to autograd it is a whole new tensor, alive beside the .grad() it
// is then added into: a second table for a moment at every micro-batch after the first. The
// operations that know how (src/models/vocabulary_table.h: the Llama embedding and output layer)
// add it into .grad() themselves instead, the rows a batch used or a block of the vocabulary at a
// time, and return no gradient for the weight, where the caller running the backward allows it
// for that weight: the caller that would only accumulate the returned gradient into .grad()
// (Stage: every weight without parameter hooks, and those the hooks do not take). The sums are
// the same: .grad() plus the micro-batch's gradient, each element added once.
//
// Thread-safety: the allowances are process-wide (the autograd engine runs a CUDA backward on its
// own threads), under a mutex; scopes of different stages nest and overlap freely.
#pragma once

#include <vector>

#include <torch/types.h>

namespace pipetrain {

class InPlaceGradients {
 public:
  // Allows `weights` (leaves; others are ignored) until destroyed.
  explicit InPlaceGradients(const std::vector<torch::Tensor>& weights);
  ~InPlaceGradients();
  InPlaceGradients(const InPlaceGradients&) = delete;
  InPlaceGradients& operator=(const InPlaceGradients&) = delete;

  // Whether `weight` may take its gradient into .grad() now: a leaf some live scope allows.
  static bool allowed(const torch::Tensor& weight);

 private:
  std::vector<const void*> weights_;
};

}  // namespace pipetrain
