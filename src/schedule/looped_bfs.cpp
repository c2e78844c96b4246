// Looped BFS (Lamy-Poirier, "Breadth-First Pipeline Parallelism", 2023; torch's
// ScheduleLoopedBFS): V chunks per rank placed as interleaved 1F1B (stage j on rank j % K), but
// each rank runs every micro-batch through one chunk before the next: breadth first.
//
//   K=2, M=2, V=2: stages 0,2 on rank 0 and 1,3 on rank 1
//   rank 0  0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1
//   rank 1      1F0 1F1 3F0 3F1 3B0 3B1 1B0 1B1
//
// Rank r: for chunk c = 0..V-1, F of micro-batches 0..M-1 on stage c*K + r; then for chunk
// c = V-1..0, B of micro-batches 0..M-1. Like GPipe it stashes all M micro-batches on every
// chunk, and like interleaving its fill and drain are V times shorter than GPipe's. torch runs
// each chunk's backwards in reverse micro-batch order; with equal costs the makespan is the same.
#include "generator_util.h"
#include "pipetrain/schedule/generators.h"

namespace pipetrain::schedule {

Schedule looped_bfs(int ranks, int microbatches, int virtual_stages) {
  Schedule schedule = detail::empty_schedule("looped-bfs", ranks, microbatches, virtual_stages);
  for (int r = 0; r < ranks; ++r) {
    auto& list = schedule.actions[r];
    list.reserve(2 * static_cast<std::size_t>(microbatches) * virtual_stages);
    for (int c = 0; c < virtual_stages; ++c) {
      for (int i = 0; i < microbatches; ++i) list.push_back({c * ranks + r, Op::kForward, i});
    }
    for (int c = virtual_stages - 1; c >= 0; --c) {
      for (int i = 0; i < microbatches; ++i) list.push_back({c * ranks + r, Op::kBackward, i});
    }
  }
  return schedule;
}

}  // namespace pipetrain::schedule
