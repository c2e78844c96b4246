// auto_schedule(): builds a zero-bubble schedule by simulating it, the Zero Bubble paper's
// heuristic (Qi et al., ICLR 2024, section 3.2): every rank, whenever it is free, runs the most
// urgent action whose inputs have arrived, and fills the time it would otherwise wait with the
// weight-gradient passes (W) that nothing waits for.
//
//   rank free at time t:  [1] an input backward I (or B) whose gradient has arrived
//                         [2] else a forward F whose activation has arrived, if the rank's
//                             memory limit allows one more stashed micro-batch
//                         [3] else a pending W (oldest first): fills the bubble, frees memory
//                         [4] else wait for the next arrival
//
// The limit counts stashed activations as SimulationResult::peak_rank_activations does: in units
// of the rank's whole share of the model, a micro-batch held by one of a rank's n chunks counting
// 1/n, held from its F until its W (or B). A forward on an earlier chunk of a rank that holds a
// later chunk of the same micro-batch keeps room for that later chunk, so the limit never
// deadlocks the V and interleaved placements.
//
// Refinement: the engine runs under the 16 combinations of four tie-breaks (which stage's
// gradient goes first; a forward as early as a gradient goes first; with a forward held back by
// the limit, a W before a ready I; room kept for a later chunk only while no micro-batch holds
// one on the rank) and returns the run with the smallest simulated makespan on options.costs.
// Runs that the last tie-break lets deadlock are dropped; the first one never deadlocks.
//
// The named zero-bubble families are this engine with a placement and a limit (generators.h):
// zb-h2 (limit 2K-1), v-half / v-min (V placement, limits about K/2 and K/3), interleaved-zb
// (limit K), zb-auto (measured costs, any limit, the best of several). zb-v is built directly.
//
// Thread-safety: pure functions. Cost: 16 x O(actions * stages per rank * K), plus a simulate()
// of each run.
#pragma once

#include <string>
#include <vector>

#include "pipetrain/schedule/schedule.h"
#include "pipetrain/schedule/simulate.h"

namespace pipetrain::schedule {

struct AutoScheduleOptions {
  std::string name = "zb-auto";
  int ranks = 1;         // K
  int microbatches = 1;  // M
  // Stage j runs on rank stage_rank[j]; empty = Megatron's placement (j % K) with
  // virtual_stages chunks per rank. See v_placement() for the V shape.
  std::vector<int> stage_rank;
  int virtual_stages = 1;
  // Action times and the comm latency, as simulate() reads them (per_action is not used).
  Costs costs;
  // Per rank, the most stashed activations at once (units above); empty = no limit, one value =
  // the same for every rank.
  std::vector<double> memory_limit;
  // true: I and W; false: one B per backward (no W to fill with).
  bool split_backward = true;
};

// Throws pipetrain::BadInput on K, M < 1, a placement that is not K ranks each holding at
// least one stage, a limit with neither 0, 1 nor K values, or a limit too small to run: the
// message names the rank and the smallest limit that runs.
Schedule auto_schedule(const AutoScheduleOptions& options);

// zb-auto: the best, by simulated makespan on options.costs, of auto_schedule() with the split
// backward and without, and (with the plain placement) of zb-h1, zb-h2 and 1F1B where they fit
// the limit. So at 1F1B's memory it is never slower than zb-h1, and at 2K-1 never slower than
// zb-h2 (both simulated on the same costs).
Schedule zero_bubble_auto(const AutoScheduleOptions& options);

// The V shape (zb-v, DualPipeV): 2K stages, rank r holds stages r and 2K-1-r, so a micro-batch
// goes down the ranks and back up, and rank 0 holds the first and the last stage.
std::vector<int> v_placement(int ranks);

}  // namespace pipetrain::schedule
