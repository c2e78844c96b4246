// Private helpers shared by the generator files: argument checks and an empty K-rank schedule.
#pragma once

#include <string>

#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule::detail {

// Throws pipetrain::BadInput "<schedule>: <what> must be >= 1 (got <value>)".
void require_positive(const std::string& schedule, const char* what, int value);

// A schedule with K ranks, S = K*V stages placed Megatron-style (stage j on rank j % K) and no
// actions yet.
Schedule empty_schedule(const std::string& name, int ranks, int microbatches, int virtual_stages);

}  // namespace pipetrain::schedule::detail
