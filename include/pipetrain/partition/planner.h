// Planner: from a ModelProfile, the number of ranks K and a per-rank memory limit, the fastest
// pipeline plan (schedule, micro-batch count, virtual stages, checkpoint mode, balance) that fits.
//
// Search space (PlannerOptions): schedules x micro-batch counts M (divisors of the batch) x
// checkpoint modes x virtual stages (generators.h's every family; V > 1 for interleaved-1f1b,
// interleaved-zb and looped-bfs, V = 2 for the V-shaped ones). For each candidate:
//   [1] balance: exact contiguous min-max split of the layers' time (F + B, + F again when
//       checkpointed) over the S = K*V stages;
//   [2] memory (memory.h) per rank; over the limit -> [1] again with every stage's memory capped
//       (min-max time subject to the cap); still over -> rejected;
//   [3] step time: simulate() with per-stage F/B/I/W from the profile, the transfer latency of the
//       largest boundary tensor as comm, plus the slowest rank's optimizer update.
// Candidates are visited in order of a lower bound on their step time (the busiest rank's work);
// once the bound exceeds the top-th best simulated time the rest are pruned, which keeps a
// 64-rank, 512-micro-batch space to seconds.
//
//   The zero-bubble families (zb-*, v-half, v-min, interleaved-zb, dualpipev) are planned without
//   checkpointing (a recompute before I would hold the activations until W anyway);
//   interleaved-1f1b with V = 1 is skipped when 1f1b is searched (same schedule); dualpipev only
//   where K is even and M >= 2K.
//
// Thread-safety: pure functions.
// REQUIRES: ranks >= 1 and a profile that validate() accepts (pipetrain::BadInput otherwise).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pipetrain/partition/memory.h"
#include "pipetrain/partition/profile.h"

namespace pipetrain::partition {

struct PlannerOptions {
  int ranks = 2;                        // K
  std::int64_t memory_limit_bytes = 0;  // per rank; 0 = no limit
  // Search space; an empty list means the default written beside it.
  std::vector<std::string> schedules;        // empty: schedule_names(), every family
  std::vector<int> microbatch_counts;        // powers of two dividing the batch, and the batch
  std::vector<Checkpoint> checkpoint_modes;  // never, except_last, always
  std::vector<int> virtual_stages;      // 1, 2, 4: V > 1 for interleaved-*, looped-bfs; 2 V-shaped
  double optimizer_state_multiple = 0;  // SGD 0, momentum 1, Adam 2 (memory and update)
  // The rest of the memory model (memory.h, predict_memory) the plans' peaks and the limit use:
  // ZeRO stage and data-parallel replicas of each rank, one process per rank (transport buffers).
  int zero = 0;
  bool reshard_after_forward = false;  // ZeRO 3's policy (schedule/residency.h)
  ZeroMemoryPolicy zero_policy;        // ZeRO's other policies (memory.h)
  bool offload_optimizer = false;      // ZeRO-Offload: the optimizer's shard in host memory
  // With offload_optimizer, ZeRO-Infinity's files (MemoryModelOptions' fields of these names):
  // the optimizer state, the parameter shards (ZeRO 3) and their gradient (CPU stages) in files,
  // the host holding the offload buffers' pool (offload_buffer_bytes a rank).
  bool optimizer_state_in_files = false;
  bool parameters_in_files = false;
  bool gradients_in_files = false;
  std::int64_t offload_buffer_bytes = 0;
  int data_parallel = 1;
  int expert_parallel = 1;  // MemoryModelOptions::expert_parallel
  bool processes = false;
  // ZeRO 3 under bf16/fp16 (MemoryModelOptions::cast_gathers): the layers' cast_parameter_bytes
  // are gathered at 2 bytes an element.
  bool cast_gathers = false;
  int top = 10;  // plans kept in the ranked table
};

// One fully specified plan and what the model predicts for it.
struct Plan {
  std::string schedule;
  int ranks = 0;
  int microbatches = 0;  // M (the runtime's "chunks")
  int virtual_stages = 1;
  Checkpoint checkpoint = Checkpoint::kNever;
  std::vector<int> balance;  // layers per stage, S = ranks * virtual_stages entries
  std::int64_t microbatch_size = 0;

  double predicted_step_seconds = 0;  // makespan + update (+ step overhead, ranks > 1)
  double makespan_seconds = 0;        // simulated forward/backward part
  double update_seconds = 0;          // slowest rank's optimizer update
  double bubble_fraction = 0;
  std::vector<double> busy_seconds_per_rank;  // simulated compute per rank (sends included)
  std::vector<std::int64_t> peak_memory_per_rank;
  std::int64_t peak_memory_bytes = 0;  // max over ranks
  std::vector<int> peak_inflight;      // per stage, micro-batches
  bool fits = true;                    // peak_memory_bytes <= limit (true without a limit)
  bool balanced_for_memory = false;    // the time-balanced split did not fit; [2] was used

  // "1f1b M=8 ckpt=never balance=3,3" (V shown when > 1).
  std::string describe() const;
};

// A plan that was run (step [5], recommend_measured) and its measured step time.
struct MeasuredPlan {
  Plan plan;  // its prediction scaled by the step [5] scale, like the ranked table's
  double measured_step_seconds = 0;
};

struct PlanReport {
  std::vector<Plan> ranked;  // fastest first, at most options.top, all within the limit
  // When nothing fits: the smallest per-rank limit that some candidate meets (with the
  // memory-minimising balance), and that candidate. 0 when a plan was found or no limit given.
  std::int64_t smallest_fitting_limit = 0;
  Plan smallest_fitting_plan;
  int candidates = 0;       // (schedule, M, V, checkpoint) combinations considered
  int simulated = 0;        // of those, how many were simulated
  int pruned = 0;           // skipped: their lower bound could not beat the table
  int rejected_memory = 0;  // no balance fits the limit
  double planning_seconds = 0;

