// `pipetrain plan --model MODEL.pt|mlp|cnn --sample-shape 256,784 [--stages K]
//  [--memory-limit 2GiB] [--format json|text] [--verify]`
//
// Flow: [1] model and sample batch  [2] tune::plan_model (tune/model_plan.h: profile, plan,
// calibrate, verify, rank processes)  [3] text or JSON out. With --rank-job this process is one
// rank of a measurement plan_model started (tune::run_model_plan_rank). This file parses,
// dispatches and prints.
#include "plan_model.h"

#include <algorithm>
#include <iostream>
#include <optional>
#include <sstream>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "model_data.h"
#include "pipetrain/base/atomic_file.h"
#include "pipetrain/partition/planner.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/stage/precision.h"
#include "pipetrain/train/trainer.h"
#include "pipetrain/tune/auto_plan.h"
#include "pipetrain/tune/model_plan.h"
#include "pipetrain/tune/world_plan.h"

namespace pipetrain::cli {
namespace {

namespace pp = pipetrain::partition;
using namespace pipetrain::tune;  // plan_model and its report

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
      throw UsageError("--sample-shape '" + text +
                       "' must be positive integers separated by commas, e.g. 256,784");
    }
  }
  if (shape.empty()) {
    throw UsageError("--sample-shape is required with --model: the mini-batch shape, e.g. 256,784");
  }
  return shape;
}

// [1]
examples::PlanningModel load_model(const PlanModelArgs& args) {
  return examples::load_planning_model(args.model, parse_shape(args.sample_shape));
}

// --optimizer sgd|momentum|adam|adamw as the library's state multiple
// (tune::optimizer_state_multiple; adamw keeps Adam's two moments, as `train --optimizer adamw`).
double optimizer_state_multiple(const std::string& name) {
  if (name != "sgd" && name != "momentum" && name != "adam" && name != "adamw") {
    throw UsageError("unknown --optimizer '" + name + "'; valid: sgd, momentum, adam, adamw");
  }
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
      throw UsageError("unknown schedule '" + item +
                       "' in --schedules; valid: " + examples::join_names(valid));
    }
    names.push_back(item);
  }
  return names;
}

void emit(const PlanModelArgs& args, const std::string& text) {
  if (args.output.empty()) {
    std::cout << text;
  } else {
    pipetrain::write_file_atomically(args.output, text);
  }
}

}  // namespace

void add_plan_model_options(CLI::App& command, PlanModelArgs& args) {
  command.add_option("--model", args.model,
                     "Plan for a model: MODEL.pt (TorchScript Sequential), mlp, cnn or a Hugging "
                     "Face DIR (--sample-shape B,T; profiled from one decoder layer)");
  command.add_option("--sample-shape", args.sample_shape,
                     "With --model: the mini-batch shape, batch first (e.g. 256,784)");
  command.add_option("--memory-limit", args.memory_limit,
                     "With --model: memory per rank (e.g. 2GiB, 512MiB); default no limit");
  command.add_option(
      "--optimizer", args.optimizer,
      "With --model: sgd | momentum | adam | adamw (state 0x/1x/2x/2x params; train's sgd "
      "has --momentum 0.9 unless told: plan it as momentum)");
  command.add_option("--schedules", args.schedules,
                     "With --model: schedules to search, comma-separated (default all)");
  command.add_option("--top", args.top, "With --model: rows of the ranked table (default 10)");
  command.add_flag("--verify", args.verify,
                   "With --model: run the recommended and the default plan in-process and print "
                   "predicted vs measured step time");
  command.add_flag("--calibrate", args.calibrate,
                   "With --model: calibrate the cost model with real steps, then run the best "
                   "few plans and the default together and recommend by measurement (implied "
                   "by --verify)");
  command.add_option("--verify-rounds", args.verify_rounds,
                     "With --verify: rounds of the two plans in turn step by step; medians over "
                     "all their steps (default 3)");
  command.add_flag("--processes", args.processes,
                   "With --model: plan for K processes over Gloo (the transfer model is measured "
                   "by two processes on this machine's loopback); --verify then runs each plan "
                   "as K processes instead of K worker threads in one process");
  command.add_option("--rank-job", args.rank_job)->group("");
  command.add_option("--verify-steps", args.verify_steps,
                     "With --verify (and for the plans measured after planning): timed steps per "
                     "plan and round, at least; a round also lasts at least 1.5 s (default 5)");
  command.add_option("--profile-out", args.profile_out,
                     "With --model: write the measured profile as JSON to FILE");
  command.add_flag("--memory", args.memory,
                   "With --model: the recommended plan's bytes per rank: parameters, gradients, "
                   "optimizer state, activations, transport (docs/MEMORY.md)");
  command.add_option("--zero", args.zero,
                     "With --model: ZeRO stage 0, 1, 2 or 3 over --dp replicas, for the "
                     "memory model and --memory-limit (default 0; 3 keeps each stage's "
                     "parameters from its first action of a step to its last)");
  command.add_flag("--reshard-after-forward", args.reshard_after_forward,
                   "With --model --zero 3: the memory model frees a stage's gathered parameters "
                   "after every action (train's flag of the same name)");
  command
      .add_option("--zero-gradients", args.zero_gradients,
                  "With --model --zero 2 or 3: stream or accumulate, for the memory model "
                  "(train's flag of the same name)")
      ->capture_default_str();
  command
      .add_option("--zero3-unit", args.zero3_unit,
                  "With --model --zero 3: layer or stage, for the memory model (train's flag "
                  "of the same name)")
      ->capture_default_str();
  command.add_flag("--offload-optimizer", args.offload_optimizer,
                   "With --model and --zero 1 to 3: the memory model puts the optimizer state and "
                   "the shard in host memory (train's flag of the same name)");
  command.add_option("--dp", args.dp,
                     "With --model: data-parallel replicas of each rank, for the memory model "
                     "(default 1); --sample-shape is then one replica's share of the mini-batch");
  command.add_option("--precision", args.precision,
                     "With --model: fp32 (default) or bf16: the profile runs the layers under "
                     "autocast, so times, activations and messages are a bf16 stage's (weights, "
                     "gradients and optimizer state stay float32)");
  command
      .add_option("--profile-repeats", args.profile_repeats,
                  "With --model: timed trials of each layer's figures, the median kept (fewer "
                  "plan faster, with noisier times; the memory figures are the same)")
      ->capture_default_str();
  command
      .add_option("--profile-warmup", args.profile_warmup,
                  "With --model: untimed runs of each layer before its trials")
      ->capture_default_str();
  command.add_option("--world", args.world,
                     "With a Hugging Face --model: search the pipeline x tensor x data parallel "
                     "layouts of N processes (every pp x tp x dp = N the model allows, with and "
                     "without sequence parallelism) and print the best few with why; "
                     "--sample-shape is then the whole job's mini-batch");
}

