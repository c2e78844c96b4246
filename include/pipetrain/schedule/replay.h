// Replay: a schedule run again on the simulator with the durations its actions really took, to
// tell apart what the schedule costs (its bubbles) from what the runtime adds around the actions.
//
//   efficiency = replayed makespan / measured step time
//
// 1.0 means every microsecond of the step was compute or waiting the schedule itself implies;
// below 1.0, the runtime (hand-offs, transport, the step's set-up) took the rest. `pipetrain
// bench` prints it for every row.
//
// Thread-safety: pure functions.
#pragma once

#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "pipetrain/schedule/action.h"
#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

// One step's measured compute durations (microseconds) by (stage, op, micro-batch).
class MeasuredDurations {
 public:
  void add(const Action& action, double microseconds);
  // REQUIRES: add() was called for `action` (BadInput naming it otherwise).
  double of(const Action& action) const;
  bool empty() const { return durations_.empty(); }

 private:
  std::map<std::tuple<int, int, int>, double> durations_;
};

// The makespan, in seconds, of `lowered` when every compute action takes what it took in `step`
// and every transfer `comm_us` microseconds.
double replayed_seconds(const Schedule& lowered, const MeasuredDurations& step, double comm_us = 0);

struct ReplayEfficiency {
  double efficiency = 0;        // median over steps of replayed / measured
  double replayed_seconds = 0;  // median replayed makespan
};

// Over the steps k < min(steps.size(), measured_seconds.size()).
ReplayEfficiency replay_efficiency(const Schedule& lowered,
                                   const std::vector<MeasuredDurations>& steps,
                                   const std::vector<double>& measured_seconds, double comm_us = 0);

}  // namespace pipetrain::schedule
