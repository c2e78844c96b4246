// When a rank needs each of its stages' parameters whole: the plan ZeRO-3 follows
// (train/sharded_optimizer.h keeps 1/dp of every parameter between steps and gathers a stage's
// parameters only around that stage's actions).
//
// For one rank's action list, per action a:
//   needs     the stage whose parameters a computes with (F, B, I, W), -1 for communication
//   release   the stage to free after a, -1 for none
//   prefetch  the stage to start gathering after a (the next compute action's), -1 for none
//
// Two policies, as FSDP has them:
//   keep until the last backward (default; torchtitan's under pipelining): a stage is gathered
//     before its first action of the step and freed after its last;
//   reshard after forward: freed after each F and after each B/I/W as well, and gathered again
//     before the next (less memory, one gather per action instead of per step).
// Either way the gather of the next compute action's stage starts right after an action ends,
// so that it runs while the rank waits for that action's input (off the critical path).
//
//   rank 0 of interleaved 1F1B (stages 0 and 2), keep until the last backward:
//     F0 F0 F2 F2 ... B2 B0 B2 B0
//     ^gather 0 (at the start)
//        ^after: prefetch 2      ^after the last B2: release 2   ^after the last B0: release 0
//
// Torch-free, pure: a function of the schedule.
#pragma once

#include <vector>

#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

struct ResidencyStep {
  int needs = -1;
  int release = -1;
  int prefetch = -1;
};

// The plan for rank r's actions (one entry per action of s.actions[r]), and the stage to start
// gathering before the first action (-1 when r computes nothing).
struct ResidencyPlan {
  int first = -1;
  std::vector<ResidencyStep> steps;
};

ResidencyPlan parameter_residency(const Schedule& s, int r, bool reshard_after_forward);

}  // namespace pipetrain::schedule
