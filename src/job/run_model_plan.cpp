// run_model_plan (job/run_job.h): `plan --model` -- profile a model, search the plan space, and
// report the ranked plans and the recommendation; with --verify, run the recommended and the
// default plan and report predicted against measured step times.
//
// Flow: [1] the model and a sample batch (job/model_data.h, load_planning_model)  [2]
// tune::plan_model or, with --world, tune::plan_world  [3] text or JSON to on_result or the
// --output file. The measurements on processes start this program again as
// `plan --model M --sample-shape S --stages K --rank-job JSON` (the pipetrain CLI's words): a
// program of its own passes such a call back to run_model_plan with `rank_job`.
#include <algorithm>
#include <sstream>

#include <nlohmann/json.hpp>

#include "pipetrain/base/atomic_file.h"
#include "pipetrain/job/job_fields.h"
#include "pipetrain/job/model_data.h"
#include "pipetrain/job/run_job.h"
#include "pipetrain/partition/memory.h"
#include "pipetrain/partition/planner.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/stage/precision.h"
#include "pipetrain/train/sharded_optimizer.h"
#include "pipetrain/train/trainer.h"
#include "pipetrain/tune/auto_plan.h"
#include "pipetrain/tune/model_plan.h"
#include "pipetrain/tune/world_plan.h"
#include "pipetrain/tune/zero_ladder.h"

namespace pipetrain::job {
namespace {

namespace pp = pipetrain::partition;

std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> shape;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      std::size_t used = 0;
      const long long value = std::stoll(item, &used);
      if (used != item.size() || value < 1) throw std::invalid_argument("bad");
      shape.push_back(value);
    } catch (const std::exception&) {
      throw BadInput("--sample-shape '" + text +
                     "' must be positive integers separated by commas, e.g. 256,784");
    }
  }
  if (shape.empty()) {
    throw BadInput("--sample-shape is required with --model: the mini-batch shape, e.g. 256,784");
  }
  return shape;
}

// --optimizer sgd|momentum|adam|adamw as the library's state multiple
// (tune::optimizer_state_multiple; adamw keeps Adam's two moments, as `train --optimizer adamw`).
double optimizer_state_multiple(const std::string& name) {
  const bool momentum = name == "momentum";
  return tune::optimizer_state_multiple(momentum ? "sgd" : name, momentum ? 0.9 : 0.0);
}

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> names;
  std::stringstream in(text);
  std::string item;
  const auto& valid = schedule::schedule_names();
  while (std::getline(in, item, ',')) {
    if (std::find(valid.begin(), valid.end(), item) == valid.end()) {
      throw BadInput("unknown schedule '" + item + "' in --schedules; valid: " + [&] {
        std::string joined;
        for (const auto& name : valid) joined += (joined.empty() ? "" : ", ") + name;
        return joined;
      }());
    }
    names.push_back(item);
  }
  return names;
}

// The combinations of the plan's settings; returns --precision, parsed.
Precision check_plan(const JobConfig& job) {
  check_fields(job, Command::kPlanModel);
  const PlanSettings& plan = job.plan;
  if (plan.format != "text" && plan.format != "json") {
    throw BadInput("--format '" + plan.format + "' with --model; valid: text, json");
  }
  const int zero = static_cast<int>(job.zero.stage);
  train::check_reshard_after_forward(job.zero.reshard_after_forward, zero);
  train::check_offload_optimizer(job.zero.offloads_optimizer(), zero);
  if (job.parallel.cp > 1 && plan.world == 0) {
    throw BadInput("--cp " + std::to_string(job.parallel.cp) +
                   " with plan: give --world N, whose layouts may then take context parallelism up "
                   "to it (plan without --world plans one pipeline)");
  }
  if (zero > 0 && job.parallel.dp < 2 && plan.world == 0 && !job.zero.offloads_optimizer()) {
    throw BadInput("--zero " + std::to_string(zero) +
                   " shards over data-parallel replicas and needs --dp 2 or more");
  }
  const Precision precision = parse_precision(job.pipeline.precision);
  if (precision == Precision::kFloat16) {
    throw BadInput(
        "--precision fp16 is not planned: the profile and the memory model cover fp32 and bf16 "
        "(fp16 needs CUDA stages); use --precision bf16");
  }
  for (const auto& [flag, path] :
       {std::pair{"--output", plan.output}, {"--profile-out", plan.profile_out}}) {
    if (path.empty()) continue;
    try {
      check_writable(path);
    } catch (const pipetrain::Error& error) {
      throw BadInput(std::string(flag) + ": " + error.what());
    }
  }
  return precision;
}

