// Global-norm gradient clipping (pipetrain/train/grad_clip.h).
#include "pipetrain/train/grad_clip.h"
#include "pipetrain/base/check.h"

#include <cmath>

#include "pipetrain/train/optimizer.h"

namespace pipetrain::train {

double local_grad_norm_squared(const std::vector<torch::Tensor>& parameters) {
  double total = 0.0;
  for (const auto& parameter : unique_parameters(parameters)) {
    const torch::Tensor& grad = parameter.grad();
    if (!grad.defined()) continue;
    total += grad.detach().to(torch::kDouble).square().sum().item<double>();
  }
  return total;
}

void scale_gradients(const std::vector<torch::Tensor>& parameters, double factor) {
  torch::NoGradGuard no_grad;
  for (const auto& parameter : unique_parameters(parameters)) {
    torch::Tensor grad = parameter.mutable_grad();
    if (grad.defined()) grad.mul_(factor);
  }
}

double clip_factor(double total_norm, double max_norm) {
  PIPETRAIN_CHECK_INPUT(max_norm > 0.0, "gradient clipping: max norm must be positive, got ",
                        max_norm);
  return total_norm > max_norm ? max_norm / (total_norm + 1e-6) : 1.0;
}

double clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm) {
  const double total_norm = std::sqrt(local_grad_norm_squared(parameters));
  const double factor = clip_factor(total_norm, max_norm);
  if (std::isfinite(total_norm) && factor != 1.0) scale_gradients(parameters, factor);
  return total_norm;
}

}  // namespace pipetrain::train
