// Schedule generators: one pure function per schedule family, and make_schedule() to pick one by
// name. Each returns a compute-only Schedule (F/B/I/W, no sends or receives) with stage_rank
// filled in; lower() (lower.h) adds the communication.
//
//   gpipe             fill-drain: all forwards, then all backwards (M = 1: naive model parallel)
//   1f1b              PipeDream-flush: K-r-1 warm-up forwards, then one forward / one backward
//   interleaved-1f1b  Megatron's interleaved 1F1B: V virtual stages per rank, stage j on rank j%K
//   zb-h1             Zero Bubble H1: backward split into I (input grad) and W (weight grad);
//                     W's fill the bubbles; at most min(K, M) micro-batches in flight per rank
//
// docs/SCHEDULES.md draws each one and gives its bubble and memory formulas.
//
// Thread-safety: pure functions.
// REQUIRES: ranks >= 1, microbatches >= 1, virtual_stages >= 1 (std::invalid_argument otherwise,
// naming the value). Every family accepts any M >= 1, including M < K.
#pragma once

#include <string>
#include <vector>

#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

// K ranks = K stages; rank r: F0 .. F(M-1), then B0 .. B(M-1).
Schedule gpipe(int ranks, int microbatches);

// K ranks = K stages; rank r: min(K-r-1, M) warm-up forwards, then alternating F / B, then the
// remaining backwards. At most min(K-r, M) micro-batches in flight on stage r.
Schedule one_f_one_b(int ranks, int microbatches);

// K ranks, S = K*V stages, stage j on rank j % K. Micro-batches go through in rounds of K
// (the last round may be shorter, and M < K is one short round).
Schedule interleaved_one_f_one_b(int ranks, int microbatches, int virtual_stages);

// K ranks = K stages, backward split into I and W (zero-bubble H1).
Schedule zero_bubble_h1(int ranks, int microbatches);

// The names make_schedule() accepts, in a stable order: gpipe, 1f1b, interleaved-1f1b, zb-h1.
const std::vector<std::string>& schedule_names();

// Builds the named schedule. Throws std::invalid_argument for an unknown name (listing the valid
// names), for ranks/microbatches/virtual_stages < 1, and for virtual_stages != 1 on a family that
// has no virtual stages (only interleaved-1f1b takes V).
Schedule make_schedule(const std::string& name, int ranks, int microbatches,
                       int virtual_stages = 1);

}  // namespace pipetrain::schedule
