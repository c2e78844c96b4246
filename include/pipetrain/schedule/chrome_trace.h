// Chrome trace (chrome://tracing, Perfetto) JSON of a Timeline: one complete event ("ph": "X")
// per TimelineEvent, one thread row per rank (pid 0, tid = rank, named "rank r"), timestamps in
// microseconds (Timeline::microseconds_per_unit converts). args carry stage, micro-batch, op.
//
// Thread-safety: pure functions; save_chrome_trace writes atomically.
#pragma once

#include <string>

#include "pipetrain/schedule/timeline.h"

namespace pipetrain::schedule {

std::string render_chrome_trace(const Timeline& timeline);

void save_chrome_trace(const Timeline& timeline, const std::string& path);

}  // namespace pipetrain::schedule
