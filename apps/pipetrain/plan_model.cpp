// `pipetrain plan --model MODEL.pt|mlp|cnn --sample-shape 256,784 [--stages K]
//  [--memory-limit 2GiB] [--format json|text] [--verify]`
//
// Flow: [1] model and sample batch  [2] profile + plan (partition/recommend.h)  [3] the default
// plan a user would write (1f1b, 4 chunks, even balance), predicted on the same profile
// [4] with --verify: both plans run in turn (tune::verify_plans: in-process Pipes, or processes
// with --processes) and their measured step times are printed beside the predictions  [5] text
// or JSON out. Planning, calibration and measurement are library calls (partition/, tune/); this
// file parses, dispatches and prints.
#include "plan_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "model_data.h"
#include "model_registry.h"
#include "pipetrain/base/atomic_file.h"
#include "pipetrain/base/load_average.h"
#include "pipetrain/base/median.h"
#include "pipetrain/models/llama_profile.h"
#include "pipetrain/partition/memory.h"
#include "pipetrain/partition/planner.h"
#include "pipetrain/partition/profiler.h"
#include "pipetrain/partition/recommend.h"
#include "pipetrain/runtime/distributed.h"
#include "pipetrain/runtime/launcher.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/stage/precision.h"
#include "pipetrain/stage/torchscript.h"
#include "pipetrain/tune/auto_plan.h"
#include "pipetrain/tune/calibration.h"
#include "pipetrain/tune/plan_report.h"
#include "pipetrain/tune/verify.h"

