// The CSV form of a schedule that torch.distributed.pipelining's _PipelineScheduleRuntime dumps
// (_dump_csv) and loads (_load_csv, format "compute_only"), so a schedule made in either system
// runs in the other.
//
//   0F0,0F1,,0B0,0B1          <- rank 0: one cell per time step, empty cells are idle steps
//   ,1F0,1B0,1F1,1B1          <- rank 1
//
// Reading: each row is one rank, as in torch's reader: a blank row is a rank with no compute
// (torch writes one for a rank whose list is empty), and the line ending of the last row starts
// no row of its own. Cells hold compute actions in the text form of action.h ("2F0",
// "1I3", "1W3", "0B1"); empty cells are skipped; torch's overlapped pair "(0F7;7B3)OVERLAP_F_B"
// becomes its actions in order (on the CPU the pair runs one after the other). REDUCE_GRAD,
// UNSHARD and RESHARD cells (torch's FSDP bookkeeping, no compute) are skipped. A send or
// receive cell is an error: the CSV is compute-only and pipetrain adds its own communication.
// Placement and counts are inferred as in text_format.h.
//
// Writing: one row per rank, its compute actions, no idle cells.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

// Throws pipetrain::BadInput "row 2, cell '1X0': ..." on anything it cannot read.
Schedule parse_csv_schedule(std::string_view text, const std::string& name = "custom");

// Compute actions only (a lowered schedule is written without its sends and receives).
std::string format_csv_schedule(const Schedule& schedule);

// True when `path` names a CSV schedule (it ends in ".csv", any case).
bool is_csv_path(const std::string& path);

}  // namespace pipetrain::schedule
