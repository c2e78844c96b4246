// Forward/backward pairs: the actions of a lowered schedule that one rank can run at the same
// time, a forward of one micro-batch beside a backward of another (DualPipe's overlapped F&B,
// Megatron's combined 1F1B), so that what one of them waits for (an expert all-to-all) is
// covered by the other's compute (PipeOptions::overlap_expert_exchanges).
//
// pair_forwards_with_backwards walks each rank's compute actions in order; two that follow one
// another (only sends and receives between them) become a pair when one is an F and the other a
// B or an I, of different micro-batches, and the schedule stays runnable with the pair's
// receives moved before both and its sends after both:
//
//   before   RF(i) F(i) SF(i) RB(m) B(m) SB(m)
//   after    RF(i) RB(m) [F(i) B(m)] SF(i) SB(m)      F(i) and B(m) may now run together
//
// "Runnable" is validate()'s dry run (validate.h [5]) with each pair's two actions in sequence:
// neither needs what the other makes (other micro-batches), so running them together is the
// same as either order, and the dry run proves no rank then waits for a pair that waits for it.
// A pair the dry run refuses stays two actions. Every replica of a rank gets the same pairs (the
// walk is deterministic), which the collectives inside them need.
//
// Thread-safety: pure function.
#pragma once

#include <vector>

#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

struct ForwardBackwardPairs {
  Schedule schedule;  // the reordered lowered schedule
  // [r][a]: rank r's actions a and a + 1 are a pair (a forward and a backward, either order).
  std::vector<std::vector<char>> starts;
  int pairs = 0;  // over all ranks
};

// REQUIRES: a lowered schedule (or one of a single stage, which sends nothing) that passes
// validate() (pipetrain::BadInput otherwise).
ForwardBackwardPairs pair_forwards_with_backwards(const Schedule& lowered);

}  // namespace pipetrain::schedule