// The offload files' pool a rank holds in host memory (train/nvme_options.h, pool_bytes).
int64_t offload_pool_bytes(const ZeroSettings& zero) {
  return train::pool_bytes(train::NvmeOptions()
                               .buffer_bytes(pp::parse_bytes(zero.offload_buffer_bytes))
                               .buffer_count(static_cast<int>(zero.offload_buffer_count)));
}

pp::PlannerOptions planner_options(const JobConfig& job) {
  const PlanSettings& plan = job.plan;
  pp::PlannerOptions planner;
  planner.ranks = plan.stages > 0 ? static_cast<int>(plan.stages) : 2;
  planner.top = static_cast<int>(plan.top);
  planner.optimizer_state_multiple = optimizer_state_multiple(plan.optimizer);
  planner.zero = static_cast<int>(job.zero.stage);
  planner.reshard_after_forward = job.zero.reshard_after_forward;
  planner.zero_policy.stream =
      train::parse_zero_gradients(job.zero.gradients) == train::ZeroGradients::kStream;
  planner.zero_policy.by_layer = train::parse_zero_unit(job.zero.unit) == train::ZeroUnit::kLayer;
  planner.offload_optimizer = job.zero.offloads_optimizer();
  if (job.zero.offload_optimizer == "nvme") {  // the state in files, the pool in host memory
    planner.optimizer_state_in_files = true;
    planner.offload_buffer_bytes = offload_pool_bytes(job.zero);
  }
  planner.data_parallel = static_cast<int>(job.parallel.dp);
  planner.processes = plan.processes;
  if (!plan.schedules.empty()) planner.schedules = split_names(plan.schedules);
  if (!job.memory.limit.empty() && job.memory.limit != "none") {
    planner.memory_limit_bytes = pp::parse_bytes(job.memory.limit);
  }
  return planner;
}

// The report to --output (atomically) or to the observer.
void emit(const JobConfig& job, const std::string& text, JobObserver& observer) {
  if (job.plan.output.empty()) {
    observer.on_result(text);
  } else {
    write_file_atomically(job.plan.output, text);
  }
}

// Planning's progress, on stderr in the CLI (the plan may be JSON on stdout).
std::function<void(const tune::Diagnostic&)> progress_notes(JobObserver& observer) {
  return [&observer](const tune::Diagnostic& d) {
    observer.on_note({Note::Kind::kProgress, d.text});
  };
}

// --world: tune::plan_world. Returns the exit code (1: no layout fits the limit).
int plan_world_layouts(const JobConfig& job, const PlanningModel& model, Precision precision,
                       JobObserver& observer) {
  const PlanSettings& plan = job.plan;
  if (!model.llama) {
    throw BadInput(
        "--world plans tensor parallelism, which splits a Llama-family model: give --model DIR "
        "(a Hugging Face checkpoint directory), not '" +
        plan.model + "'");
  }
  for (const auto& [given, flag] : {std::pair{plan.stages > 0, "--stages"},
                                    {job.parallel.dp > 1, "--dp"},
                                    {plan.verify, "--verify"},
                                    {plan.calibrate, "--calibrate"},
                                    {plan.processes, "--processes"},
                                    {!plan.profile_out.empty(), "--profile-out"}}) {
    if (given) {
      throw BadInput(std::string(flag) +
                     " with --world: --world searches the pipeline, tensor and data parallel "
                     "sizes itself and plans for processes; drop " +
                     flag);
    }
  }
  tune::WorldPlanRequest request;
  request.config = *model.llama;
  request.sample = model.sample;
  request.world = static_cast<int>(plan.world);
  request.planner = planner_options(job);
  request.precision = precision;
  request.routing_imbalance = job.parallel.routing_imbalance;
  request.max_context_parallel = static_cast<int>(job.parallel.cp);
  request.ulysses = job.parallel.cp_method == "ulysses";
  request.profile_repeats = static_cast<int>(plan.profile_repeats);
  request.profile_warmup = static_cast<int>(plan.profile_warmup);
  request.rank_arguments = {"plan",           "--model",         plan.model,
                            "--sample-shape", plan.sample_shape, "--rank-job"};
  request.diagnostics = progress_notes(observer);
  const tune::WorldPlanResult result = tune::plan_world(request);
  emit(job,
       plan.format == "json" ? tune::world_plan_json(request, result).dump(1) + "\n"
                             : tune::world_plan_text(request, result, static_cast<int>(plan.top)),
       observer);
  return result.ranked.empty() ? 1 : 0;
}

}  // namespace

