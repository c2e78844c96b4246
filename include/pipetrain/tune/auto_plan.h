// The auto plan: the planner's recommendation (partition/recommend.h) for one training run, made
// on this machine's measured costs (`pipetrain train --balance auto --schedule auto`, and any C++
// program that wants the same).
//
//   what is auto                     searched                           kept as given
//   --balance auto                   balance                            schedule, chunks,
//                                                                       checkpoint, virtual
//   --schedule auto                  schedule, and chunks / checkpoint  an explicit --chunks N,
//                                    / virtual / balance unless given   --checkpoint X, --virtual
//                                    V,
//                                                                       --balance a,b,...
//   --chunks auto, --checkpoint auto that value (with --balance auto alone: only that value)
//
// The profile is taken on this process, on `sample` (the run's first mini-batch, or one
// replica's share of it), with the intra-op threads each stage will use, and calibrated against
// the runtime (tune/calibration.h, steps [1]..[3]: a few real steps in this process). The model
// is left as it was: its parameters, buffers (batch-norm statistics) and the global random
// generator are restored, so a run with `auto` trains exactly as the same run with the printed
// flags written out.
//
// Profiles are timings and differ between processes: a multi-process run plans ONCE, on rank 0
// (plan_training_on_ranks, under the local launcher of --nproc as under an external one). What
// only processes show is measured with every rank taking part: the transfer between pipeline
// ranks 0 and 1 over the job's own process group, and step [4], the rank time per message, from
// gpipe with 2 and with 32 micro-batches run on the ranks. The plan reaches every rank as
// JSON (partition::Plan's to_json / from_json).
//
// Unless the user fixed the balance, the planner's best few plans (and the hand-written default,
// 1f1b with 4 chunks and the even balance, when the fixed flags allow it) then run together for a
// few steps (step [5], recommend_by_measurement), which chooses the plan: the default unless a
// plan beat it by kKeepDefaultMargin in the same turns, else the fastest measured.
//
// Errors: user mistakes (a plan that cannot exist, a model the profiler cannot run, no plan
// within --memory-limit: the message names the smallest limit that works) throw AutoPlanError, a
// BadInput.
//
// Thread-safety: plan_training runs the model; call it from the main thread before training.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/partition/planner.h"
#include "pipetrain/runtime/distributed.h"
#include "pipetrain/runtime/run_layout.h"
#include "pipetrain/tune/calibration.h"

namespace pipetrain::tune {

// Which parts of the plan the user left to the planner.
struct AutoRequest {
  bool balance = false;
  bool schedule = false;
  bool chunks = false;
  bool checkpoint = false;
  bool virtual_stages = false;

