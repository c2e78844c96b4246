// Timeline: what ran where and when, as a flat list of events, one per executed action.
//
// simulate() produces one from a cost model; the runtime's tracer produces one from measured
// times. The writers (timeline_svg.h, chrome_trace.h) and render_time_grid (grid.h) draw either,
// so they depend on nothing but this header.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/schedule/action.h"

namespace pipetrain::schedule {

struct TimelineEvent {
  int rank = 0;
  std::string label;  // "2F0"; usually to_string(Action)
  Op op = Op::kForward;
  int stage = 0;       // j
  int microbatch = 0;  // i
  double start = 0;    // in Timeline::time_unit
  double end = 0;
  // Not an action (a collective: runtime/collective_log.h): the Chrome trace files it under this
  // category instead of op's name, with the stage (and its bytes, where known) as arguments.
  // Empty: an action.
  std::string category;
  int64_t bytes = -1;  // a collective's bytes from this rank; -1: not known
};

// A Chrome trace counter sample ("ph": "C"): series name -> value at `time` (the SVG leaves them
// out).
struct TimelineCounter {
  std::string name;
  double time = 0;
  std::vector<std::pair<std::string, double>> values;
};

struct Timeline {
  std::string title;                   // drawn above the picture
  int num_ranks = 0;                   // rows; events with rank >= num_ranks widen it
  std::string time_unit = "units";     // axis label: "units" (cost model), "ms", "us", ...
  double microseconds_per_unit = 1.0;  // Chrome trace timestamps are microseconds
  std::vector<TimelineEvent> events;
  std::vector<TimelineCounter> counters;
  // Names of the Chrome trace's rows by index ("rank r" where there is none).
  std::vector<std::string> row_names;

  double makespan() const;  // latest end (0 when empty)
  int rows() const;         // max(num_ranks, 1 + largest event rank)
};

// An event for `action` on `rank`, labelled to_string(action).
TimelineEvent make_event(int rank, const Action& action, double start, double end);

}  // namespace pipetrain::schedule
