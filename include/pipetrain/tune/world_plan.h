// plan_world: the best pipeline x tensor x data parallel layouts of a Llama-family model on a
// world of N processes (`pipetrain plan --model DIR --world N`; docs/TENSOR_PARALLEL.md).
//
//   [1] layouts     every pp x tp x dp = N where tp divides the heads, the key/value heads, the
//                   vocabulary and the MLP width (check_llama_tensor_parallel), pp is at most the
//                   model's entries and dp divides the batch; with tp > 1 and a sequence tp
//                   divides, once without and once with sequence parallelism; a mixture of
//                   experts also with every ep > 1 dividing dp and its experts
//                   (parallel/expert_parallel.h); with max_context_parallel C > 1, also pp x tp x
//                   dp x cp = N for every cp up to C dividing the sequence into 2 cp chunks
//                   (ring) or cp chunks and the heads per tp rank (Ulysses); not a mixture's
//                   layouts with ep
//   [2] all-reduce  measured for each group size the layouts need (tp and dp), as that many
//                   processes of this program over Gloo on this machine: seconds(n) = latency +
//                   n / bytes_per_second, fitted through a small and a large message. An
//                   all-gather or reduce-scatter of n bytes counts latency + n / (2 x that rate)
//                   (half an all-reduce's ring traffic).
//   [3] profile     one decoder layer as one tp rank builds it, split over a mirror group
//                   (C10dGroup::mirror): the rank's parameters, activations and compute, on
//                   batch / dp rows (models/llama_profile.h); at cp > 1 the attention as one
//                   cp rank runs it over a mirror group, on its seq / cp tokens of each row
//   [4] collectives added to the profile's per-micro-batch times, n = rows x seq x hidden x
//                   element bytes:
//                     embedding   F: all-reduce n (sequence parallel: reduce-scatter)
//                     decoder     F and I (so B): 2 all-reduces n (sequence parallel: 2
//                                 all-gathers + 2 reduce-scatters)
//                     head        F: 2 all-reduces of rows x seq x 4 (the loss's max and sum;
//                                 sequence parallel: + all-gather n); I: all-reduce n (sequence
//                                 parallel: reduce-scatter)
//                   The weight gradient (W) of a split layer is local.
//                   ep > 1, each MoE layer: F the counts' all-to-all (E counts) and 2 of rows
//                   (dispatch, combine), I 2 more of rows, each
//                   of rows x seq x top-k x hidden x element bytes x (ep - 1) / ep, costed as
//                   half an all-reduce of that over ep processes (what a member sends, as a
//                   reduce-scatter); the profile ([3]) runs the layer as one ep rank holds it, fed
//                   as by identical members (balanced routing; --report-routing measures the
//                   imbalance a run has)
//                   cp > 1, each decoder layer (not overlapped with its compute): ring, F cp - 1
//                   passes of the key/value block, B cp passes of it with its gradients (k, v
//                   at the query heads: rows x seq / cp x heads x head_dim x element bytes
//                   each); Ulysses, F 4 all-to-alls of a rank's q, k, v, output, B 4 more, each
//                   of rows x seq / cp x heads x head_dim x element bytes x (cp - 1) / cp; a
//                   pass or all-to-all costed as half an all-reduce over cp processes
//   [5] plan        plan_pipeline (partition/planner.h) over pp ranks with dp replicas, ZeRO and
//                   the memory limit: the fastest schedule, micro-batches, checkpointing and
//                   balance of the layout, or why none fits
//   [6] data        + an all-reduce of the largest rank's parameter bytes over dp x cp (the
//                   runtime reduces gradients after the pipeline's last action; ZeRO's
//                   reduce-scatter + all-gather move as much); at ep > 1 its experts' bytes over
//                   the dp / ep replicas holding them instead
// The layouts are ranked by [5] + [6]. Not modelled: ranks sharing a machine's cores (each rank
// is taken to have its own device, as the profile ran alone), collectives overlapping compute.
//
// Processes: plan_world starts this program again (runtime/launcher.h) with `rank_arguments`
// followed by a job as one JSON argument; the program hands it to run_model_plan_rank
// (tune/model_plan.h), which runs the measurement.
//
// Thread-safety: runs measurements; one call at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "pipetrain/models/llama_config.h"
#include "pipetrain/partition/planner.h"
#include "pipetrain/runtime/distributed.h"
#include "pipetrain/stage/precision.h"
#include "pipetrain/tune/calibration.h"

