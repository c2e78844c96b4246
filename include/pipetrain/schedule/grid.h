// Text pictures of a schedule for terminals, test failures and error messages.
//
//   render_grid: rank x step, the k-th action of each rank in column k (what validate() and the
//   golden tests print). Marked cells are drawn ">1B0<".
//
//     step     0     1     2     3
//     rank 0   0F0   0F1   0B0   0B1
//     rank 1   1F0  >1B0<  1F1   1B1
//
//   render_time_grid: rank x time slot, each slot showing the action running at its start
//   ("." = idle); the picture of a simulated or measured Timeline (timeline.h).
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "pipetrain/schedule/schedule.h"
#include "pipetrain/schedule/timeline.h"

namespace pipetrain::schedule {

struct GridCell {
  int rank = 0;
  int step = 0;  // k: index into schedule.actions[rank]
};

// Wide schedules (more than max_columns steps) are cut to a window around the marked cells,
// with "..." where columns were left out. max_columns <= 0 draws every column.
std::string render_grid(const Schedule& schedule, const std::vector<GridCell>& marks = {},
                        int max_columns = 48);

// One column per `slot` time units (slot <= 0: the shortest event's duration). At most
// max_columns columns; beyond that, the slot is widened to fit.
std::string render_time_grid(const Timeline& timeline, double slot = 0, int max_columns = 160);

}  // namespace pipetrain::schedule
