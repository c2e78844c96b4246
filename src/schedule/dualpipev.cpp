// DualPipeV (DeepSeek, the "cut-in-half" DualPipe of DeepSeek-V3's training): the V placement
// (rank r holds chunk 0 = stage r and chunk 1 = stage 2K-1-r), a warm-up that fills both
// chunks, then a steady phase of overlapped pairs: the forward of one chunk issued together
// with the full backward of the other, so that on a GPU each one's communication hides behind
// the other's compute. Here a pair is its two actions one after the other (F then B): the order
// and the memory are exact, the overlap is not modelled.
//
//   K=2, M=4       F0 = forward of chunk 0, B1 = backward of chunk 1, (F B) = a pair
//   rank 0  0F0 0F1 0F2 3F0 3I0 3W0 3F1 (0F3 3B1) (3F2 0B0) 3B2 (3F3 0B1) 3B3 0I2 0W2 0I3 0W3
//
// The eight phases on rank r (counts from DualPipeV's published algorithm; micro-batches go in
// order on each chunk and each op):
//   [1] 2(K-r-1)      F0                       fill the way down
//   [2] r+1           F0, F1                   both chunks start
//   [3] K-r-1         I1, W1, F1               split backward keeps the bubble short
//   [4] M-2K+r+1      (F0 B1), (F1 B0)         the steady state: two pairs
//   [5] K-r-1         B1, (F1 B0)
//   [6] r+1           B1, B0                   from the middle on, the backward is split (I),
//                                              first on B1 for odd ranks, on B0 for even
//   [7] K-r-1         W, I0                    W of the oldest split backward
//   [8] r+1           W                        the rest
// REQUIRES: K even (DeepSeek's DualPipe pairs the ranks) and M >= 2K (the steady phase of
// rank 0 needs it).
#include <deque>
#include <stdexcept>

#include "generator_util.h"
#include "pipetrain/base/error.h"
#include "pipetrain/schedule/auto_schedule.h"
#include "pipetrain/schedule/generators.h"

namespace pipetrain::schedule {
namespace {

// One rank's list, with the per-chunk micro-batch counters and the split backwards awaiting W.
class RankList {
 public:
  RankList(int ranks, int rank, std::vector<Action>& out)
      : stage_{rank, 2 * ranks - 1 - rank}, out_(out) {}

  void forward(int chunk) { out_.push_back({stage_[chunk], Op::kForward, next_f_[chunk]++}); }
  void backward(int chunk, bool split) {
    const int i = next_b_[chunk]++;
    if (split) {
      out_.push_back({stage_[chunk], Op::kBackwardInput, i});
      waiting_.push_back({stage_[chunk], Op::kBackwardWeight, i});
    } else {
      out_.push_back({stage_[chunk], Op::kBackward, i});
    }
  }
  void weight() {
    if (waiting_.empty()) return;
    out_.push_back(waiting_.front());
    waiting_.pop_front();
  }
  // A pair: on the CPU the forward, then the backward.
  void pair(int forward_chunk, int backward_chunk) {
    forward(forward_chunk);
    backward(backward_chunk, false);
  }

 private:
  int stage_[2];
  int next_f_[2] = {0, 0};
  int next_b_[2] = {0, 0};
  std::deque<Action> waiting_;
  std::vector<Action>& out_;
};

}  // namespace

Schedule dualpipe_v(int ranks, int microbatches) {
  Schedule schedule = detail::empty_schedule("dualpipev", ranks, microbatches, 2);
  schedule.stage_rank = v_placement(ranks);
  const int K = ranks;
  const int M = microbatches;
  if (const std::string why = shape_error("dualpipev", K, M, 2); !why.empty()) {
    throw BadInput(why);
  }
  for (int r = 0; r < K; ++r) {
    RankList rank(K, r, schedule.actions[r]);
    for (int n = 0; n < 2 * (K - r - 1); ++n) rank.forward(0);  // [1]
    for (int n = 0; n < r + 1; ++n) {                           // [2]
      rank.forward(0);
      rank.forward(1);
    }
    for (int n = 0; n < K - r - 1; ++n) {  // [3]
      rank.backward(1, true);
      rank.weight();
      rank.forward(1);
    }
    for (int n = 0; n < M - 2 * K + r + 1; ++n) {  // [4]
      rank.pair(0, 1);
      rank.pair(1, 0);
    }
    for (int n = 0; n < K - r - 1; ++n) {  // [5]
      rank.backward(1, false);
      rank.pair(1, 0);
    }
    bool split = false;
    for (int n = 0; n < r + 1; ++n) {  // [6]
      if (n == (r + 1) / 2 && r % 2 == 1) split = true;
      rank.backward(1, split);
      if (n == (r + 1) / 2 && r % 2 == 0) split = true;
      rank.backward(0, split);
    }
    for (int n = 0; n < K - r - 1; ++n) {  // [7]
      rank.weight();
      rank.backward(0, true);
    }
    for (int n = 0; n < r + 1; ++n) rank.weight();  // [8]
  }
  return schedule;
}

}  // namespace pipetrain::schedule
