// DynamicLossScaler: the loss scale of float16 training (torch.cuda.amp.GradScaler's rule).
//
// float16 gradients underflow where float32 ones do not; multiplying the loss by a large scale S
// moves them into range, and dividing the gradients by S before the optimizer step undoes it
// (exactly, S being a power of two). When a step's gradients hold inf or NaN the scale was too
// large: the step is skipped and S shrinks; after `growth_interval` good steps in a row it grows.
//
//   every step:  loss * S -> backward -> any gradient non-finite (on any rank)?
//                  yes: skip the optimizer step, S *= backoff_factor
//                  no:  gradients / S, clip, step; after growth_interval such steps S *= growth
//
// LossScaleRule::kDeepSpeed is DeepSpeed's DynamicLossScaler instead (its fp16 section:
// initial_scale_power, loss_scale_window, hysteresis, consecutive_hysteresis, min_loss_scale; read
// from its source, deepspeed/runtime/fp16/loss_scaler.py):
//
//   overflow:  skip the step; if hysteresis is 1 (or its remaining count is 1) the scale halves,
//              not below min_scale (an overflow at min_scale is an error), else the count drops
//   good step: with consecutive_hysteresis the count refills; when the steps since the last
//              overflow, less one, are a positive multiple of the window, the count refills and
//              the scale doubles (so the first growth comes after window + 1 good steps)
//
// kStatic keeps the scale (DeepSpeed's loss_scale > 0): a non-finite step is still skipped.
//
// The Trainer runs it with TrainerOptions::loss_scaling (on for fp16). Thread-safety: plain
// value, one thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/arg.h>
#include <torch/types.h>

namespace pipetrain::train {

enum class LossScaleRule { kTorch, kDeepSpeed, kStatic };
// "torch", "deepspeed", "static"; the parser throws BadInput naming the text.
const char* to_string(LossScaleRule rule);
LossScaleRule parse_loss_scale_rule(const std::string& text);

struct LossScalerOptions {
  /// How the scale moves (the header comment). Default torch's GradScaler rule.
  TORCH_ARG(LossScaleRule, rule) = LossScaleRule::kTorch;
  /// The first scale. Default 2^16.
  TORCH_ARG(double, initial_scale) = 65536.0;
  /// Multiplies the scale after growth_interval good steps in a row. Default 2.
  TORCH_ARG(double, growth_factor) = 2.0;
  /// Multiplies the scale after a step with a non-finite gradient. Default 0.5.
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// Good steps in a row before the scale grows (kDeepSpeed: its window). Default 2000.
  TORCH_ARG(int64_t, growth_interval) = 2000;
  /// kDeepSpeed: overflows before the scale halves (the count refills as the header says), the
  /// floor of the scale, and whether every good step refills the count.
  TORCH_ARG(int64_t, hysteresis) = 2;
  TORCH_ARG(double, min_scale) = 1.0;
  TORCH_ARG(bool, consecutive_hysteresis) = false;
};

class DynamicLossScaler {
 public:
  // Throws BadInput unless initial_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and
  // growth_interval >= 1.
  explicit DynamicLossScaler(LossScalerOptions options = {});

  double scale() const { return scale_; }
  // After a step: `found_non_finite` lowers the scale (the step was skipped), else counts a good
  // step and grows the scale every growth_interval of them.
  void update(bool found_non_finite);
  int64_t skipped_steps() const { return skipped_; }

  // Checkpoint form: the scale, the good steps since it last changed (kDeepSpeed: since the last
  // overflow) and kDeepSpeed's remaining hysteresis count (-1 in restore: the full count).
  int64_t good_steps() const { return good_steps_; }
  int64_t hysteresis_left() const { return hysteresis_left_; }
  void restore(double scale, int64_t good_steps, int64_t hysteresis_left = -1);

 private:
  void update_deepspeed(bool found_non_finite);

  LossScalerOptions options_;
  double scale_;
  int64_t good_steps_ = 0;
  int64_t skipped_ = 0;
  int64_t hysteresis_left_ = 0;
};

// True when the .grad() of any of `parameters` holds inf or NaN.
bool has_non_finite_gradient(const std::vector<torch::Tensor>& parameters);

}  // namespace pipetrain::train
