// Warm-up + cosine learning-rate schedule (pipetrain/train/lr_schedule.h).
#include "pipetrain/train/lr_schedule.h"
#include "pipetrain/base/check.h"

#include <cmath>

#include <c10/util/Exception.h>

namespace pipetrain::train {

std::vector<std::string> lr_schedule_names() {
  return {"constant", "cosine"};
}

double learning_rate_at(const LrScheduleOptions& o, int64_t step) {
  PIPETRAIN_CHECK_INPUT(o.base_lr() > 0.0, "learning-rate schedule: base lr must be positive, got ",
                        o.base_lr());
  PIPETRAIN_CHECK_INPUT(o.min_lr() >= 0.0 && o.min_lr() <= o.base_lr(),
                        "learning-rate schedule: min lr ", o.min_lr(), " must be in [0, base lr ",
                        o.base_lr(), "]");
  PIPETRAIN_CHECK_INPUT(o.warmup_steps() >= 0,
                        "learning-rate schedule: warm-up steps must be >= 0, got ",
                        o.warmup_steps());
  PIPETRAIN_CHECK_INPUT(o.total_steps() == 0 || o.total_steps() >= o.warmup_steps(),
                        "learning-rate schedule: total steps ", o.total_steps(),
                        " is shorter than the warm-up of ", o.warmup_steps(), " steps");
  PIPETRAIN_CHECK_INPUT(step >= 0, "learning-rate schedule: step must be >= 0, got ", step);
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
