// Lowering: turns a compute-only schedule into one with explicit sends and receives.
//
// Convention (action.h names the ops). For stage j and micro-batch i, on the rank running j:
//
//      (j)RFi  (j)Fi  (j)SFi            activation: j-1 --SF/RF--> j --SF/RF--> j+1
//      (j)RBi  (j)Bi  (j)SBi            gradient:   j-1 <--SB/RB-- j <--SB/RB-- j+1
//      (j)RBi  (j)Ii  (j)SBi ... (j)Wi  split backward: I produces the input gradient, W sends
//      nothing
//
//   - RF only for j > 0 (stage 0 reads the input), SF only for j < S-1.
//   - RB only for j < S-1 (the last stage computes the loss), SB only for j > 0.
// Stages on the same rank (interleaving, or K = 1) still talk through send/recv; the runtime
// delivers those locally. The runtime's contract: sends never block, receives block.
//
// Thread-safety: pure function.
// REQUIRES: a compute-only schedule (pipetrain::BadInput naming the first communication action
// otherwise).
#pragma once

#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

Schedule lower(const Schedule& schedule);

// True when any rank's list holds a send or receive.
bool is_lowered(const Schedule& schedule);

// The schedule with every send and receive removed (inverse of lower()).
Schedule compute_only(const Schedule& schedule);

}  // namespace pipetrain::schedule