  // Step [5] (recommend_measured): the plans that were run; the recommended plan is the one of
  // them that measured fastest, ranked[recommended_index] (the table gains that plan when it was
  // not in it, e.g. the default). Empty: recommended by prediction alone (index 0).
  std::vector<MeasuredPlan> measured;
  std::size_t recommended_index = 0;

  bool found() const { return !ranked.empty(); }
  const Plan& recommended() const { return ranked.at(recommended_index); }
};

PlanReport plan_pipeline(const ModelProfile& profile, const PlannerOptions& options);

// Predicts one plan as given (its balance included; an empty balance means the time-balanced
// one). Used for the hand-written default and by `pipetrain plan --verify`.
// REQUIRES: balance empty or of size ranks*virtual_stages summing to the layer count.
Plan evaluate_plan(const ModelProfile& profile, const Plan& plan, const PlannerOptions& options);

// Same schedule, ranks, micro-batches, virtual stages, checkpoint mode and balance.
bool same_plan(const Plan& a, const Plan& b);

// The memory model's options for `plan`: its checkpoint mode with the planner's optimizer, ZeRO
// stage, replicas and process layout. What Plan::peak_memory_per_rank was predicted with.
MemoryModelOptions memory_model_options(const Plan& plan, const PlannerOptions& options);
// predict_memory() for `plan` (its schedule rebuilt): every rank's categories, whose totals are
// Plan::peak_memory_per_rank (`pipetrain plan --memory`).
std::vector<RankMemory> plan_memory(const ModelProfile& profile, const Plan& plan,
                                    const PlannerOptions& options);

// The plans worth running for recommend_measured: the ranked plans predicted at most `within`
// slower than the fastest (0.25: 25 %), at most `count` of them, then `reference` (the default a
// user would write; may be null) when it fits the limit and is not one of them.
std::vector<Plan> plans_to_measure(const PlanReport& report, const Plan* reference, int count,
                                   double within);

// Which of several plans run in turn to recommend. step_seconds[k] holds candidate k's timed
// steps in the order they ran (step s of every candidate in the same turn). Without a reference
// (reference >= the count): the shortest median step. With one (the hand-written default): the
// candidate whose steps took the lowest median ratio to the reference's step of the same turn, if
// that ratio is below 1 - margin; else the reference. A plan replaces the default only when it
// measured faster by more than the turns' noise. Throws pipetrain::BadInput for no candidates
// or a candidate without steps.
std::size_t choose_measured(const std::vector<std::vector<double>>& step_seconds,
                            std::size_t reference, double margin);

// Step [5] of the calibration (docs/PLANNER.md), once `candidates` (plans of this profile and
// options, e.g. from plans_to_measure) were run together and measured `measured_seconds[i]` per
// step (medians): profile.measured_step_scale is multiplied by the median over the candidates of
// measured over predicted, every prediction in `report` (and in the candidates kept in
// report.measured) is scaled alike, and candidates[chosen] (choose_measured) becomes the
// recommended plan; it joins the ranked table in predicted order when it was not in it. Throws
// pipetrain::BadInput for sizes that differ, no candidates, a time that is not positive or a
// chosen index out of range.
void recommend_measured(ModelProfile& profile, const PlannerOptions& options, PlanReport& report,
                        const std::vector<Plan>& candidates,
                        const std::vector<double>& measured_seconds, std::size_t chosen);

// The plan most users write by hand: 1f1b, `microbatches` chunks, layers split evenly by count,
// no checkpointing.
Plan default_plan(const ModelProfile& profile, int ranks, int microbatches = 4);

// Layers per stage splitting `layers` as evenly as possible by count (earlier stages get the
// extra layer).
std::vector<int> even_balance(int layers, int stages);

// Exact contiguous min-max partition of n items into `stages` non-empty parts, where
// cost(j, first, end) is the cost of items [first, end) as stage j and must not decrease when the
// range grows; feasible(j, first, end) (optional) must stay true when the range shrinks.
// Returns layers per stage, or an empty vector when no partition is feasible.
// O(stages * n * w) with w the longest feasible stage, <= O(stages * n^2).
std::vector<int> min_max_partition(int n, int stages,
                                   const std::function<double(int, int, int)>& cost,
                                   const std::function<bool(int, int, int)>& feasible = {});

// The micro-batch counts the planner tries when PlannerOptions::microbatch_counts is empty: the
// powers of two that divide `batch`, and `batch` itself. REQUIRES: batch >= 1.
std::vector<int> default_microbatch_counts(std::int64_t batch);

void to_json(nlohmann::json& out, const Plan& plan);
// Reads what to_json writes: the plan's shape (schedule, ranks, chunks, virtual_stages,
// checkpoint, balance) is required, the predicted figures are read where present. Throws
// nlohmann::json::exception on a missing or mistyped field, BadInput for an integer field that is
// not an integer in its type's range or an unknown checkpoint mode.
void from_json(const nlohmann::json& in, Plan& plan);
void to_json(nlohmann::json& out, const PlanReport& report);

// A plan from JSON text (what to_json writes), checked: a JSON object with the required fields of
// the right types, ranks, chunks and virtual stages >= 1, balance entries >= 1 and ranks x virtual
// stages of them, a schedule that takes that shape. Throws pipetrain::BadInput naming what is
// wrong (never a JSON library exception).
Plan parse_plan_json(std::string_view text);

}  // namespace pipetrain::partition
