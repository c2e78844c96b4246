// Zero Bubble H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Figure 3 / ZB-H1):
// the backward is split into I (input gradient, on the critical path: the stage before waits for
// it) and W (weight gradient, needed only by the optimizer step). Rank r delays r of its W's, so
// the I's travel down the pipeline sooner, and the delayed W's fill the tail bubble.
//
//   K=3, M=6 (F = I = W = 1 unit)
//   rank 0  0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0F4 0I2 0W2 0F5 0I3 0W3 0I4 0W4 0I5 0W5
//   rank 1      1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1F4 1I3 1W2 1F5 1I4 1W3 1I5 1W4 1W5
//   rank 2          2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 ...         2I5 2W3 2W4 2W5
//
// Sections on rank r (each capped by what is left of the M micro-batches):
//   [1] warm-up:  K-r-1 forwards                        (as 1F1B)
//   [2] F I:      r times a forward and an input backward, W delayed
//   [3] F I W:    while forwards remain
//   [4] I W:      while input backwards remain
//   [5] W:        the r delayed weight backwards
// After [1] and [2] rank r holds K-1 micro-batches whose W has not run, so at most min(K, M)
// are in flight on every rank: the peak of 1F1B's stage 0, the "same memory as 1F1B" of the
// paper. With F = I = W the bubble per rank is (K-1)(F + I - W) = K-1 units for M >= K, a third
// of 1F1B's (K-1)(F + I + W).
// The section structure follows the ZB-H1 pipeline of the paper authors' DeepSpeed port.
#include <algorithm>

#include "generator_util.h"
#include "pipetrain/schedule/generators.h"

namespace pipetrain::schedule {

Schedule zero_bubble_h1(int ranks, int microbatches) {
  Schedule schedule = detail::empty_schedule("zb-h1", ranks, microbatches, 1);
  for (int r = 0; r < ranks; ++r) {
    auto& list = schedule.actions[r];
    list.reserve(3 * microbatches);
    int forward = 0;
    int input = 0;
    int weight = 0;
    auto emit = [&](Op op, int& next) { list.push_back({r, op, next++}); };
    const int warmup = std::min(ranks - r - 1, microbatches);
    for (int n = 0; n < warmup; ++n) emit(Op::kForward, forward);  // [1]
    for (int n = 0; n < r && forward < microbatches; ++n) {        // [2]
      emit(Op::kForward, forward);
      emit(Op::kBackwardInput, input);
    }
    while (forward < microbatches) {  // [3]
      emit(Op::kForward, forward);
      emit(Op::kBackwardInput, input);
      emit(Op::kBackwardWeight, weight);
    }
    while (input < microbatches) {  // [4]
      emit(Op::kBackwardInput, input);
      emit(Op::kBackwardWeight, weight);
    }
    while (weight < microbatches) emit(Op::kBackwardWeight, weight);  // [5]
  }
  return schedule;
}

}  // namespace pipetrain::schedule
