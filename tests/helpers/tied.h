// Tied weights in tests: TiedLinear, a linear layer that uses another layer's weight tensor
// itself (not a copy), and unique_parameters, each tensor once (a tie appears under two names).
#pragma once

#include <set>
#include <vector>

#include <torch/torch.h>

namespace pipetrain::testing {

class TiedLinearImpl : public torch::nn::Cloneable<TiedLinearImpl> {
 public:
  explicit TiedLinearImpl(torch::Tensor weight) : weight_(std::move(weight)) { reset(); }
  void reset() override { weight_ = register_parameter("weight", weight_); }
  torch::Tensor forward(torch::Tensor x) { return torch::linear(x, weight_); }

 private:
  torch::Tensor weight_;
};
TORCH_MODULE(TiedLinear);

inline std::vector<torch::Tensor> unique_parameters(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> unique;
  std::set<const void*> seen;
  for (const auto& p : params) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) unique.push_back(p);
  }
  return unique;
}

}  // namespace pipetrain::testing
