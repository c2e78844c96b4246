// plan_model: everything `pipetrain plan --model` does, as one library call, rank processes
// included, and its report.
//
//   ModelPlanRequest --plan_model--> ModelPlanResult --model_plan_text / _json--> the report
//
//   [1] profile the model on its sample (partition/profiler.h; a Hugging Face config from one
//       decoder layer, models/llama_profile.h, never the whole model)
//   [2] plan (partition/planner.h); with `processes`, the transfer between two processes is
//       measured first (Gloo over loopback) and the plan made again with it
//   [3] with `calibrate` or `verify`: calibrate the cost model with real steps (in-process, and as
//       K processes with `processes`), plan again, then run the best few plans and the default
//       together and recommend by measurement (tune/calibration.h)
//   [4] with `verify`: the recommended and the default plan in turn, predicted against measured
//
// Processes: plan_model starts this program again as K ranks (runtime/launcher.h,
// launch_self_collecting) with `rank_arguments` followed by the job as one JSON argument. The
// program must hand that job, on each rank, to run_model_plan_rank with the same model and sample
// (the CLI: `pipetrain plan --model M --sample-shape S --stages K --rank-job JOB`).
//
// Progress and skipped steps go to `diagnostics`; nothing here prints except a rank's one result
// line. Thread-safety: runs the model; one call at a time.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "pipetrain/models/llama_config.h"
#include "pipetrain/partition/planner.h"
#include "pipetrain/stage/precision.h"
#include "pipetrain/tune/calibration.h"
#include "pipetrain/tune/verify.h"

namespace pipetrain::tune {

struct ModelPlanRequest {
  // The model and a mini-batch of it (the batch size is the plan's). For a Hugging Face model:
  // no Sequential, `llama` set and `sample` int64 ids [B, T].
  torch::nn::Sequential model{nullptr};
  std::optional<models::LlamaConfig> llama;
  torch::Tensor sample;
  partition::PlannerOptions planner;  // ranks, memory limit, optimizer state, ZeRO, schedules, ...
  Precision precision = Precision::kFloat32;
  int profile_repeats = 7, profile_warmup = 2;  // [1]: partition::ProfileOptions' repeats, warmup
  bool calibrate = false;                       // [3]
  bool verify = false;                          // [3] and [4]
  bool processes = false;                       // plan and measure for one process per rank
  int verify_steps = 5;                         // timed steps per plan and round, at least
  int verify_rounds = 3;                        // rounds of [4]
  // How this program is started as a rank of a measurement (before the job's JSON). Required with
  // `processes`.
  std::vector<std::string> rank_arguments;
  Diagnostics diagnostics;
};

struct ModelPlanResult {
  // The request's planner options with what the model adds to them (the parameters ZeRO-3
  // gathers narrowed under bf16): the ones every plan and memory figure here used.
  partition::PlannerOptions planner;
  partition::ModelProfile profile;
  partition::PlanReport report;
  int default_chunks = 1;
  partition::Plan fallback;  // the hand-written default: 1f1b, default_chunks, even balance
  std::optional<Verification> verification;
  double load_average = 0;  // one-minute load average when [4] started
};

// Steps [1]..[4]. Throws pipetrain::BadInput for a request that cannot run (more ranks than
// layers; calibrate, verify or processes for a Hugging Face config, which would need the whole
// model; a sample the model cannot take, naming its shape), and what the measurements throw.
ModelPlanResult plan_model(const ModelPlanRequest& request);

// The prefix of a rank's result line on stdout ("PIPETRAIN_PLAN_VERIFY ").
extern const char* const kModelPlanRankPrefix;

// One rank of a measurement plan_model started: `job` is the JSON it was given; `model` and
// `sample` are the parent's (the same seed). Prints the result line (rank 0 of a transfer
// measurement, every rank of a plan run) and returns the exit code.
int run_model_plan_rank(const nlohmann::json& job, torch::nn::Sequential model,
                        const torch::Tensor& sample);

// What the report says beside the result: the model's and sample's description, the optimizer
// name, and whether to include the memory per rank.
struct ModelPlanLabels {
  std::string model;         // e.g. "mlp", "TorchScript m.pt", "LlamaForCausalLM DIR"
  std::string sample_shape;  // e.g. "256,784"
  std::string optimizer;     // sgd | momentum | adam
  bool memory = false;       // the recommended plan's bytes per rank
};

// The report as `pipetrain plan --model` prints it: the profile, the ranked plans, the
// recommendation, the memory per rank, the default plan and the verification.
std::string model_plan_text(const ModelPlanRequest& request, const ModelPlanResult& result,
                            const ModelPlanLabels& labels);
// The same as one JSON object (`--format json`).
nlohmann::json model_plan_json(const ModelPlanRequest& request, const ModelPlanResult& result,
                               const ModelPlanLabels& labels);

}  // namespace pipetrain::tune