namespace {

// Returns --precision, parsed once here.
Precision check_plan_args(const PlanModelArgs& args) {
  if (args.format != "text" && args.format != "json") {
    throw UsageError("--format '" + args.format + "' with --model; valid: text, json");
  }
  if (args.top < 1) throw UsageError("--top must be >= 1 (got " + std::to_string(args.top) + ")");
  if (args.verify_rounds < 1) {
    throw UsageError("--verify-rounds must be >= 1 (got " + std::to_string(args.verify_rounds) +
                     ")");
  }
  if (args.verify_steps < 1) {
    throw UsageError("--verify-steps must be >= 1 (got " + std::to_string(args.verify_steps) + ")");
  }
  if (args.dp < 1) throw UsageError("--dp must be >= 1 (got " + std::to_string(args.dp) + ")");
  if (args.zero < 0 || args.zero > 3) {
    throw UsageError("--zero must be 0, 1, 2 or 3 (got " + std::to_string(args.zero) + ")");
  }
  train::check_reshard_after_forward(args.reshard_after_forward, args.zero);
  train::check_offload_optimizer(args.offload_optimizer, args.zero);
  if (args.world < 0) {
    throw UsageError("--world must be >= 1 (got " + std::to_string(args.world) + ")");
  }
  if (args.zero > 0 && args.dp < 2 && args.world == 0 && !args.offload_optimizer) {
    throw UsageError("--zero " + std::to_string(args.zero) +
                     " shards over data-parallel replicas and needs --dp 2 or more");
  }
  if (args.profile_repeats < 1) {
    throw UsageError("--profile-repeats must be 1 or more (got " +
                     std::to_string(args.profile_repeats) + ")");
  }
  if (args.profile_warmup < 0) {
    throw UsageError("--profile-warmup must be 0 or more (got " +
                     std::to_string(args.profile_warmup) + ")");
  }
  Precision precision = Precision::kFloat32;
  try {
    precision = parse_precision(args.precision);
  } catch (const pipetrain::BadInput& e) {
    throw UsageError(std::string("--precision: ") + e.what());
  }
  if (precision == Precision::kFloat16) {
    throw UsageError(
        "--precision fp16 is not planned: the profile and the memory model cover fp32 and bf16 "
        "(fp16 needs CUDA stages); use --precision bf16");
  }
  return precision;
}

pp::PlannerOptions planner_options(const PlanModelArgs& args) {
  pp::PlannerOptions planner;
  planner.ranks = args.stages > 0 ? args.stages : 2;
  planner.top = args.top;
  planner.optimizer_state_multiple = optimizer_state_multiple(args.optimizer);
  planner.zero = args.zero;
  planner.reshard_after_forward = args.reshard_after_forward;
  try {
    planner.zero_policy.stream =
        train::parse_zero_gradients(args.zero_gradients) == train::ZeroGradients::kStream;
    planner.zero_policy.by_layer =
        train::parse_zero_unit(args.zero3_unit) == train::ZeroUnit::kLayer;
  } catch (const pipetrain::BadInput& e) {
    throw UsageError(e.what());
  }
  planner.offload_optimizer = args.offload_optimizer;
  planner.data_parallel = args.dp;
  planner.processes = args.processes;
  if (!args.schedules.empty()) planner.schedules = split_names(args.schedules);
  if (!args.memory_limit.empty()) {
    try {
      planner.memory_limit_bytes = pp::parse_bytes(args.memory_limit);
    } catch (const pipetrain::BadInput& e) {
      throw UsageError(std::string("--memory-limit: ") + e.what());
    }
  }
  return planner;
}

// --world: tune::plan_world. Returns the exit code (1: no layout fits the limit).
int run_world_plan(const PlanModelArgs& args, const examples::PlanningModel& model,
                   Precision precision) {
  if (!model.llama) {
    throw UsageError(
        "--world plans tensor parallelism, which splits a Llama-family model: give "
        "--model DIR (a Hugging Face checkpoint directory), not '" +
        args.model + "'");
  }
  for (const auto& [given, flag] : {std::pair{args.stages > 0, "--stages"},
                                    {args.dp > 1, "--dp"},
                                    {args.verify, "--verify"},
                                    {args.calibrate, "--calibrate"},
                                    {args.processes, "--processes"},
                                    {!args.profile_out.empty(), "--profile-out"}}) {
    if (given) {
      throw UsageError(std::string(flag) +
                       " with --world: --world searches the pipeline, tensor "
                       "and data parallel sizes itself and plans for processes; drop " +
                       flag);
    }
  }
  WorldPlanRequest request;
  request.config = *model.llama;
  request.sample = model.sample;
  request.world = args.world;
  request.planner = planner_options(args);
  request.precision = precision;
  request.profile_repeats = args.profile_repeats;
  request.profile_warmup = args.profile_warmup;
  request.rank_arguments = {"plan",           "--model",         args.model,
                            "--sample-shape", args.sample_shape, "--rank-job"};
  request.diagnostics = [](const Diagnostic& d) { std::cerr << d.text << "\n"; };
  WorldPlanResult result;
  try {
    result = plan_world(request);
  } catch (const pipetrain::BadInput& e) {
    throw UsageError(e.what());
  }
  emit(args, args.format == "json" ? world_plan_json(request, result).dump(1) + "\n"
                                   : world_plan_text(request, result, args.top));
  return result.ranked.empty() ? 1 : 0;
}

}  // namespace