  bool any() const { return balance || schedule || chunks || checkpoint || virtual_stages; }
};

// The run as far as the user fixed it; fields named in AutoRequest are ignored.
struct AutoPlanInput {
  int ranks = 1;                        // K pipeline ranks (per replica)
  int threads = 1;                      // intra-op threads of each stage's worker
  std::int64_t memory_limit_bytes = 0;  // per rank; 0: none
  double optimizer_state_multiple = 0;  // sgd 0 (1 with momentum), adam/adamw 2
  // The rest of the memory model the limit applies to (partition/memory.h): ZeRO stage,
  // data-parallel replicas, one process per rank (the transport's buffers).
  int zero = 0;
  bool reshard_after_forward = false;       // ZeRO 3's policy
  bool offload_optimizer = false;           // ZeRO-Offload
  partition::ZeroMemoryPolicy zero_policy;  // ZeRO's other policies (train::zero_memory_policy)
  int data_parallel = 1;
  bool processes = false;
  std::string schedule;
  std::int64_t chunks = 1;
  std::string checkpoint;
  std::int64_t virtual_stages = 1;
  std::vector<std::int64_t> balance;  // empty: not given
  // What the stages compute in: the profile runs under autocast for bf16, and every plan is
  // measured in it.
  Precision precision = Precision::kFloat32;
  // What planning does ("planning: profiled 12 layers; ...") and what it skipped; nothing in
  // tune/ prints. Empty: silent.
  Diagnostics diagnostics;
  // Tensor parallelism (plan_training_on_ranks with tp > 1): adds the group's collectives to a
  // profile of one tp rank's layers, given an all-reduce over the group measured on the ranks.
  // Called on the profile after the in-process calibration (which runs the layers without the
  // group) and before the processes' (which run them with it). Empty: the profile as measured.
  std::function<void(partition::ModelProfile&, const partition::TransferModel& allreduce)>
      tensor_parallel_collectives;
};

// The pipeline part of the input from a run's request and layout (runtime/run_layout.h): ranks,
// threads, schedule, chunks, checkpoint, virtual stages, precision, replicas, processes, and,
// where `request` does not plan it, the balance (the one given, or the run's even split of
// `layers`). The caller adds the memory limit, ZeRO, the optimizer and the diagnostics.
AutoPlanInput auto_plan_input(const PipelineRequest& pipeline, const RunLayout& layout,
                              const AutoRequest& request, std::int64_t layers);

// The plan's values in place of what `request` left open, so that the rest of the run sees a
// request as if the user had given them.
void apply_auto_plan(PipelineRequest& pipeline, const AutoRequest& request,
                     const partition::Plan& plan);

// What the plan of a multi-process run measures on the processes themselves.
struct ProcessMeasurer {
  // The transfer model between two ranks, measured with messages of `large` bytes.
  std::function<partition::TransferModel(std::int64_t large)> transfer;
  // Plans run together on the ranks, in turn step by step: step times and each rank's compute.
  RunPlans run;
  // An all-reduce over the tensor-parallel group, measured on the ranks (empty without tensor
  // parallelism): for AutoPlanInput::tensor_parallel_collectives.
  std::function<partition::TransferModel()> tensor_parallel_allreduce;
};

// Profiles and calibrates `model` on `sample` and returns the fastest plan within the limit that
// keeps every value the user gave. With `processes` (and more than one pipeline rank) the
// transfer and the rank time per message come from it. REQUIRES: request.any(); input.ranks
// between 1 and the layer count.
partition::Plan plan_training(torch::nn::Sequential& model, const torch::Tensor& sample,
                              const AutoRequest& request, const AutoPlanInput& input,
                              const ProcessMeasurer* processes = nullptr);

// A user mistake in what was asked of the auto plan. In a multi-process run, rank 0's: every rank
// throws it with rank 0's message.
struct AutoPlanError : BadInput {
  using BadInput::BadInput;
};

// The auto plan of a multi-process run; every rank calls it with the same arguments. Rank 0 runs
// plan_training; each measurement that needs the processes is a job rank 0 broadcasts and every
// rank runs (the others wait for jobs until the plan comes). Returns the plan on every rank;
// throws AutoPlanError on every rank when rank 0's planning threw BadInput. The model is left
// as it was on every rank. With tensor parallelism, rank 0 profiles `profiled` instead (a copy of
// its layers split over a mirror group, transport/c10d.h: a tp rank's work with no collective,
// which its tp peers would not join), while the plans' timed steps run `model` on every rank;
// the ranks' results come from replica 0's tp rank 0 of each pipeline rank.
// `profiled_sample`: what rank 0 profiles `profiled` on where it differs from what the ranks' steps
// take (context parallelism: a cp rank's columns of the rows the steps cut themselves); undefined:
// `sample`.
partition::Plan plan_training_on_ranks(Distributed& distributed, torch::nn::Sequential& model,
                                       const torch::Tensor& sample, const AutoRequest& request,
                                       const AutoPlanInput& input,
                                       torch::nn::Sequential* profiled = nullptr,
                                       const torch::Tensor& profiled_sample = {});

// "auto plan: 1f1b, chunks 8, balance 9 7, checkpoint never, virtual stages 1 (predicted
// 0.152 s/step, peak 1.2 GiB on rank 0)"
std::string describe_auto_plan(const partition::Plan& plan);

// State multiple of an optimizer for the memory model: sgd 0 (1 with momentum), adam/adamw 2.
// Defined by the memory model (partition/memory.h), which train/memory_report uses too.
using partition::optimizer_state_multiple;

}  // namespace pipetrain::tune
