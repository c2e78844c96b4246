// pipe_options_for: the PipeOptions that run a plan the planner made (its balance, micro-batch
// count, schedule, virtual stages and checkpoint mode), for a Pipe or a DistributedPipe.
//
// Example (examples/consumer/plan_and_train.cpp):
//   partition::PlanReport report = partition::recommend_report(model, sample, planner);
//   Pipe pipe(model, tune::pipe_options_for(report.recommended()));
//
// Thread-safety: pure.
#pragma once

#include "pipetrain/partition/planner.h"
#include "pipetrain/runtime/pipe.h"

namespace pipetrain::tune {

// Threads per stage, devices and timeout stay PipeOptions' defaults: set them on the result.
PipeOptions pipe_options_for(const partition::Plan& plan);

}  // namespace pipetrain::tune
