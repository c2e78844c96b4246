// Warm-up + cosine learning-rate schedule (pipetrain/train/lr_schedule.h).
#include "pipetrain/train/lr_schedule.h"
#include "pipetrain/base/check.h"

#include <algorithm>
#include <cmath>

#include <c10/util/Exception.h>

namespace pipetrain::train {

std::vector<std::string> lr_schedule_names() {
  return {"constant", "cosine", "warmup-lr", "warmup-decay-lr", "warmup-cosine-lr"};
}

bool is_deepspeed_lr_schedule(const std::string& name) {
  return name == "warmup-lr" || name == "warmup-decay-lr" || name == "warmup-cosine-lr";
}

namespace {

// DeepSpeed's rules at its iteration t (lr_schedule.h), in its own order of operations.
double deepspeed_rate(const LrScheduleOptions& o, int64_t t) {
  const int64_t w = std::max<int64_t>(2, o.warmup_steps());
  const bool log_warmup = o.warmup_type() == "log";
  const auto warmup = [&] {
    return log_warmup
               ? (1.0 / std::log(static_cast<double>(w))) * std::log(static_cast<double>(t + 1))
               : static_cast<double>(t) / static_cast<double>(w);
  };
  const double base = o.base_lr();
  if (o.schedule() == "warmup-cosine-lr") {
    if (t < 0) return 0.0;
    double ratio = 0;
    if (t < w) {
      const double a = o.warmup_min_lr() / base;
      ratio = a + warmup() * (1.0 - a);
    } else {
      const double real_step = static_cast<double>(t - w + 1);
      const double real_total = static_cast<double>(std::max<int64_t>(1, o.total_steps() - w));
      const double progress = std::min(1.0, real_step / real_total);
      const double c = o.min_lr() / base;
      ratio = std::max(0.0, c + (1.0 - c) * ((1 + std::cos(M_PI * progress)) / 2));
    }
    return base * ratio;
  }
  const double min = o.warmup_min_lr();
  if (t < 0) return min;
  double gamma = 1.0;
  if (t < w) {
    gamma = warmup();
  } else if (o.schedule() == "warmup-decay-lr") {
    gamma = std::max(0.0, static_cast<double>(o.total_steps() - t) /
                              std::max(1.0, static_cast<double>(o.total_steps() - w)));
  }
  return min + (base - min) * gamma;
}

}  // namespace

double learning_rate_at(const LrScheduleOptions& o, int64_t step) {
  PIPETRAIN_CHECK_INPUT(o.base_lr() > 0.0, "learning-rate schedule: base lr must be positive, got ",
                        o.base_lr());
  PIPETRAIN_CHECK_INPUT(o.min_lr() >= 0.0 && o.min_lr() <= o.base_lr(),
                        "learning-rate schedule: min lr ", o.min_lr(), " must be in [0, base lr ",
                        o.base_lr(), "]");
  PIPETRAIN_CHECK_INPUT(o.warmup_steps() >= 0,
                        "learning-rate schedule: warm-up steps must be >= 0, got ",
                        o.warmup_steps());
  PIPETRAIN_CHECK_INPUT(step >= 0, "learning-rate schedule: step must be >= 0, got ", step);
  if (is_deepspeed_lr_schedule(o.schedule())) {
    PIPETRAIN_CHECK_INPUT(o.warmup_type() == "log" || o.warmup_type() == "linear",
                          "learning-rate schedule: warm-up type must be log or linear, got '",
                          o.warmup_type(), "'");
    PIPETRAIN_CHECK_INPUT(o.warmup_min_lr() >= 0.0 && o.warmup_min_lr() <= o.base_lr(),
                          "learning-rate schedule: warm-up min lr ", o.warmup_min_lr(),
                          " must be in [0, base lr ", o.base_lr(), "]");
    return deepspeed_rate(o, step - 1);
  }
  PIPETRAIN_CHECK_INPUT(o.schedule() == "constant" || o.schedule() == "cosine",
                        "learning-rate schedule: unknown schedule '", o.schedule(), "'");
  PIPETRAIN_CHECK_INPUT(o.total_steps() == 0 || o.total_steps() >= o.warmup_steps(),
                        "learning-rate schedule: total steps ", o.total_steps(),
                        " is shorter than the warm-up of ", o.warmup_steps(), " steps");
  if (step < o.warmup_steps()) {
    return o.base_lr() * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps());
  }
  if (o.total_steps() == 0) return o.base_lr();
  if (step >= o.total_steps()) return o.min_lr();
  const double span = static_cast<double>(o.total_steps() - o.warmup_steps());
  const double progress = static_cast<double>(step - o.warmup_steps()) / span;
  return o.min_lr() + (o.base_lr() - o.min_lr()) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace pipetrain::train
