// 1F1B (PipeDream-flush): warm up with a few forwards, then alternate one forward and one
// backward, then drain the remaining backwards.
//
//   K=3, M=4     warm-up | steady (F, B pairs)     | cool-down
//   rank 0   0F0 0F1     | 0F2 0B0 0F3 0B1         | 0B2 0B3      warm-up = K-r-1 = 2
//   rank 1   1F0         | 1F1 1B0 1F2 1B1 1F3 1B2 | 1B3          warm-up = 1
//   rank 2               | 2F0 2B0 2F1 2B1 ... 2B3 |              warm-up = 0
//
// Warm-up is min(K-r-1, M) so M < K works (then a rank may have no steady phase at all). Stage r
// holds at most warm-up + 1 = min(K-r, M) stashed activations, against M for GPipe; the bubble
// is the same, (K-1)/(M+K-1) of the time with equal stage costs.
#include <algorithm>

#include "generator_util.h"
#include "pipetrain/schedule/generators.h"

namespace pipetrain::schedule {

Schedule one_f_one_b(int ranks, int microbatches) {
  Schedule schedule = detail::empty_schedule("1f1b", ranks, microbatches, 1);
  for (int r = 0; r < ranks; ++r) {
    auto& list = schedule.actions[r];
    const int warmup = std::min(ranks - r - 1, microbatches);
    for (int i = 0; i < warmup; ++i) list.push_back({r, Op::kForward, i});
    for (int i = warmup; i < microbatches; ++i) {
      list.push_back({r, Op::kForward, i});
      list.push_back({r, Op::kBackward, i - warmup});
    }
    for (int i = microbatches - warmup; i < microbatches; ++i)
      list.push_back({r, Op::kBackward, i});
  }
  return schedule;
}

}  // namespace pipetrain::schedule
