// plan --model as one library call (tune/model_plan.h). [n] cite the header's steps.
#include "pipetrain/tune/model_plan.h"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "pipetrain/base/error.h"
#include "pipetrain/base/format_text.h"
#include "pipetrain/base/load_average.h"
#include "pipetrain/base/median.h"
#include "pipetrain/base/message_of.h"
#include "pipetrain/models/llama_profile.h"
#include "pipetrain/partition/memory.h"
#include "pipetrain/partition/recommend.h"
#include "pipetrain/runtime/distributed.h"
#include "pipetrain/runtime/launcher.h"
#include "pipetrain/train/sharded_optimizer.h"
#include "pipetrain/tune/plan_report.h"

namespace pipetrain::tune {

const char* const kModelPlanRankPrefix = "PIPETRAIN_PLAN_VERIFY ";

namespace {

namespace pp = pipetrain::partition;

const std::vector<std::string> kVerifyNames = {"recommended", "default"};

int64_t layers_of(const ModelPlanRequest& r) {
  return r.llama ? r.llama->entries() : static_cast<int64_t>(r.model->size());
}

std::string shape_of(const torch::Tensor& t) {
  std::ostringstream text;
  text << t.sizes();
  return text.str();
}

// Starts this program as `nproc` ranks of `job` and returns each rank's result (nullopt for a
// rank that printed none).
std::vector<std::optional<nlohmann::json>> launch_ranks(const ModelPlanRequest& r, int nproc,
                                                        const nlohmann::json& job) {
  std::vector<std::string> arguments = r.rank_arguments;
  arguments.push_back(job.dump());
  const CollectedRun run = launch_self_collecting(nproc, arguments, kModelPlanRankPrefix);
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

// [2] The transfer between two processes over Gloo on this machine.
pp::TransferModel measure_gloo_transfer(const ModelPlanRequest& r, int64_t large) {
  const auto ranks = launch_ranks(r, 2, transfer_job(large));
  if (!ranks[0]) {
    throw std::runtime_error("plan --processes: the transfer measurement printed nothing");
  }
  return transfer_model_from(*ranks[0]);
}

// [1] [2]: the profile and the plans.
void profile_and_plan(const ModelPlanRequest& r, ModelPlanResult& result) {
  const pp::ProfileOptions profiling = pp::ProfileOptions()
                                           .precision(r.precision)
                                           .repeats(r.profile_repeats)
                                           .warmup(r.profile_warmup);
  try {
    if (r.llama) {
      result.profile = models::profile_llama(*r.llama, r.sample, profiling);
      result.report = pp::plan_pipeline(result.profile, r.planner);
    } else {
      torch::nn::Sequential model = r.model;
      result.report = pp::recommend_report(model, r.sample, r.planner, profiling, &result.profile);
    }
  } catch (const Error& error) {
    throw BadInput("cannot profile the model on a batch of shape " + shape_of(r.sample) + ": " +
                   error.what());
  } catch (const c10::Error& error) {
    throw BadInput("cannot profile the model on a batch of shape " + shape_of(r.sample) + ": " +
                   message_of(error));
  }
  if (r.processes && r.planner.ranks > 1) {
    result.profile.transfer = measure_gloo_transfer(r, largest_boundary_bytes(result.profile));
    result.report = pp::plan_pipeline(result.profile, r.planner);
  }
}

}  // namespace

ModelPlanResult plan_model(const ModelPlanRequest& request) {
  ModelPlanRequest r = request;
  // ZeRO-3 under bf16 gathers the linears' weights narrowed (the trainer's default policy): the
  // memory model sizes those buffers so, as train --report-memory does.
  r.planner.cast_gathers =
      train::gathers_narrowed(train::ZeroOptions().stage(r.planner.zero), r.precision);
  if (r.planner.ranks > layers_of(r)) {
    throw BadInput("--stages " + std::to_string(r.planner.ranks) + " but the model has " +
                   std::to_string(layers_of(r)) + " layers; use at most that many");
  }
  if (r.llama && (r.calibrate || r.verify || r.processes)) {
    throw BadInput(
        "--calibrate, --verify and --processes run the whole model; a Hugging Face "
        "--model is planned from a profile of one decoder layer: drop them");
  }
  if (r.processes && r.rank_arguments.empty()) {
    throw BadInput(
        "plan_model: processes needs rank_arguments (how to start this program as a rank)");
  }
  ModelPlanResult result;
  result.planner = r.planner;
  profile_and_plan(r, result);
  result.default_chunks = result.profile.batch_size % 4 == 0 ? 4 : 1;
  auto evaluate_default = [&] {
    return pp::evaluate_plan(
        result.profile, pp::default_plan(result.profile, r.planner.ranks, result.default_chunks),
        r.planner);
  };
  torch::nn::Sequential model = r.model;
  const RunPlans run = [&](const std::vector<pp::Plan>& plans, int steps) {
    if (!r.processes) {
      return measure_in_process(model, r.sample, plans, result.profile.intra_op_threads, steps,
                                r.precision);
    }
    const nlohmann::json job = {
        {"runs", plans_to_run(plans, result.profile.intra_op_threads, r.precision)},
        {"steps", steps}};
    try {
      return combine_rank_results(plans, launch_ranks(r, plans.at(0).ranks, job));
    } catch (const std::runtime_error& error) {
      throw std::runtime_error(std::string("plan --processes: ") + error.what());
    }
  };
  if (r.calibrate || r.verify) {  // [3]
    calibrate_in_process(model, r.sample, result.profile, r.planner, r.diagnostics);
    if (r.processes) calibrate_processes(result.profile, r.planner, run);
    result.report = pp::plan_pipeline(result.profile, r.planner);
    const pp::Plan reference = evaluate_default();
    recommend_by_measurement(result.profile, r.planner, result.report, &reference, run,
                             r.verify_steps);
  }
  result.fallback = evaluate_default();
  if (r.verify && result.report.found()) {  // [4]
    result.load_average = read_load_average().one_minute;
    const std::vector<pp::Plan> plans = {result.report.recommended(), result.fallback};
    result.verification =
        verify_plans(plans, run, r.verify_rounds, steps_to_measure(plans, r.verify_steps, 1.5));
  }
  return result;
}

// tune/world_plan.h [2]: per message size the median over `trips` all-reduces over the rank's
// tensor-parallel group (the whole world in run_model_plan_rank's job), each started together (a
// barrier). Rank 0's result.
nlohmann::json measure_allreduce_on_rank(Distributed& distributed, const nlohmann::json& job) {
  const auto& group = distributed.tensor_parallel_group();
  const int trips = job.at("trips").get<int>();
  nlohmann::json sizes = nlohmann::json::array();
  for (const auto& bytes : job.at("bytes")) {
    const int64_t n = bytes.get<int64_t>();
    std::vector<torch::Tensor> tensors{torch::ones({std::max<int64_t>(1, n / 4)})};
    std::vector<double> seconds;
    for (int t = 0; t < trips + 3; ++t) {
      group->barrier();
      const auto start = std::chrono::steady_clock::now();
      group->allreduce_sum(tensors);
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (t >= 3) seconds.push_back(elapsed);  // after 3 warm-up trips
    }
    sizes.push_back({{"bytes", n}, {"seconds", median(seconds)}});
  }
  return distributed.rank() == 0 ? nlohmann::json{{"sizes", sizes}, {"trips", trips}}
                                 : nlohmann::json();
}

int run_model_plan_rank(const nlohmann::json& job, torch::nn::Sequential model,
                        const torch::Tensor& sample) {
  DistributedOptions options;
  if (job.value("mode", std::string("plan")) == "allreduce") {
    options.pipeline_ranks(1)
        .tensor_parallel(DistributedEnvironment::from_environment().world_size)
        .timeout(std::chrono::seconds(60));
    return run_distributed(options, [&](Distributed& distributed) {
      const nlohmann::json result = measure_allreduce_on_rank(distributed, job);
      if (!result.is_null()) std::cout << kModelPlanRankPrefix << result.dump() << std::endl;
    });
  }
  if (job.value("mode", std::string("plan")) == "transfer") {
    options.pipeline_ranks(2).timeout(std::chrono::seconds(60));
    return run_distributed(options, [&](Distributed& distributed) {
      const nlohmann::json result = ping_pong_on_rank(distributed, job);
      if (!result.is_null()) std::cout << kModelPlanRankPrefix << result.dump() << std::endl;
    });
  }
  const nlohmann::json& runs = job.at("runs");
  const int steps = job.at("steps").get<int>();
  options.pipeline_ranks(runs.at(0).at("ranks").get<int>()).timeout(std::chrono::seconds(120));
  return run_distributed(options, [&](Distributed& distributed) {
    const nlohmann::json result = run_plans_on_rank(distributed, model, sample, runs, steps);
    std::cout << kModelPlanRankPrefix << result.dump() << std::endl;
  });
}

namespace {

std::string verify_text(const ModelPlanRequest& r, const ModelPlanResult& result) {
  const Verification& v = *result.verification;
  std::ostringstream text;
  text << "\nverify (load average " << format_text("%.1f", result.load_average) << " on "
       << std::thread::hardware_concurrency() << " cores): "
       << (r.processes ? "one process per rank (Gloo over loopback), " : "in-process Pipe, ")
       << result.profile.intra_op_threads
       << " thread(s) per stage; the two plans in turn step by step, " << v.rounds << " rounds of "
       << v.steps_per_round
       << " timed steps each (zero_grad + train_step + SGD step), medians over all\n"
       << verification_text(v, kVerifyNames);
  return text.str();
}

}  // namespace

std::string model_plan_text(const ModelPlanRequest& r, const ModelPlanResult& result,
                            const ModelPlanLabels& labels) {
  const pp::PlanReport& report = result.report;
  std::ostringstream out;
  out << "model: " << labels.model << ", sample " << labels.sample_shape << "\n";
  out << profile_text(result.profile, report.found()
                                          ? report.recommended().microbatch_size
                                          : result.profile.batch_size / result.default_chunks);
  out << "\nplan: " << r.planner.ranks << " ranks, memory limit "
      << (r.planner.memory_limit_bytes > 0 ? pp::format_bytes(r.planner.memory_limit_bytes)
                                           : std::string("none"))
      << " per rank, optimizer " << labels.optimizer << "\n  searched " << report.candidates
      << " candidates: " << report.simulated << " simulated, " << report.pruned << " pruned, "
      << report.rejected_memory << " over the limit, in "
      << format_text("%.3f", report.planning_seconds) << " s\n";
  if (report.found()) {
    out << plan_table_text(report) << recommendation_text(report, result.profile);
    if (labels.memory) {
      const pp::Plan& plan = report.recommended();
      out << "\nmemory of the recommended plan per rank (micro-batch " << plan.microbatch_size
          << ", zero " << r.planner.zero << ", dp " << r.planner.data_parallel
          << (r.processes ? ", one process per rank" : ", one process") << "; "
          << (r.precision == Precision::kBFloat16 ? "bf16 stages, float32 weights" : "float32")
          << ", the loss's own tensors not included):\n"
          << rank_memory_text(pp::plan_memory(result.profile, plan, result.planner));
      if (r.planner.data_parallel > 1) {
        out << "\n"
            << zero_stages_text(memory_by_zero_stage(result.profile, plan, result.planner),
                                r.planner.data_parallel);
      } else {
        out << "\n(ZeRO shards over data-parallel replicas: --dp 2 or more shows ZeRO 0 to 3 "
               "side by side)\n";
      }
    }
  } else {
    out << "\nno plan fits " << pp::format_bytes(r.planner.memory_limit_bytes)
        << " per rank; the smallest limit that works is "
        << pp::format_bytes(report.smallest_fitting_limit) << " (" << report.smallest_fitting_limit
        << " bytes) with " << report.smallest_fitting_plan.describe() << "\n";
  }
  out << default_plan_text(result.fallback, result.default_chunks);
  if (result.verification) out << verify_text(r, result);
  return out.str();
}

nlohmann::json model_plan_json(const ModelPlanRequest& r, const ModelPlanResult& result,
                               const ModelPlanLabels& labels) {
  nlohmann::json out = result.report;
  out["model"] = labels.model;
  out["ranks"] = r.planner.ranks;
  out["memory_limit_bytes"] = r.planner.memory_limit_bytes;
  out["default"] = result.fallback;
  out["profile"] = result.profile;
  out["precision"] = to_string(r.precision);
  if (labels.memory && result.report.found()) {
    out["memory_per_rank"] = rank_memory_json(
        pp::plan_memory(result.profile, result.report.recommended(), result.planner));
    nlohmann::json by_zero = nlohmann::json::array();
    for (const auto& ranks :
         memory_by_zero_stage(result.profile, result.report.recommended(), result.planner)) {
      by_zero.push_back(rank_memory_json(ranks));
    }
    out["memory_per_rank_by_zero"] = by_zero;
  }
  if (r.verify) {
    out["verify"] = result.verification ? verification_json(*result.verification, kVerifyNames)
                                        : nlohmann::json::array();
    out["verify_recommended_over_default"] =
        result.verification ? result.verification->first_over_second : 0.0;
  }
  return out;
}

}  // namespace pipetrain::tune
