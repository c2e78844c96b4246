// DeepSpeed's tuning ladder on pipetrain's memory model: the rungs its ZeRO documentation climbs
// until a model fits, each planned on the measured profile, stopping at the first that fits.
//
//   ZeRO 0 -> ZeRO 1 -> ZeRO 2 -> ZeRO 2 + optimizer offload (cpu) -> ZeRO 3
//          -> ZeRO 3 + parameter offload (cpu) -> ZeRO 3, optimizer and parameters in files (nvme)
//
// Each rung is planned (partition/planner.h: every schedule, micro-batch count and checkpoint
// mode) within the per-rank limit. Where the stages run on the CPU, a rank's host memory (what
// it offloads) is its memory too: a plan fits when its device and host bytes together are within
// the limit. The chosen rung's plan is then the fastest within the limit: the ladder backs off
// for speed inside the rung (recomputation, more micro-batches only where memory needs them).
// Rungs that cannot run are skipped, saying why: ZeRO 1-3 without replicas (they shard over
// --dp), and on CPU stages the parameter offload to cpu (the shards are in host memory already:
// ZeRO 3's rung). The step times are the planner's; the files' I/O is not in them.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/partition/planner.h"
#include "pipetrain/partition/profile.h"

namespace pipetrain::tune {

struct ZeroRung {
  std::string name;   // "ZeRO 2 + optimizer offload"
  std::string flags;  // "--zero 2 --offload-optimizer cpu"
  int zero = 0;
  bool offload_optimizer = false;  // to host memory
  bool offload_params = false;     // to host memory (ZeRO 3)
  bool nvme = false;               // the optimizer state and the parameter shards in files
};

// The seven rungs, in DeepSpeed's order.
const std::vector<ZeroRung>& zero_ladder();

// Why a walk does not try `rung` ("" where it does): a rung already chosen below it ("not
// needed"), ZeRO 1-3 without offload at one replica, the parameter offload to cpu on CPU stages.
std::string zero_rung_not_tried(const ZeroRung& rung, bool chosen_below, int replicas,
                                bool cpu_stages);

struct ZeroLadderStep {
  ZeroRung rung;
  bool tried = false;  // false: skipped (`why` says why), or not needed after the chosen one
  bool fits = false;
  std::optional<partition::Plan> plan;  // the fastest plan within the limit, where one fits
  std::int64_t rank_bytes = 0;          // its largest rank: device and host (on CPU stages) bytes
  std::int64_t machine_bytes = 0;       // every rank of every replica, added
  std::string why;                      // why the ladder moved on, or stopped here
};

struct ZeroLadder {
  std::vector<ZeroLadderStep> steps;  // every rung, in order
  int chosen = -1;                    // the first rung that fits (-1: none)
};

// Walks the ladder for `profile` under `options` (ranks, replicas, schedules, optimizer state
// and the per-rank memory_limit_bytes, which must be > 0; its ZeRO and offload fields are each
// rung's). `offload_buffer_bytes`: the nvme rung's pool a rank (--offload-buffer-bytes x count).
// Throws BadInput without a limit.
ZeroLadder walk_zero_ladder(const partition::ModelProfile& profile,
                            const partition::PlannerOptions& options, bool cpu_stages,
                            std::int64_t offload_buffer_bytes);

// One line per rung ("  ZeRO 0  (--zero 0)  needs 3.10 GiB a rank, 6.20 GiB for the machine,
// 0.52 s/step: over the limit of 2.00 GiB"), then the chosen rung and its plan.
std::string zero_ladder_text(const ZeroLadder& ladder, std::int64_t limit);

}  // namespace pipetrain::tune
