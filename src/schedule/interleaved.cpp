// Interleaved 1F1B (Megatron-LM): each rank holds V model chunks (virtual stages); stage j runs
// on rank j % K, so a micro-batch visits every rank V times and the fill/drain bubble shrinks by V.
//
//   K=2, M=4, V=2: stages 0,2 on rank 0 and 1,3 on rank 1; rounds of K=2 micro-batches
//   rank 0  0F0 0F1 2F0 2F1 | 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 | 2B2 2B3 0B2 0B3
//   rank 1  1F0 1F1         | 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 | 1B2 1B3
//           warm-up           steady: one F, one B                             cool-down
//
// Order on rank r. Micro-batches are cut into rounds; within a round the forwards go chunk by
// chunk (chunk c = stage c*K + r), all micro-batches of the round per chunk, and the backwards
// go the same way with the chunks reversed:
//   forwards:  round 0: c=0 (i in round 0), c=1 (i in round 0), ..., then round 1, ...
//   backwards: round 0: c=V-1 ..., c=0, then round 1, ...
// Warm-up = (V-1)*R0 + 2*(K-1-r) forwards (R0 = size of the first round), capped at M*V; then
// one forward / one backward; then the remaining backwards. This is Megatron's formula.
//
// Any M >= 1 works: Megatron needs M % K == 0 (rounds of exactly K). We use max(1, M / K) rounds
// of sizes as equal as possible (each >= K when M >= K; larger rounds first), as
// torch.distributed.pipelining does when M divides evenly, and one round of M when M < K. Every
// K in 1..16, M in 1..64, V in 1..4 was dry-run without deadlock (tests/schedule).
#include <algorithm>

#include "generator_util.h"
#include "pipetrain/schedule/generators.h"

namespace pipetrain::schedule {

Schedule interleaved_one_f_one_b(int ranks, int microbatches, int virtual_stages) {
  Schedule schedule =
      detail::empty_schedule("interleaved-1f1b", ranks, microbatches, virtual_stages);
  const int rounds = std::max(1, microbatches / ranks);
  std::vector<int> round_start(rounds + 1, 0);
  for (int g = 0; g < rounds; ++g) {
    const int size = microbatches / rounds + (g < microbatches % rounds ? 1 : 0);
    round_start[g + 1] = round_start[g] + size;
  }
  const int first_round = round_start[1];
  const int total = microbatches * virtual_stages;
  for (int r = 0; r < ranks; ++r) {
    std::vector<Action> forwards;
    std::vector<Action> backwards;
    forwards.reserve(total);
    backwards.reserve(total);
    for (int g = 0; g < rounds; ++g) {
      for (int c = 0; c < virtual_stages; ++c) {
        for (int i = round_start[g]; i < round_start[g + 1]; ++i) {
          forwards.push_back({c * ranks + r, Op::kForward, i});
        }
      }
      for (int c = virtual_stages - 1; c >= 0; --c) {
        for (int i = round_start[g]; i < round_start[g + 1]; ++i) {
          backwards.push_back({c * ranks + r, Op::kBackward, i});
        }
      }
    }
    const int warmup = std::min((virtual_stages - 1) * first_round + 2 * (ranks - 1 - r), total);
    auto& list = schedule.actions[r];
    list.reserve(2 * total);
    for (int n = 0; n < warmup; ++n) list.push_back(forwards[n]);
    for (int n = 0; n < total - warmup; ++n) {
      list.push_back(forwards[warmup + n]);
      list.push_back(backwards[n]);
    }
    for (int n = total - warmup; n < total; ++n) list.push_back(backwards[n]);
  }
  return schedule;
}

}  // namespace pipetrain::schedule
