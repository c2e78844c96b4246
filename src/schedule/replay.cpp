// Measured durations replayed on the simulator (pipetrain/schedule/replay.h).
#include "pipetrain/schedule/replay.h"

#include "pipetrain/base/error.h"
#include "pipetrain/base/median.h"
#include "pipetrain/schedule/simulate.h"

namespace pipetrain::schedule {

void MeasuredDurations::add(const Action& action, double microseconds) {
  durations_[{action.stage, static_cast<int>(action.op), action.microbatch}] = microseconds;
}

double MeasuredDurations::of(const Action& action) const {
  const auto it = durations_.find({action.stage, static_cast<int>(action.op), action.microbatch});
  if (it == durations_.end()) {
    throw BadInput("replay: no measured duration for " + to_string(action));
  }
  return it->second;
}

double replayed_seconds(const Schedule& lowered, const MeasuredDurations& step, double comm_us) {
  Costs costs;
  costs.comm = comm_us;
  costs.per_action = [&step](const Action& a) { return step.of(a); };
  return simulate(lowered, costs).makespan * 1e-6;
}

ReplayEfficiency replay_efficiency(const Schedule& lowered,
                                   const std::vector<MeasuredDurations>& steps,
                                   const std::vector<double>& measured_seconds, double comm_us) {
  std::vector<double> ratios, replayed;
  for (std::size_t k = 0; k < steps.size() && k < measured_seconds.size(); ++k) {
    replayed.push_back(replayed_seconds(lowered, steps[k], comm_us));
    ratios.push_back(replayed.back() / measured_seconds[k]);
  }
  return {median(ratios), median(replayed)};
}

}  // namespace pipetrain::schedule
