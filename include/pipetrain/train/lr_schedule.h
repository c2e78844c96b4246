// Learning-rate schedule: linear warm-up, then cosine decay to a floor.
//
//   lr
//   base |      ____
//        |     /    `--.
//        |    /         `.
//        |   /            `-.
//   min  |  /                 `----------
//        +--+-------+----------+---------> step k
//        0  warmup             total
//
//   k <  warmup:          base * (k + 1) / warmup           (reaches base at k = warmup - 1)
//   warmup <= k < total:  min + (base - min) * (1 + cos(pi * (k - warmup) / (total - warmup))) / 2
//   k >= total:           min
// With total_steps = 0 there is no decay: base after the warm-up.
//
// A pure function of the step, so a resumed run gets the same rates. Thread-safety: pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/arg.h>

namespace pipetrain::train {

struct LrScheduleOptions {
  /* implicit */ LrScheduleOptions(double base_lr) : base_lr_(base_lr) {}
  /// Peak learning rate. REQUIRES > 0.
  TORCH_ARG(double, base_lr);
  /// Steps of linear warm-up. Default 0 (start at base_lr).
  TORCH_ARG(int64_t, warmup_steps) = 0;
  /// Step at which the cosine reaches min_lr; 0 (default) disables the decay.
  TORCH_ARG(int64_t, total_steps) = 0;
  /// The floor the cosine decays to. Default 0.
  TORCH_ARG(double, min_lr) = 0.0;
};

// The schedules TrainerOptions::lr_schedule takes: "constant" (base_lr after the warm-up) and
// "cosine" (decays to min_lr at total_steps).
std::vector<std::string> lr_schedule_names();

// The learning rate for step k (0-based: the rate the k-th optimizer step uses).
// REQUIRES: step >= 0; options valid (checked: base_lr > 0, 0 <= min_lr <= base_lr,
// warmup_steps >= 0, total_steps == 0 or total_steps >= warmup_steps).
double learning_rate_at(const LrScheduleOptions& options, int64_t step);

}  // namespace pipetrain::train
