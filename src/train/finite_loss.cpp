// NaN / inf loss check (pipetrain/train/finite_loss.h).
#include "pipetrain/train/finite_loss.h"

#include <cmath>
#include <sstream>

namespace pipetrain::train {

void check_finite_loss(double loss, int64_t step, int64_t epoch, int64_t batch) {
  if (std::isfinite(loss)) return;
  std::ostringstream message;
  message << "loss is " << (std::isnan(loss) ? "nan" : (loss > 0 ? "inf" : "-inf")) << " at step "
          << step;
  if (epoch >= 0 && batch >= 0) message << " (epoch " << epoch << ", batch " << batch << ")";
  message << "; training diverged: lower the learning rate (--lr), add warm-up steps, or clip "
             "gradients (--clip-grad-norm)";
  throw NonFiniteLossError(message.str(), step);
}

}  // namespace pipetrain::train
