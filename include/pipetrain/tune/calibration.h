// The measurements that calibrate the planner's cost model against this machine's runtime, shared
// by `pipetrain plan --model` and the auto plan of `pipetrain train` (tune/auto_plan.h). Nothing
// here prints: what a person may want to know (a step skipped, and why) goes to a Diagnostics
// callback.
//
//   in one process (the model, a sample batch)      on K processes (a Distributed job)
//   ------------------------------------------      ----------------------------------------------
//   measure_in_process: a plan as Pipe, timed       run_plan_on_rank: this rank's part of a plan
//   calibrate_in_process: steps [1]..[3]            ping_pong_on_rank: the transfer measurement
//                                                   calibrate_processes: step [4], from two
//                                                   plans run as processes (a callback)
//
// Calibration steps (docs/PLANNER.md):
//   [1] per-layer runtime overhead: gpipe on one stage vs the profile
//   [2] split-backward scale: zb-h1 on one stage vs the profile with [1]
//   [3] concurrent compute scale: the [1] step on K threads at once vs alone (K > 1)
//   [4] compute by micro-batch size, rank time per message, step overhead: gpipe with M = 2 vs
//       M = 32 run as K processes
//   [5] after planning: the best few plans and the hand-written default run together; their
//       median measured / predicted scales every prediction, the fastest measured is recommended
//       (recommend_by_measurement)
//
// Plans measured together take turns step by step (one step of each, round after round), so a
// slow spell of the machine slows all of them alike; [1] with [2], [4]'s two plans, [5]'s plans
// and --verify's two plans run so.
//
// Every measurement trains: it takes SGD steps (lr 1e-4) on the model it is given and leaves
// gradients behind. A caller that trains afterwards keeps a ModelStateGuard around it.
//
// Thread-safety: call from one thread; calibrate_in_process starts and joins its own threads.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "pipetrain/partition/planner.h"
#include "pipetrain/runtime/distributed.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/stage/batchnorm.h"
#include "pipetrain/stage/precision.h"

namespace pipetrain::tune {

// A line for a person about what planning does or skipped. kProgress: what runs now and how long
// it took; kWarning: a step that could not run, with the reason and what is assumed instead.
struct Diagnostic {
  enum class Kind { kProgress, kWarning };
  Kind kind = Kind::kProgress;
  std::string text;
};
// Receives each Diagnostic; empty: none is reported.
using Diagnostics = std::function<void(const Diagnostic&)>;

// What a timed run of a plan measured.
struct Measured {
  double median_seconds = 0;                // step time, zero_grad + train_step + SGD step
  std::vector<double> step_seconds;         // each timed step (processes: the slowest rank's)
  std::vector<int64_t> peak_stashed_bytes;  // per stage, from the runtime's accounting
  // Medians over the timed steps:
  std::vector<double> busy_seconds_by_rank;  // compute actions of a step, per rank
  double span_seconds = 0;                   // a step's first action start to its last action end

  // busy_seconds_by_rank averaged over the ranks.
  double busy_seconds_per_rank() const;
};

// Puts the default CPU random generator back as it was when the guard was made.
class RandomStateGuard {
 public:
  RandomStateGuard();
  ~RandomStateGuard();
  RandomStateGuard(const RandomStateGuard&) = delete;
  RandomStateGuard& operator=(const RandomStateGuard&) = delete;

 private:
  torch::Tensor state_;
};

// Puts the model's parameters and buffers (values, and no gradients), what its deferred batch
// norms tracked, and the default CPU random generator back as they were when the guard was made:
// profiling and calibration then leave no trace in the training that follows. With copy_parameters
// false the parameters' values are taken to stay as they are (a profile that takes no step; only
// their gradients are cleared), so the guard costs the buffers alone, not a second copy of the
// model.
class ModelStateGuard {
 public:
  explicit ModelStateGuard(torch::nn::Sequential& model, bool copy_parameters = true);
  ~ModelStateGuard();
  ModelStateGuard(const ModelStateGuard&) = delete;
  ModelStateGuard& operator=(const ModelStateGuard&) = delete;