namespace pipetrain::tune {

struct WorldPlanRequest {
  models::LlamaConfig config;
  torch::Tensor sample;  // int64 ids [B, T]: the mini-batch of the whole job (B split over dp)
  int world = 1;
  // Memory limit per rank, optimizer state, ZeRO, schedules, table size. `ranks`,
  // `data_parallel` and `processes` are set per layout.
  partition::PlannerOptions planner;
  Precision precision = Precision::kFloat32;
  // A mixture's layouts with ep > 1: their MoE layers' routed activations planned at this
  // imbalance, at most each ep's bound (models::apply_routing_imbalance); 1: balanced.
  double routing_imbalance = 1.0;
  // [1]: the largest context-parallel size to search (1: none), and its method.
  int max_context_parallel = 1;
  bool ulysses = false;
  int profile_repeats = 7, profile_warmup = 2;  // [3]: partition::ProfileOptions' repeats, warmup
  // Measured all-reduce per group size ([2]); a size not here is measured. Tests and callers
  // that measured already pass theirs.
  std::map<int, partition::TransferModel> allreduce;
  std::vector<std::string> rank_arguments;  // how this program is started as a rank
  Diagnostics diagnostics;
};

// One layout and its best plan.
struct WorldLayout {
  int pp = 1, tp = 1, dp = 1;
  bool sequence_parallel = false;
  int ep = 1;                        // a mixture's experts over ep of the dp replicas
  int cp = 1;                        // each sequence over cp ranks (per dp replica)
  double cp_seconds = 0;             // [4] at cp > 1: one micro-batch's passes, every layer
  bool found = false;                // a plan fits the limit
  partition::Plan plan;              // [5]'s best (found) or the smallest-memory candidate
  double pipeline_seconds = 0;       // [5]: the plan's predicted step, tp collectives included
  double tp_collective_seconds = 0;  // of that: the collectives one stage's rank waits per step
  double dp_reduce_seconds = 0;      // [6]
  double ep_all_to_all_seconds = 0;  // [4] at ep > 1: one micro-batch's, every MoE layer's
  double step_seconds = 0;           // [5] + [6]
  std::int64_t peak_memory_bytes = 0;
  // The largest rank's parameters + gradients + optimizer state under the plan: what the layout
  // and ZeRO divide, apart from the activations the plan's micro-batches and checkpointing hold.
  std::int64_t model_state_bytes = 0;
  std::int64_t smallest_fitting_limit = 0;  // not found: the least limit some plan meets
  std::string why;                          // one line: what decides its place

  // "pp2 x tp2 x dp1", " x cp2" with context parallelism, " sp" with sequence parallelism
  std::string name() const;
};

struct WorldPlanResult {
  std::vector<WorldLayout> ranked;                    // found, fastest first
  std::vector<WorldLayout> rejected;                  // nothing fits the memory limit
  std::map<int, partition::TransferModel> allreduce;  // [2], per group size
};

// Throws pipetrain::BadInput when no layout exists (a world no valid tp, pp and dp multiply to,
// naming them) or the sample is not ids [B, T]; what the measurements throw.
WorldPlanResult plan_world(const WorldPlanRequest& request);

// [2] in the ranks: the job run_model_plan_rank hands to measure_allreduce_on_rank.
nlohmann::json allreduce_job(std::int64_t large_bytes);
// Every rank's part of that job: per message size, the median over its trips of an all-reduce
// over the rank's tensor-parallel group, each trip started together (a barrier). Collective over
// the world (every rank runs it). Rank 0's result, null on the others.
nlohmann::json measure_allreduce_on_rank(Distributed& distributed, const nlohmann::json& job);
// The fit of [2] from rank 0's result.
partition::TransferModel allreduce_model_from(const nlohmann::json& result, int group_size);

// [4] A tensor-parallel rank's collectives per micro-batch added to the forward and backward of
// `profile`'s layers: a Llama model's entries in order (embedding, decoder layers, final norm,
// head), with `seq` positions of `hidden` features in `precision`; without sequence parallelism
// two all-reduces per decoder layer each way, with it four all-gathers or reduce-scatters, and
// the embedding's, the head's and the vocabulary-parallel loss's. Returns what they add to each
// layer's F + B per measured micro-batch size: added[k][layer].
std::vector<std::vector<double>> add_tensor_parallel_collectives(
    partition::ModelProfile& profile, bool sequence_parallel,
    const partition::TransferModel& allreduce, std::int64_t seq, std::int64_t hidden,
    Precision precision);
// The same as AutoPlanInput::tensor_parallel_collectives (tune/auto_plan.h) for a model of
// `config` on samples of `seq` positions.
std::function<void(partition::ModelProfile&, const partition::TransferModel&)>
llama_tensor_parallel_collectives(const models::LlamaConfig& config, std::int64_t seq,
                                  bool sequence_parallel, Precision precision);

std::string world_plan_text(const WorldPlanRequest& request, const WorldPlanResult& result,
                            int top);
nlohmann::json world_plan_json(const WorldPlanRequest& request, const WorldPlanResult& result);

}  // namespace pipetrain::tune
