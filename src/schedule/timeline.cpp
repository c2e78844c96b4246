// Timeline helpers.
#include "pipetrain/schedule/timeline.h"

#include <algorithm>

namespace pipetrain::schedule {

double Timeline::makespan() const {
  double latest = 0;
  for (const auto& event : events) latest = std::max(latest, event.end);
  return latest;
}

int Timeline::rows() const {
  int rows = num_ranks;
  for (const auto& event : events) rows = std::max(rows, event.rank + 1);
  return rows;
}

TimelineEvent make_event(int rank, const Action& action, double start, double end) {
  TimelineEvent event;
  event.rank = rank;
  event.label = to_string(action);
  event.op = action.op;
  event.stage = action.stage;
  event.microbatch = action.microbatch;
  event.start = start;
  event.end = end;
  return event;
}

}  // namespace pipetrain::schedule
