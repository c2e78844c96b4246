// Dynamic loss scaling (pipetrain/train/loss_scaler.h).
#include "pipetrain/train/loss_scaler.h"

#include <algorithm>
#include <string>

#include <torch/torch.h>

#include "pipetrain/base/check.h"
#include "pipetrain/base/error.h"

namespace pipetrain::train {

const char* to_string(LossScaleRule rule) {
  switch (rule) {
    case LossScaleRule::kTorch:
      return "torch";
    case LossScaleRule::kDeepSpeed:
      return "deepspeed";
    default:
      return "static";
  }
}

LossScaleRule parse_loss_scale_rule(const std::string& text) {
  for (LossScaleRule rule :
       {LossScaleRule::kTorch, LossScaleRule::kDeepSpeed, LossScaleRule::kStatic}) {
    if (text == to_string(rule)) return rule;
  }
  throw BadInput("--loss-scaler must be torch, deepspeed or static, got '" + text + "'");
}

DynamicLossScaler::DynamicLossScaler(LossScalerOptions options)
    : options_(options), scale_(options.initial_scale()), hysteresis_left_(options.hysteresis()) {
  PIPETRAIN_CHECK_INPUT(options_.hysteresis() >= 1 && options_.min_scale() > 0 &&
                            (options_.rule() != LossScaleRule::kDeepSpeed ||
                             options_.min_scale() <= options_.initial_scale()),
                        "loss scaler: needs hysteresis >= 1 and min_scale > 0 (deepspeed: at most "
                        "initial_scale; got ",
                        options_.hysteresis(), ", ", options_.min_scale(), ", ",
                        options_.initial_scale(), ")");
  PIPETRAIN_CHECK_INPUT(options_.initial_scale() > 0 && options_.growth_factor() > 1 &&
                            options_.backoff_factor() > 0 && options_.backoff_factor() < 1 &&
                            options_.growth_interval() >= 1,
                        "loss scaler: needs initial_scale > 0, growth_factor > 1, 0 < "
                        "backoff_factor < 1 and growth_interval >= 1 (got ",
                        options_.initial_scale(), ", ", options_.growth_factor(), ", ",
                        options_.backoff_factor(), ", ", options_.growth_interval(), ")");
}

void DynamicLossScaler::update(bool found_non_finite) {
  if (options_.rule() == LossScaleRule::kStatic) {
    if (found_non_finite) ++skipped_;
    return;
  }
  if (options_.rule() == LossScaleRule::kDeepSpeed) {
    update_deepspeed(found_non_finite);
    return;
  }
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

// DeepSpeed's update_scale, with good_steps_ its cur_iter - last_overflow_iter - 1 before the
// step (the stable interval) and hysteresis_left_ its cur_hysteresis.
void DynamicLossScaler::update_deepspeed(bool found_non_finite) {
  if (found_non_finite) {
    ++skipped_;
    if (options_.hysteresis() == 1 || hysteresis_left_ == 1) {
      if (scale_ == options_.min_scale()) {
        throw Error(ErrorKind::Runtime,
                    "loss scaler (deepspeed): a non-finite gradient at the minimum loss scale " +
                        std::to_string(options_.min_scale()) +
                        ", which cannot decrease any more (DeepSpeed stops here too)");
      }
      scale_ = std::max(scale_ / 2, options_.min_scale());
    } else {
      --hysteresis_left_;
    }
    good_steps_ = 0;
    return;
  }
  if (options_.consecutive_hysteresis()) hysteresis_left_ = options_.hysteresis();
  if (good_steps_ > 0 && good_steps_ % options_.growth_interval() == 0) {
    if (!options_.consecutive_hysteresis()) hysteresis_left_ = options_.hysteresis();
    scale_ *= 2;
  }
  ++good_steps_;
}

void DynamicLossScaler::restore(double scale, int64_t good_steps, int64_t hysteresis_left) {
  PIPETRAIN_CHECK_INPUT(scale > 0 && good_steps >= 0, "loss scaler: cannot restore scale ", scale,
                        " with ", good_steps, " good steps");
  scale_ = scale;
  good_steps_ = good_steps;
  hysteresis_left_ = hysteresis_left >= 1 ? hysteresis_left : options_.hysteresis();
}

bool has_non_finite_gradient(const std::vector<torch::Tensor>& parameters) {
  for (const torch::Tensor& p : parameters) {
    const torch::Tensor& grad = p.grad();
    if (grad.defined() && !torch::isfinite(grad).all().item<bool>()) return true;
  }
  return false;
}

}  // namespace pipetrain::train
