// ZeRO-3's parameter residency plan (pipetrain/schedule/residency.h).
#include "pipetrain/schedule/residency.h"

#include <map>

namespace pipetrain::schedule {

ResidencyPlan parameter_residency(const Schedule& s, int r, bool reshard_after_forward) {
  const auto& list = s.actions.at(static_cast<std::size_t>(r));
  ResidencyPlan plan;
  plan.steps.resize(list.size());
  std::map<int, std::size_t> last;  // stage -> its last compute action here
  for (std::size_t a = 0; a < list.size(); ++a) {
    if (!is_compute(list[a].op)) continue;
    plan.steps[a].needs = list[a].stage;
    last[list[a].stage] = a;
    if (plan.first < 0) plan.first = list[a].stage;
  }
  int next = -1;  // the stage of the first compute action after a
  for (std::size_t a = list.size(); a-- > 0;) {
    ResidencyStep& step = plan.steps[a];
    if (step.needs >= 0) {
      if (reshard_after_forward || last.at(step.needs) == a) step.release = step.needs;
      // Keeping a stage resident: nothing to fetch when the next action computes with it.
      if (next >= 0 && (next != step.needs || step.release >= 0)) step.prefetch = next;
      next = step.needs;
    }
  }
  return plan;
}

}  // namespace pipetrain::schedule
