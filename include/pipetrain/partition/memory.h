// Memory model: the peak bytes a rank holds during one training step of a pipeline plan.
//
// Per stage j (layers [a, b) of the model), for micro-batch size m:
//   parameters   P_j = sum of the layers' parameter bytes
//   gradients    P_j                      (one gradient buffer per parameter)
//   optimizer    P_j * optimizer_state_multiple   (SGD 0, momentum 1, Adam 2)
//   activations  with n = peak micro-batches in flight on j (the schedule's structure: F started,
//                backward (B, or W when split) not finished; simulate()'s peak_activations),
//                in = bytes of the stage input, body = sum of the layers' activation bytes:
//     never        n * (in + body)
//     always       n * in + body           inputs only, plus one micro-batch being recomputed
//     except_last  n * in + body (+ body when the last micro-batch, which is not checkpointed,
//                  is still stashed while another one is recomputed: 1F1B yes, GPipe no)
// A rank holding several stages (interleaving) holds the sum of their stashes and parameter
// terms, plus the largest single recompute (a rank recomputes one micro-batch at a time).
//
// Not modelled: transient gradient buffers inside a backward, allocator fragmentation, the
// framework's own buffers, the loss. docs/PLANNER.md gives the measured gap.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pipetrain/partition/profile.h"
#include "pipetrain/schedule/checkpoint_mode.h"
#include "pipetrain/schedule/schedule.h"

namespace pipetrain::partition {

// What the schedule's order implies for one stage's activation memory.
struct StageResidency {
  int peak_inflight = 0;  // micro-batches stashed at once at the peak
  // The last micro-batch (never checkpointed under except_last) is alive while another
  // micro-batch of this stage runs its backward (and so its recompute).
  bool last_alive_during_recompute = false;
};

// One entry per stage, from the compute-only order of each rank (a rank runs its list in order,
// so the list order is the time order; no timing needed).
std::vector<StageResidency> stage_residency(const schedule::Schedule& schedule);

struct StageMemory {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;
  std::int64_t stashed_activations = 0;    // held across micro-batches
  std::int64_t recompute_activations = 0;  // one micro-batch rebuilt for its backward

  std::int64_t total() const {
    return parameters + gradients + optimizer_state + stashed_activations + recompute_activations;
  }
};

// The formula above for one stage. input_bytes and body_bytes are per micro-batch.
StageMemory stage_memory(std::int64_t parameter_bytes, std::int64_t input_bytes,
                         std::int64_t body_bytes, const StageResidency& residency,
                         Checkpoint checkpoint, double optimizer_state_multiple);

// Layers [first, end) as one stage at micro-batch size m: parameter, input and body bytes.
struct StageBytes {
  std::int64_t parameters = 0;
  std::int64_t input = 0;
  std::int64_t body = 0;
};
StageBytes stage_bytes(const ModelProfile& profile, std::int64_t first, std::int64_t end,
                       std::int64_t microbatch_size);

// Peak bytes per rank for `balance` (layers per stage, size S, summing to the layer count).
// REQUIRES: balance.size() == schedule.num_stages, every entry >= 1 (pipetrain::BadInput).
std::vector<std::int64_t> rank_peak_memory(const ModelProfile& profile,
                                           const std::vector<int>& balance,
                                           std::int64_t microbatch_size,
                                           const schedule::Schedule& schedule,
                                           const std::vector<StageResidency>& residency,
                                           Checkpoint checkpoint, double optimizer_state_multiple);

// "1.5 GiB", "512 MiB", "12 KiB", "100 B".
std::string format_bytes(std::int64_t bytes);
// "2GiB", "2 GiB", "512MiB", "1.5G", "1000000" (bytes), "64KB" (KB = 1000). Throws
// pipetrain::BadInput naming the text on anything else.
std::int64_t parse_bytes(std::string_view text);

}  // namespace pipetrain::partition
