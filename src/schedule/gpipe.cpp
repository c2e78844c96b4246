// GPipe (fill-drain): every rank runs all forwards, then all backwards.
//
//   K=3, M=4          step k ->
//   rank 0   0F0 0F1 0F2 0F3                 0B0 0B1 0B2 0B3
//   rank 1       1F0 1F1 1F2 1F3         1B0 1B1 1B2 1B3
//   rank 2           2F0 2F1 2F2 2F3 2B0 2B1 2B2 2B3
//
// Backwards run in micro-batch order 0..M-1 (as torch.distributed.pipelining does); with equal
// costs the timing equals the reverse order GPipe's paper draws. All M activations are stashed
// at the turn, the price of the simple order. M = 1 is naive model parallelism.
#include "generator_util.h"
#include "pipetrain/schedule/generators.h"

namespace pipetrain::schedule {

Schedule gpipe(int ranks, int microbatches) {
  Schedule schedule = detail::empty_schedule("gpipe", ranks, microbatches, 1);
  for (int r = 0; r < ranks; ++r) {
    auto& list = schedule.actions[r];
    for (int i = 0; i < microbatches; ++i) list.push_back({r, Op::kForward, i});
    for (int i = 0; i < microbatches; ++i) list.push_back({r, Op::kBackward, i});
  }
  return schedule;
}

}  // namespace pipetrain::schedule
