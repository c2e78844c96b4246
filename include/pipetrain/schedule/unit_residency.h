// ZeRO-3 by unit: when each of a rank's parameter units is whole during one training step.
//
// A unit is what ZeRO-3 gathers and frees as one: the sharded parameters of one layer of a stage
// (train/sharded_optimizer.h, ZeroOptions::unit). A stage numbers its units 0 .. U_j - 1 in layer
// order, and uses them in a fixed order per action (stage/stage.h, StageParameterHooks):
//
//   F j i              0, 1, .. U-1
//   B j i, I j i       a checkpointed i recomputes first: 0 .. U-1; then U-1 .. 0
//   W j i              0 .. U-1
//
// so a rank's action list gives the order of every use in the step (unit_uses). The plan
// (plan_units) walks that order and decides, after each use:
//
//   release   the unit just used, unless its next use comes soon: fewer than
//             max_reuse_distance bytes of other units are used before it (DeepSpeed's
//             stage3_max_reuse_distance); -1 frees it always
//   gather    the units of the next uses that are not whole, started now so that their
//             all-gathers run behind the compute, while their bytes fit prefetch_bytes
//             (stage3_prefetch_bucket_size; at least the next unit when it is > 0) and every unit
//             whole or in flight fits max_live_bytes (stage3_max_live_parameters; 0: no bound)
//
// A use whose unit is not whole waits for its gather (starting it if no prefetch did). Every unit
// is freed after its last use of the step: the step() that follows changes every shard.
//
//   rank 1 of 1F1B (last stage, 3 units, 2 micro-batches), reuse distance 0, prefetch 1 unit:
//     F0: 0 1 2   B0: 2 1 0   F1: 0 1 2   B1: 2 1 0
//         ^gather 1 after 0 ... unit 2 kept from F0 into B0 (its next use is the next one)
//
// Torch-free, pure: a function of the uses and the units' bytes.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "pipetrain/schedule/checkpoint_mode.h"
#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

// One use of a unit, by the rank's unit id: stage j's unit u is id first_unit[j] + u, with stages
// numbered in ascending order (unit_ids).
using UnitId = int;

// Global ids of a rank's units: stage j's units are [first[j], first[j] + count[j]).
struct UnitIds {
  std::map<int, int> first;  // by stage
  std::map<int, int> count;  // by stage
  int total = 0;
};
// `units`: per stage the rank runs, its unit count (stages without units may be left out).
UnitIds unit_ids(const std::map<int, int>& units);

// The units rank r uses in time order over one training step of `s` (compute-only or lowered),
// with micro-batch i checkpointed as is_checkpointed(checkpoint, i, s.num_microbatches) says.
// `backward` (optional): per use, whether it is a backward's or a recompute's (1) or a forward's
// (0).
std::vector<UnitId> unit_uses(const Schedule& s, int r, const UnitIds& ids, Checkpoint checkpoint,
                              std::vector<char>* backward = nullptr);

struct UnitPolicy {
  std::int64_t prefetch_bytes = 0;      // 0: gather each unit at its use
  std::int64_t max_live_bytes = 0;      // 0: no bound on the prefetches
  std::int64_t max_reuse_distance = 0;  // bytes; -1: free after every use
};

struct UnitStep {
  std::vector<UnitId> release;  // freed after the use, before the gathers
  std::vector<UnitId> gather;   // started after the use, in the order they will be used
};

struct UnitPlan {
  std::vector<UnitId> uses;
  std::vector<UnitId> first;    // gathers started before the first use
  std::vector<UnitStep> after;  // one per use
  // The most bytes whole or in flight at once (the used unit, those kept, those prefetched).
  std::int64_t peak_bytes = 0;
  // All-gathers per step (a unit gathered again after a release counts again).
  int gathers = 0;
};

// REQUIRES: every id of `uses` < unit_bytes.size() (pipetrain::BadInput), bytes >= 0.
UnitPlan plan_units(const std::vector<UnitId>& uses, const std::vector<std::int64_t>& unit_bytes,
                    const UnitPolicy& policy);

// The plan followed as the sharded optimizer follows it, with a unit's bytes whole and while its
// gather is in flight apart (a narrowed gather's buffer is smaller than the whole unit): the
// most bytes whole at once and the most in flight at once. A unit gathered at its use is in
// flight (with whatever was prefetched) and then whole. REQUIRES: one entry per unit in each.
struct UnitPeaks {
  std::int64_t whole = 0;
  std::int64_t in_flight = 0;
  std::int64_t together = 0;  // the most whole and in flight at one moment
};
UnitPeaks unit_peaks(const UnitPlan& plan, const std::vector<std::int64_t>& whole_bytes,
                     const std::vector<std::int64_t>& in_flight_bytes);

}  // namespace pipetrain::schedule