namespace pipetrain::cli {
namespace {

namespace pp = pipetrain::partition;
using namespace pipetrain::tune;  // the calibration this command runs and reports

struct LoadedModel {
  torch::nn::Sequential sequential;  // empty for a Hugging Face model (profiled from its config)
  torch::Tensor sample;
  std::string description;
  std::optional<models::LlamaConfig> llama;
  int64_t layers() const {
    return llama ? llama->entries() : static_cast<int64_t>(sequential->size());
  }
};

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

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// [1]
LoadedModel load_model(const PlanModelArgs& args) {
  const std::vector<int64_t> shape = parse_shape(args.sample_shape);
  LoadedModel loaded;
  torch::manual_seed(0);
  if (examples::is_hf_model(args.model)) {  // never built whole: models/llama_profile.h
    loaded.llama = as_usage_error("--model " + args.model,
                                  [&] { return models::read_llama_config(args.model); });
    if (shape.size() != 2) throw UsageError("--sample-shape of a language model is B,T (ids)");
    loaded.sample = torch::randint(loaded.llama->vocab_size, shape, torch::kInt64);
    loaded.description = std::string(to_string(loaded.llama->architecture)) + " " + args.model;
    return loaded;
  }
  if (ends_with(args.model, ".pt") || ends_with(args.model, ".pth") ||
      args.model.find('/') != std::string::npos) {
    loaded.sequential = as_usage_error("", [&] { return load_torchscript_sequential(args.model); });
    loaded.description = "TorchScript " + args.model;
  } else {
    try {
      loaded.sequential = examples::make_model(args.model).sequential;
    } catch (const examples::ModelOptionError& e) {
      throw UsageError(e.what());
    }
    loaded.description = args.model;
  }
  loaded.sample = torch::randn(shape);
  return loaded;
}

// --optimizer sgd|momentum|adam as the library's state multiple (tune::optimizer_state_multiple).
double optimizer_state_multiple(const std::string& name) {
  if (name != "sgd" && name != "momentum" && name != "adam") {
    throw UsageError("unknown --optimizer '" + name + "'; valid: sgd, momentum, adam");
  }
  return tune::optimizer_state_multiple(name == "adam" ? "adam" : "sgd",
                                        name == "momentum" ? 0.9 : 0.0);
}

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> names;
  std::stringstream in(text);
  std::string item;
  const auto& valid = schedule::schedule_names();
  while (std::getline(in, item, ',')) {
    if (std::find(valid.begin(), valid.end(), item) == valid.end()) {
      throw UsageError("unknown schedule '" + item +
                       "' in --schedules; valid: gpipe, 1f1b, interleaved-1f1b, zb-h1");
    }
    names.push_back(item);
  }
  return names;
}

// ---- --processes: the Gloo transfer model, and each plan as K processes -------------------------

constexpr const char* kRankResultPrefix = "PIPETRAIN_PLAN_VERIFY ";

// One rank (started by measure_processes through the launcher): the same model (seed 0) and
// sample as the in-process measurement, the plan run on DistributedPipe. Prints one result line.
int run_verify_rank(const PlanModelArgs& args, const nlohmann::json& runs, int steps) {
  LoadedModel model = load_model(args);
  DistributedOptions options;
  options.pipeline_ranks(runs.at(0).at("ranks").get<int>()).timeout(std::chrono::seconds(120));
  return run_distributed(options, [&](Distributed& distributed) {
    const nlohmann::json result =
        run_plans_on_rank(distributed, model.sequential, model.sample, runs, steps);
    std::cout << kRankResultPrefix << result.dump() << std::endl;
  });
}

// One of the two ranks of the transfer measurement (ping_pong_on_rank); rank 0 prints the result.
int run_transfer_rank(const nlohmann::json& job) {
  DistributedOptions options;
  options.pipeline_ranks(2).timeout(std::chrono::seconds(60));
  return run_distributed(options, [&](Distributed& distributed) {
    const nlohmann::json result = ping_pong_on_rank(distributed, job);
    if (!result.is_null()) std::cout << kRankResultPrefix << result.dump() << std::endl;
  });
}

// Starts this binary as `nproc` ranks of `job` (hidden --rank-job) and returns each rank's result
// line (parsed; nullopt for a rank that printed none).
std::vector<std::optional<nlohmann::json>> launch_ranks(const PlanModelArgs& args, int nproc,
                                                        const nlohmann::json& job) {
  const CollectedRun run =
      launch_self_collecting(nproc,
                             {"plan", "--model", args.model, "--sample-shape", args.sample_shape,
                              "--stages", std::to_string(nproc), "--rank-job", job.dump()},
                             kRankResultPrefix);
  if (run.launched.exit_code != 0) {
    throw std::runtime_error("plan --processes: rank " +
                             std::to_string(run.launched.first_failed_rank) + " exited with " +
                             std::to_string(run.launched.exit_code) + " (its stderr is above)");
  }
  std::vector<std::optional<nlohmann::json>> ranks;
  for (const auto& line : run.results) {
    ranks.push_back(line ? std::optional<nlohmann::json>(nlohmann::json::parse(*line))
                         : std::nullopt);
  }
  return ranks;
}

// Transfer between two processes over Gloo on this machine (transfer_model_from).
pp::TransferModel measure_gloo_transfer(const PlanModelArgs& args, std::int64_t large) {
  const auto ranks = launch_ranks(args, 2, transfer_job(large));
  if (!ranks[0]) {
    throw std::runtime_error("plan --processes: the transfer measurement printed nothing");
  }
  return transfer_model_from(*ranks[0]);
}

// Runs `plans` together as K processes of this binary (local launcher, Gloo over loopback).
std::vector<Measured> measure_processes(const PlanModelArgs& args,
                                        const std::vector<pp::Plan>& plans, int threads,
                                        int steps) {
  try {
    return combine_rank_results(
        plans,
        launch_ranks(args, plans.at(0).ranks,
                     {{"runs", plans_to_run(plans, threads, parse_precision(args.precision))},
                      {"steps", steps}}));
  } catch (const std::runtime_error& error) {
    throw std::runtime_error(std::string("plan --processes: ") + error.what());
  }
}

std::string format(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
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
  command.add_option("--optimizer", args.optimizer,
                     "With --model: sgd | momentum | adam (optimizer state 0x/1x/2x params)");
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
                     "With --model: ZeRO stage 0, 1 or 2 over --dp replicas, for the memory "
                     "model and --memory-limit (default 0)");
  command.add_option("--dp", args.dp,
                     "With --model: data-parallel replicas of each rank, for the memory model "
                     "(default 1); --sample-shape is then one replica's share of the mini-batch");
  command.add_option("--precision", args.precision,
                     "With --model: fp32 (default) or bf16: the profile runs the layers under "
                     "autocast, so times, activations and messages are a bf16 stage's (weights, "
                     "gradients and optimizer state stay float32)");
}

