// Text form of a whole schedule: one line per rank, that rank's actions comma-separated.
//
//   # 1f1b, 2 ranks, 2 micro-batches        <- '#' starts a comment (to end of line)
//   0F0,0F1,0B0,0B1                         <- rank 0
//   1F0,1B0,1F1,1B1                         <- rank 1
//
// Blank and comment-only lines are skipped; the n-th remaining line is rank n. Spaces around
// actions are ignored. A rank with no actions is written "-" (an empty line would be skipped).
//
// Parsing infers the counts from the content: S = 1 + largest stage, M = 1 + largest micro-batch,
// K = number of rank lines, and stage_rank[j] = the rank whose line mentions stage j. A stage on
// two ranks, or a stage in 0..S-1 that never appears, is an error. Errors name the line number
// and the offending token. Parsing checks form only; validate() (validate.h) checks order.
//
// Thread-safety: pure functions; load/save touch only the named file (save writes a temporary
// file and renames it, so readers never see half a schedule).
#pragma once

#include <string>
#include <string_view>

#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

// Throws pipetrain::BadInput "line 3, token '2X0': ..." on malformed input.
Schedule parse_schedule(std::string_view text, const std::string& name = "custom");

// One line per rank, no comments. parse_schedule(format_schedule(s)) == s for any schedule
// whose every stage appears in some rank's list.
std::string format_schedule(const Schedule& schedule);

// File versions; a path ending in ".csv" is read and written in torch's CSV form instead
// (csv_format.h; no comment line there). load throws pipetrain::BadInput (bad content, message
// names the file) or std::runtime_error (cannot read). save writes "<path>.tmp.<pid>" then renames
// it over path.
Schedule load_schedule(const std::string& path);
void save_schedule(const Schedule& schedule, const std::string& path,
                   const std::string& comment = "");

}  // namespace pipetrain::schedule
