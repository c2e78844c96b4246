// Dynamic loss scaling (pipetrain/train/loss_scaler.h).
#include "pipetrain/train/loss_scaler.h"

#include <torch/torch.h>

#include "pipetrain/base/check.h"

namespace pipetrain::train {

DynamicLossScaler::DynamicLossScaler(LossScalerOptions options)
    : options_(options), scale_(options.initial_scale()) {
  PIPETRAIN_CHECK_INPUT(options_.initial_scale() > 0 && options_.growth_factor() > 1 &&
                            options_.backoff_factor() > 0 && options_.backoff_factor() < 1 &&
                            options_.growth_interval() >= 1,
                        "loss scaler: needs initial_scale > 0, growth_factor > 1, 0 < "
                        "backoff_factor < 1 and growth_interval >= 1 (got ",
                        options_.initial_scale(), ", ", options_.growth_factor(), ", ",
                        options_.backoff_factor(), ", ", options_.growth_interval(), ")");
}

void DynamicLossScaler::update(bool found_non_finite) {
  if (found_non_finite) {
    scale_ *= options_.backoff_factor();
    good_steps_ = 0;
    ++skipped_;
    return;
  }
  if (++good_steps_ == options_.growth_interval()) {
    scale_ *= options_.growth_factor();
    good_steps_ = 0;
  }
}

void DynamicLossScaler::restore(double scale, int64_t good_steps) {
  PIPETRAIN_CHECK_INPUT(scale > 0 && good_steps >= 0, "loss scaler: cannot restore scale ", scale,
                        " with ", good_steps, " good steps");
  scale_ = scale;
  good_steps_ = good_steps;
}

bool has_non_finite_gradient(const std::vector<torch::Tensor>& parameters) {
  for (const torch::Tensor& p : parameters) {
    const torch::Tensor& grad = p.grad();
    if (grad.defined() && !torch::isfinite(grad).all().item<bool>()) return true;
  }
  return false;
}

}  // namespace pipetrain::train
