// A plan as PipeOptions (pipetrain/tune/plan_options.h).
#include "pipetrain/tune/plan_options.h"

namespace pipetrain::tune {

PipeOptions pipe_options_for(const partition::Plan& plan) {
  return PipeOptions()
      .balance(std::vector<int64_t>(plan.balance.begin(), plan.balance.end()))
      .chunks(plan.microbatches)
      .schedule(plan.schedule)
      .virtual_stages(plan.virtual_stages)
      .checkpoint(plan.checkpoint);
}

}  // namespace pipetrain::tune
