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
// DeepSpeed's schedules (its runtime/lr_schedules.py, 0.19), for configs brought from it
// (job/deepspeed_config.h), with its engine's step count: the k-th optimizer step (0-based) runs
// at DeepSpeed's iteration t = k - 1, so the first step is at t = -1. With W = max(2,
// warmup_steps), g(t) = ln(t + 1) / ln(W) (log warm-up) or t / W (linear), min = warmup_min_lr:
//
//   warmup-lr         t < 0: min;  t < W: min + (base - min) g(t);  after: min + (base - min)
//   warmup-decay-lr   the same, then min + (base - min) max(0, (T - t) / max(1, T - W))
//   warmup-cosine-lr  base x r: t < 0: r = 0;  t < W: r = a + g(t) (1 - a), a = min / base;
//                     after: p = min(1, (t - W + 1) / max(1, T - W)),
//                     r = max(0, c + (1 - c) (1 + cos(pi p)) / 2), c = min_lr / base
//
// with T = total_steps. A pure function of the step, so a resumed run gets the same rates.
// Thread-safety: pure.
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
  /// Which rule: "constant" or "cosine" (pipetrain's, above; "constant" with total_steps > 0 is
  /// the cosine), or DeepSpeed's "warmup-lr", "warmup-decay-lr", "warmup-cosine-lr".
  TORCH_ARG(std::string, schedule) = "constant";
  /// DeepSpeed's schedules: "log" (its default) or "linear" warm-up.
  TORCH_ARG(std::string, warmup_type) = "log";
  /// DeepSpeed's schedules: the rate the warm-up starts from (and warmup-decay-lr decays to).
  TORCH_ARG(double, warmup_min_lr) = 0.0;
};

// The schedules TrainerOptions::lr_schedule takes: "constant" (base_lr after the warm-up),
// "cosine" (decays to min_lr at total_steps) and DeepSpeed's "warmup-lr", "warmup-decay-lr" and
// "warmup-cosine-lr".
std::vector<std::string> lr_schedule_names();
// True for DeepSpeed's schedules (they read warmup_type and warmup_min_lr).
bool is_deepspeed_lr_schedule(const std::string& name);

// The learning rate for step k (0-based: the rate the k-th optimizer step uses).
// REQUIRES: step >= 0; options valid (checked: base_lr > 0, 0 <= min_lr <= base_lr,
// 0 <= warmup_min_lr <= base_lr, warmup_steps >= 0, total_steps == 0 or total_steps >=
// warmup_steps for pipetrain's, a known schedule and warm-up type).
double learning_rate_at(const LrScheduleOptions& options, int64_t step);

}  // namespace pipetrain::train