int run_plan_for_model(const PlanModelArgs& args) {
  const Precision precision = check_plan_args(args);
  for (const auto& [flag, path] :
       {std::pair{"--output", args.output}, {"--profile-out", args.profile_out}}) {
    if (!path.empty()) as_usage_error(flag, [&] { pipetrain::check_writable(path); });
  }
  const examples::PlanningModel model = load_model(args);
  if (!args.rank_job.empty()) {  // one rank of a measurement the parent launched
    return run_model_plan_rank(nlohmann::json::parse(args.rank_job), model.sequential,
                               model.sample);
  }
  if (args.world > 0) return run_world_plan(args, model, precision);
  ModelPlanRequest request;
  request.model = model.sequential;
  request.llama = model.llama;
  request.sample = model.sample;
  request.planner = planner_options(args);
  request.precision = precision;
  request.profile_repeats = args.profile_repeats;
  request.profile_warmup = args.profile_warmup;
  request.calibrate = args.calibrate;
  request.verify = args.verify;
  request.processes = args.processes;
  request.verify_steps = args.verify_steps;
  request.verify_rounds = args.verify_rounds;
  request.rank_arguments = {"plan",
                            "--model",
                            args.model,
                            "--sample-shape",
                            args.sample_shape,
                            "--stages",
                            std::to_string(request.planner.ranks),
                            "--rank-job"};
  request.diagnostics = [](const Diagnostic& d) { std::cerr << d.text << "\n"; };
  ModelPlanResult result;
  try {
    result = plan_model(request);
  } catch (const pipetrain::BadInput& e) {  // a failing measurement stays exit 1
    throw UsageError(e.what());
  }
  if (!args.profile_out.empty()) {
    pipetrain::write_file_atomically(args.profile_out,
                                     nlohmann::json(result.profile).dump(1) + "\n");
  }
  const ModelPlanLabels labels{model.description, args.sample_shape, args.optimizer, args.memory};
  emit(args, args.format == "json" ? model_plan_json(request, result, labels).dump(1) + "\n"
                                   : model_plan_text(request, result, labels));  // [3]
  return result.report.found() ? 0 : 1;
}

}  // namespace pipetrain::cli
