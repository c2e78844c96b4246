// SVG Gantt chart of a Timeline: one row per rank, one box per event, coloured by op
// (F blue, B green, I orange, W purple, sends/receives grey), labelled with the micro-batch,
// with a time axis, a legend and the title. Self-contained SVG 1.1, no scripts or fonts.
//
// Thread-safety: pure functions; save_svg touches only the named file (written atomically).
#pragma once

#include <string>

#include "pipetrain/schedule/timeline.h"

namespace pipetrain::schedule {

std::string render_svg(const Timeline& timeline);

// render_svg() written to `path` through a temporary file + rename.
void save_svg(const Timeline& timeline, const std::string& path);

}  // namespace pipetrain::schedule