JobResult run_model_plan(const JobConfig& job, JobObserver& observer, const std::string& rank_job) {
  const Precision precision = check_plan(job);
  if (job.zero.ladder && (job.memory.limit.empty() || job.memory.limit == "none")) {
    throw BadInput("--zero-ladder climbs until the run fits a limit: give --memory-limit");
  }
  const PlanSettings& plan = job.plan;
  const PlanningModel model =
      load_planning_model(plan.model, parse_shape(plan.sample_shape));  // [1]
  JobResult out;
  if (!rank_job.empty()) {  // one rank of a measurement the parent launched
    out.exit_code =
        tune::run_model_plan_rank(nlohmann::json::parse(rank_job), model.sequential, model.sample);
    return out;
  }
  if (plan.world > 0) {
    out.exit_code = plan_world_layouts(job, model, precision, observer);
    return out;
  }
  tune::ModelPlanRequest request;
  request.model = model.sequential;
  request.llama = model.llama;
  request.sample = model.sample;
  request.planner = planner_options(job);
  request.precision = precision;
  request.profile_repeats = static_cast<int>(plan.profile_repeats);
  request.profile_warmup = static_cast<int>(plan.profile_warmup);
  request.calibrate = plan.calibrate;
  request.verify = plan.verify;
  request.processes = plan.processes;
  request.verify_steps = static_cast<int>(plan.verify_steps);
  request.verify_rounds = static_cast<int>(plan.verify_rounds);
  request.rank_arguments = {"plan",
                            "--model",
                            plan.model,
                            "--sample-shape",
                            plan.sample_shape,
                            "--stages",
                            std::to_string(request.planner.ranks),
                            "--rank-job"};
  request.diagnostics = progress_notes(observer);
  const tune::ModelPlanResult result = tune::plan_model(request);  // [2]
  if (!plan.profile_out.empty()) {
    write_file_atomically(plan.profile_out, nlohmann::json(result.profile).dump(1) + "\n");
  }
  const tune::ModelPlanLabels labels{model.description, plan.sample_shape, plan.optimizer,
                                     plan.memory};
  std::string text = plan.format == "json"
                         ? tune::model_plan_json(request, result, labels).dump(1) + "\n"
                         : tune::model_plan_text(request, result, labels);
  out.exit_code = result.report.found() ? 0 : 1;
  if (job.zero.ladder) {  // DeepSpeed's ladder on the same profile
    const tune::ZeroLadder ladder = tune::walk_zero_ladder(
        result.profile, result.planner, /*cpu_stages=*/true, offload_pool_bytes(job.zero));
    const std::string steps = tune::zero_ladder_text(ladder, result.planner.memory_limit_bytes);
    if (plan.format == "json") {
      observer.on_note({Note::Kind::kProgress, steps});
    } else {
      text += "\n" + steps;
    }
    out.exit_code = ladder.chosen >= 0 ? 0 : 1;
  }
  emit(job, text, observer);  // [3]
  return out;
}

}  // namespace pipetrain::job
