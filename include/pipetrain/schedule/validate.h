// validate(): proves a schedule is runnable before anything runs it.
//
// Accepts a compute-only schedule (generator output, custom file) or a lowered one (with
// SF/RF/SB/RB). Checks, in order:
//   [1] shape: K rank lists, stage_rank of size S with ranks in 0..K-1, every action's stage and
//       micro-batch in range and on the rank its stage is placed on
//   [2] completeness: for every stage j and micro-batch i exactly one F, and exactly one B or
//       else exactly one I and one W (never B together with I/W)
//   [3] order on the rank: F before its B/I, I before its W
//   [4] lowered only: exactly the sends and receives lower() would insert (each send has its
//       receive), none missing, none extra
//   [5] a dry run: ranks step through their lists; receives (or, compute-only, the cross-stage
//       dependency: j's F of i after j-1's F of i, j's B/I of i after j+1's B/I of i) block until
//       the matching send ran; sends are buffered and never block. If some rank can never proceed
//       the schedule deadlocks.
//
// A failure is a ScheduleError whose message holds a sentence saying what is wrong and the
// rank x step grid (grid.h) with the offending cells marked ">1B0<", e.g.
//   rank 1 waits at step 1 (1B0) for the gradient of micro-batch 0 from stage 2, which rank 2
//   only runs at step 3 (2B0), after waiting at step 1 (2F1) for the activation of ...
//
// Thread-safety: pure functions. Cost: O(total actions + S*M).
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "pipetrain/base/error.h"
#include "pipetrain/schedule/grid.h"
#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

// An invalid schedule (a pipetrain::ScheduleInvalid). what() = explanation + "\n" + grid.
struct ScheduleError : ScheduleInvalid {
  ScheduleError(const std::string& message, std::vector<GridCell> cells)
      : ScheduleInvalid(message), cells(std::move(cells)) {}
  std::vector<GridCell> cells;  // the marked cells (may be empty for shape errors)
};

struct CheckResult {
  bool ok = true;
  std::string explanation;      // one paragraph, no grid; empty when ok
  std::string message;          // explanation + "\n" + marked grid; empty when ok
  std::vector<GridCell> cells;  // marked cells
  explicit operator bool() const { return ok; }
};

// Non-throwing.
CheckResult check(const Schedule& schedule);

// Throws ScheduleError with check()'s message.
void validate(const Schedule& schedule);

}  // namespace pipetrain::schedule