namespace {

void check_plan_args(const PlanModelArgs& args) {
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
  if (args.zero < 0 || args.zero > 2) {
    throw UsageError("--zero must be 0, 1 or 2 (got " + std::to_string(args.zero) + ")");
  }
  if (args.zero > 0 && args.dp < 2) {
    throw UsageError("--zero " + std::to_string(args.zero) +
                     " shards over data-parallel replicas and needs --dp 2 or more");
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
}

pp::PlannerOptions planner_options(const PlanModelArgs& args) {
  pp::PlannerOptions planner;
  planner.ranks = args.stages > 0 ? args.stages : 2;
  planner.top = args.top;
  planner.optimizer_state_multiple = optimizer_state_multiple(args.optimizer);
  planner.zero = args.zero;
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

// What the command found: the model, its profile, the planner's report and the default plan.
struct PlanResult {
  LoadedModel model;
  pp::PlannerOptions planner;
  pp::ModelProfile profile;
  pp::PlanReport report;
  int default_chunks = 1;
  pp::Plan fallback;  // the hand-written default: 1f1b, default_chunks, even balance
  std::optional<Verification> verification;
  double load_average = 0;
};

// [1] [2] [3]: load and profile the model, plan, calibrate and measure when asked. `run` then
// measures plans on the model in `r` (processes or this one), so `r` must outlive it.
void plan_model(const PlanModelArgs& args, PlanResult& r, RunPlans& run) {
  r.planner = planner_options(args);
  r.model = load_model(args);
  if (r.planner.ranks > r.model.layers()) {
    throw UsageError("--stages " + std::to_string(r.planner.ranks) + " but the model has " +
                     std::to_string(r.model.layers()) + " layers; use at most that many");
  }
  if (r.model.llama && (args.calibrate || args.verify || args.processes)) {
    throw UsageError(
        "--calibrate, --verify and --processes run the whole model; a Hugging Face "
        "--model is planned from a profile of one decoder layer: drop them");
  }
  const pp::ProfileOptions profiling =
      pp::ProfileOptions().precision(parse_precision(args.precision));
  if (r.model.llama) {
    r.profile = as_usage_error(
        "cannot profile the model on ids of shape " + args.sample_shape,
        [&] { return models::profile_llama(*r.model.llama, r.model.sample, profiling); });
    r.report = pp::plan_pipeline(r.profile, r.planner);
  } else
    r.report =
        as_usage_error("cannot profile the model on a batch of shape " + args.sample_shape, [&] {
          return pp::recommend_report(r.model.sequential, r.model.sample, r.planner, profiling,
                                      &r.profile);
        });
  if (args.processes && r.planner.ranks > 1) {
    r.profile.transfer = measure_gloo_transfer(args, largest_boundary_bytes(r.profile));
    r.report = pp::plan_pipeline(r.profile, r.planner);
  }
  if (!args.profile_out.empty()) {
    pipetrain::write_file_atomically(args.profile_out, nlohmann::json(r.profile).dump(1) + "\n");
  }
  r.default_chunks = r.profile.batch_size % 4 == 0 ? 4 : 1;
  auto evaluate_default = [&] {
    return pp::evaluate_plan(
        r.profile, pp::default_plan(r.profile, r.planner.ranks, r.default_chunks), r.planner);
  };
  run = [&args, &r](const std::vector<pp::Plan>& plans, int steps) {
    return args.processes ? measure_processes(args, plans, r.profile.intra_op_threads, steps)
                          : measure_in_process(r.model.sequential, r.model.sample, plans,
                                               r.profile.intra_op_threads, steps,
                                               parse_precision(args.precision));
  };
  if (args.calibrate || args.verify) {
    calibrate_in_process(r.model.sequential, r.model.sample, r.profile, r.planner,
                         [](const Diagnostic& d) { std::cerr << d.text << "\n"; });
    if (args.processes) calibrate_processes(r.profile, r.planner, run);
    r.report = pp::plan_pipeline(r.profile, r.planner);
    const pp::Plan reference = evaluate_default();
    recommend_by_measurement(r.profile, r.planner, r.report, &reference, run, args.verify_steps);
  }
  r.fallback = evaluate_default();
}

const std::vector<std::string> kVerifyNames = {"recommended", "default"};

std::string verify_text(const PlanModelArgs& args, const PlanResult& r) {
  const Verification& v = *r.verification;
  std::ostringstream text;
  text << "\nverify (load average " << format("%.1f", r.load_average) << " on "
       << std::thread::hardware_concurrency() << " cores): "
       << (args.processes ? "one process per rank (Gloo over loopback), " : "in-process Pipe, ")
       << r.profile.intra_op_threads << " thread(s) per stage; the two plans in turn step by step, "
       << v.rounds << " rounds of " << v.steps_per_round
       << " timed steps each (zero_grad + train_step + SGD step), medians over all\n"
       << verification_text(v, kVerifyNames);
  return text.str();
}

void write_memory_text(std::ostream& out, const PlanModelArgs& args, const PlanResult& r) {
  const pp::Plan& plan = r.report.recommended();
  out << "\nmemory of the recommended plan per rank (micro-batch " << plan.microbatch_size
      << ", zero " << args.zero << ", dp " << args.dp
      << (args.processes ? ", one process per rank" : ", one process") << "; "
      << (args.precision == "bf16" ? "bf16 stages, float32 weights" : "float32")
      << ", the loss's own tensors not included):\n"
      << rank_memory_text(pp::plan_memory(r.profile, plan, r.planner));
}

std::string report_json(const PlanModelArgs& args, const PlanResult& r) {
  nlohmann::json out = r.report;
  out["model"] = r.model.description;
  out["ranks"] = r.planner.ranks;
  out["memory_limit_bytes"] = r.planner.memory_limit_bytes;
  out["default"] = r.fallback;
  out["profile"] = r.profile;
  out["precision"] = args.precision;
  if (args.memory && r.report.found()) {
    out["memory_per_rank"] =
        rank_memory_json(pp::plan_memory(r.profile, r.report.recommended(), r.planner));
  }
  if (args.verify) {
    out["verify"] =
        r.verification ? verification_json(*r.verification, kVerifyNames) : nlohmann::json::array();
    out["verify_recommended_over_default"] =
        r.verification ? r.verification->first_over_second : 0.0;
  }
  return out.dump(1) + "\n";
}

std::string report_text(const PlanModelArgs& args, const PlanResult& r) {
  const pp::PlanReport& report = r.report;
  std::ostringstream out;
  out << "model: " << r.model.description << ", sample " << args.sample_shape << "\n";
  out << profile_text(r.profile, report.found() ? report.recommended().microbatch_size
                                                : r.profile.batch_size / r.default_chunks);
  out << "\nplan: " << r.planner.ranks << " ranks, memory limit "
      << (r.planner.memory_limit_bytes > 0 ? pp::format_bytes(r.planner.memory_limit_bytes)
                                           : std::string("none"))
      << " per rank, optimizer " << args.optimizer << "\n  searched " << report.candidates
      << " candidates: " << report.simulated << " simulated, " << report.pruned << " pruned, "
      << report.rejected_memory << " over the limit, in " << format("%.3f", report.planning_seconds)
      << " s\n";
  if (report.found()) {
    out << plan_table_text(report) << recommendation_text(report, r.profile);
    if (args.memory) write_memory_text(out, args, r);
  } else {
    out << "\nno plan fits " << pp::format_bytes(r.planner.memory_limit_bytes)
        << " per rank; the smallest limit that works is "
        << pp::format_bytes(report.smallest_fitting_limit) << " (" << report.smallest_fitting_limit
        << " bytes) with " << report.smallest_fitting_plan.describe() << "\n";
  }
  out << default_plan_text(r.fallback, r.default_chunks);
  if (r.verification) out << verify_text(args, r);
  return out.str();
}

}  // namespace

int run_plan_for_model(const PlanModelArgs& args) {
  check_plan_args(args);
  for (const auto& [flag, path] :
       {std::pair{"--output", args.output}, {"--profile-out", args.profile_out}}) {
    if (!path.empty()) as_usage_error(flag, [&] { pipetrain::check_writable(path); });
  }
  if (!args.rank_job.empty()) {  // one rank of a measurement the parent launched
    const nlohmann::json job = nlohmann::json::parse(args.rank_job);
    return job.value("mode", std::string("plan")) == "transfer"
               ? run_transfer_rank(job)
               : run_verify_rank(args, job.at("runs"), job.at("steps").get<int>());
  }
  PlanResult result;
  RunPlans run;
  plan_model(args, result, run);
  if (args.verify && result.report.found()) {  // [4]
    result.load_average = read_load_average().one_minute;
    const std::vector<pp::Plan> plans = {result.report.recommended(), result.fallback};
    result.verification = verify_plans(plans, run, args.verify_rounds,
                                       steps_to_measure(plans, args.verify_steps, 1.5));
  }
  emit(args, args.format == "json" ? report_json(args, result) : report_text(args, result));  // [5]
  return result.report.found() ? 0 : 1;
}

}  // namespace pipetrain::cli