 private:
  torch::nn::Sequential& model_;
  std::vector<torch::Tensor> parameters_;
  std::vector<torch::Tensor> buffers_;
  std::vector<std::pair<DeferredBatchNormImpl*, DeferredBatchNormImpl::Tracked>> tracked_;
  torch::Tensor generator_state_;
};

// Runs plans together, in turn step by step, `steps` timed steps each after 2 warm-up steps, and
// returns what each measured (same order): the in-process Pipe, K processes, or the ranks of a
// job.
using RunPlans =
    std::function<std::vector<Measured>(const std::vector<partition::Plan>& plans, int steps)>;

// Timed steps for plans run together so that one round takes at least `min_seconds` by their
// predicted step times (a short round is a snapshot of a machine whose speed changes for seconds
// at a time), at least `min_steps`, at most 200.
int steps_to_measure(const std::vector<partition::Plan>& plans, int min_steps, double min_seconds);

// `plans` run in this process together (a Pipe each, one worker thread per rank with `threads`
// intra-op threads, stages in `precision`, in turn step by step): `steps` timed steps each after
// 2 warm-up steps, MSE against zeros.
std::vector<Measured> measure_in_process(torch::nn::Sequential& model, const torch::Tensor& sample,
                                         const std::vector<partition::Plan>& plans, int threads,
                                         int steps, Precision precision = Precision::kFloat32);
Measured measure_in_process(torch::nn::Sequential& model, const torch::Tensor& sample,
                            const partition::Plan& plan, int threads, int steps,
                            Precision precision = Precision::kFloat32);

// Steps [1]..[3], run in profile.precision: sets profile.per_layer_overhead_seconds,
// split_backward_scale, concurrent_compute_scale / concurrent_ranks (planner.ranks of them) and
// calibrated. A model zb-h1 cannot train as one stage, or whose layers cannot be cloned, skips the
// step that needs it (a kWarning to `diagnostics` says which and why).
void calibrate_in_process(torch::nn::Sequential& model, const torch::Tensor& sample,
                          partition::ModelProfile& profile,
                          const partition::PlannerOptions& planner,
                          const Diagnostics& diagnostics = {});

// ---- K processes
// ---------------------------------------------------------------------------------

// A plan as the JSON a rank runs it from (partition::Plan's to_json, plus "threads" and
// "precision"), and a list of them.
nlohmann::json plan_to_run(const partition::Plan& plan, int threads,
                           Precision precision = Precision::kFloat32);
nlohmann::json plans_to_run(const std::vector<partition::Plan>& plans, int threads,
                            Precision precision = Precision::kFloat32);

// This rank's part of `runs` (plans_to_run) on DistributedPipe, the plans in turn step by step:
// `steps` timed steps each after 2 warm-up ones, each step started after an untimed barrier.
// Every rank of the job calls it. Returns per plan {"rank", "seconds": [per step],
// "busy_seconds", "span_seconds" (medians over the steps), "stashed": [{stage, bytes}]}.
nlohmann::json run_plans_on_rank(Distributed& distributed, torch::nn::Sequential& model,
                                 const torch::Tensor& sample, const nlohmann::json& runs,
                                 int steps);

// Each plan's step times from every rank's run_plans_on_rank result (per step the slowest rank,
// the median over steps). Throws TransportFailure naming a rank without a result.
std::vector<Measured> combine_rank_results(const std::vector<partition::Plan>& plans,
                                           const std::vector<std::optional<nlohmann::json>>& ranks);

// The transfer measurement: pipeline ranks 0 and 1 of replica 0 ping-pong bundles of each size in
// job["bytes"] (5 untimed, then job["trips"] timed round trips); every other rank returns at once.
// Pipeline rank 0 of replica 0 returns {"sizes": [{bytes, round_trip_seconds, send_seconds}]},
// every other rank null.
nlohmann::json ping_pong_on_rank(Distributed& distributed, const nlohmann::json& job);

// The job for ping_pong_on_rank that measures the transfer of `large`-byte messages, and the
// transfer model from its result: latency = half the 4-byte round trip, bandwidth from the large
// one, message_seconds = the sender's send() call.
nlohmann::json transfer_job(std::int64_t large);
partition::TransferModel transfer_model_from(const nlohmann::json& result);

// Boundary bytes of the largest cut of a mini-batch split in 4 (the default plan's micro-batches):
// the `large` size to measure the transfer with.
std::int64_t largest_boundary_bytes(const partition::ModelProfile& profile);

// Step [4], from gpipe with the even balance run as K processes with M = 2 and M = 32 (16 when
// 32 does not divide the batch), two rounds of both together, 5 timed steps each (`run` runs
// plans as K processes):
// [4a] the
// ranks' measured compute over the predicted at those two micro-batch sizes becomes the profile's
// process_compute_scale; [4b] the rank time per message is the one that makes the predicted
// step-time difference between the two equal the measured one, never below the transfer's
// measured send() time; [4c] what the measured step times still exceed the predicted by (median)
// becomes the profile's step_overhead_seconds. No-op with one rank or a batch that 16 does not
// divide.
void calibrate_processes(partition::ModelProfile& profile, const partition::PlannerOptions& planner,
                         const RunPlans& run);

// Step [5] keeps the default unless a plan measured this much faster in the same turns (the
// median of the per-turn ratios below 1 - margin): on this machine two equal plans measured in
// turn differ by a few percent from run to run.
inline constexpr double kKeepDefaultMargin = 0.03;

// Rounds of step [5]; its plans' times are medians over the steps of all rounds, so a spell of a
// slower machine that lasts one round (seconds here) moves them little.
inline constexpr int kMeasuredRounds = 3;

// Step [5], after planning: the plans worth measuring (partition::plans_to_measure: the best 3
// predicted within 25 % of the fastest, and `reference`, the hand-written default when it is a
// plan the caller may choose; may be null) run together kMeasuredRounds times: the first round
// `min_steps` steps, each later one at least `min_steps` steps and 1.5 s by the step times the
// first round measured (at most 200); each plan's time is the median of all its timed steps;
// partition::recommend_measured then scales every prediction (profile.measured_step_scale) and
// recommends the plan partition::choose_measured picks: the default unless a plan beat it by
// kKeepDefaultMargin in the same turns (without a default, the shortest median step). No-op when
// the report has no plan.
void recommend_by_measurement(partition::ModelProfile& profile,
                              const partition::PlannerOptions& planner,
                              partition::PlanReport& report, const partition::Plan* reference,
                              const RunPlans& run, int min_steps);

}  // namespace pipetrain::tune
