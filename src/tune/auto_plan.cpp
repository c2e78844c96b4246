// The `auto` plan of `pipetrain train` (train_auto.h): profile, restrict the planner to what the
// user fixed, search, and turn the result into a line a user can read and a blob a rank can
// decode.
//
//   [1] guard: remember the model's parameters, buffers and the random generator (profiling and
//       calibration run the model in training mode and take SGD steps: batch norms update their
//       statistics, randn draws gradients)
//   [2] profile on the sample batch with the stage workers' thread count, calibrate in this
//       process (plan_calibration.h [1]..[3]); for processes, the measured transfer and [4]
//   [3] search: the planner with its space cut down to the user's fixed values, then its best
//       few plans (and the default when the fixed values allow it) run together and step [5]
//       chooses (plan_calibration.h: the default unless a plan beat it in the same turns, else
//       the fastest measured); or, when the user fixed the balance itself,
//       every (schedule, M, checkpoint) evaluated on that balance, the fastest predicted
//   [4] nothing fits the memory limit -> BadInput naming the smallest limit that works
//
// plan_training_on_ranks: rank 0 plans; its ProcessMeasurer broadcasts each measurement as a job
// ({"job": ...}) that every rank runs (run_job) and gathers the ranks' results; the last message
// is {"plan": ...} or {"error": ...}.
#include "pipetrain/tune/auto_plan.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <optional>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "pipetrain/base/format_text.h"
#include "pipetrain/base/message_of.h"
#include "pipetrain/partition/memory.h"
#include "pipetrain/partition/profiler.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/train/sharded_optimizer.h"
#include "pipetrain/tune/calibration.h"
#include "pipetrain/tune/world_plan.h"

namespace pipetrain::tune {
namespace {

namespace pp = pipetrain::partition;

void note(const AutoPlanInput& input, const std::string& line) {
  if (input.diagnostics) input.diagnostics({Diagnostic::Kind::kProgress, line});
}

// Timed steps per plan of a step [5] round, at least (after 2 warm-up steps).
constexpr int kMeasuredSteps = 3;

std::string no_fit_message(std::int64_t limit, std::int64_t smallest, const pp::Plan& plan) {
  return "no plan fits --memory-limit " + pp::format_bytes(limit) +
         " per rank; the smallest limit that works is " + pp::format_bytes(smallest) + " (" +
         std::to_string(smallest) + " bytes, " + plan.describe() +
         "): raise --memory-limit or use more pipeline ranks";
}

// [3] The user fixed the balance: every (schedule, M, checkpoint) the request leaves open,
// evaluated on that balance; the fastest that fits.
pp::Plan search_with_balance(const pp::ModelProfile& profile, const pp::PlannerOptions& planner,
                             const AutoRequest& request, const AutoPlanInput& input) {
  const int V = static_cast<int>(input.virtual_stages);
  const std::vector<std::string> schedules =
      request.schedule ? schedule::schedule_names() : std::vector<std::string>{input.schedule};
  const bool has_1f1b = std::find(schedules.begin(), schedules.end(), "1f1b") != schedules.end();
  const std::vector<int> counts = request.chunks ? pp::default_microbatch_counts(profile.batch_size)
                                                 : std::vector<int>{static_cast<int>(input.chunks)};
  const std::vector<Checkpoint> modes =
      request.checkpoint ? all_checkpoint_modes()
                         : std::vector<Checkpoint>{parse_checkpoint(input.checkpoint)};
  pp::Plan best, leanest;
  bool found = false, any = false;
  for (const auto& name : schedules) {
    const bool interleaved = name == "interleaved-1f1b";
    if (interleaved ? (V == 1 && has_1f1b) : V != 1) continue;
    for (int M : counts) {
      for (Checkpoint mode : modes) {
        // The planner models zb-h1 without recompute (planner.h); with only --balance auto the
        // user's checkpoint mode still runs.
        if (name == "zb-h1" && mode != Checkpoint::kNever && request.checkpoint) continue;
        pp::Plan spec;
        spec.schedule = name;
        spec.ranks = input.ranks;
        spec.microbatches = M;
        spec.virtual_stages = V;
        spec.checkpoint = mode;
        spec.balance.assign(input.balance.begin(), input.balance.end());
        const pp::Plan plan = pp::evaluate_plan(profile, spec, planner);
        if (!any || plan.peak_memory_bytes < leanest.peak_memory_bytes) leanest = plan;
        any = true;
        if (plan.fits && (!found || plan.predicted_step_seconds < best.predicted_step_seconds)) {
          best = plan;
          found = true;
        }
      }
    }
  }
  if (!any) {
    throw AutoPlanError("--schedule auto with --balance of " +
                        std::to_string(input.balance.size()) + " stages and --virtual " +
                        std::to_string(V) +
                        " leaves no schedule to choose; drop --virtual or the explicit --balance");
  }
  if (!found) {
    throw AutoPlanError(
        no_fit_message(planner.memory_limit_bytes, leanest.peak_memory_bytes, leanest));
  }
  return best;
}

// Step [5]'s reference: the hand-written default (1f1b, 4 chunks, even balance, no
// checkpointing) when every value the user fixed is the default's, so that the run may use it.
std::optional<pp::Plan> default_if_allowed(const pp::ModelProfile& profile,
                                           const pp::PlannerOptions& planner,
                                           const AutoRequest& request, const AutoPlanInput& input) {
  if (profile.batch_size % 4 != 0 || !input.balance.empty()) return std::nullopt;
  if ((!request.schedule && input.schedule != "1f1b") || (!request.chunks && input.chunks != 4) ||
      (!request.checkpoint && input.checkpoint != "never") ||
      (!request.virtual_stages && input.virtual_stages != 1)) {
    return std::nullopt;
  }
  return pp::evaluate_plan(profile, pp::default_plan(profile, input.ranks, 4), planner);
}

// The planner's search cut down to what the user left open; `batch` becomes the rows the planner
// splits (the largest row count an explicit --chunks divides).
pp::PlannerOptions planner_for(const AutoRequest& request, const AutoPlanInput& input,
                               torch::Tensor& batch) {
  pp::PlannerOptions planner;
  planner.ranks = input.ranks;
  planner.memory_limit_bytes = input.memory_limit_bytes;
  planner.optimizer_state_multiple = input.optimizer_state_multiple;
  planner.zero = input.zero;
  planner.reshard_after_forward = input.reshard_after_forward;
  planner.zero_policy = input.zero_policy;
  planner.offload_optimizer = input.offload_optimizer;
  // ZeRO-3 under bf16 gathers the linears' weights narrowed (the trainer's default policy).
  planner.cast_gathers =
      train::gathers_narrowed(train::ZeroOptions().stage(input.zero), input.precision);
  planner.data_parallel = input.data_parallel;
  planner.processes = input.processes;
  planner.top = 3;  // step [5] measures the best few
  if (!request.schedule) planner.schedules = {input.schedule};
  if (!request.checkpoint) {
    // zb-h1 is planned without recompute (planner.h); balance it so and run the user's mode.
    const bool zb_only = !request.schedule && input.schedule == "zb-h1";
    planner.checkpoint_modes = {zb_only ? Checkpoint::kNever : parse_checkpoint(input.checkpoint)};
  }
  if (!request.virtual_stages) planner.virtual_stages = {static_cast<int>(input.virtual_stages)};
  if (!request.chunks) {
    // The planner splits the batch evenly; the runtime also runs uneven micro-batches. Plan on
    // the largest row count that M divides (the same micro-batch size).
    const std::int64_t rows = batch.size(0);
    if (input.chunks > rows) {
      throw AutoPlanError("--chunks " + std::to_string(input.chunks) + " but a mini-batch (or a " +
                          "replica's share) has only " + std::to_string(rows) +
                          " rows; use at most that many chunks or a larger --batch-size");
    }
    batch = batch.narrow(0, 0, rows / input.chunks * input.chunks);
    planner.microbatch_counts = {static_cast<int>(input.chunks)};
  }
  return planner;
}

// [2] The profile of `model` on `batch`, calibrated against the runtime (and the processes).
pp::ModelProfile calibrated_profile(torch::nn::Sequential& model, const torch::Tensor& batch,
                                    const pp::PlannerOptions& planner, const AutoPlanInput& input,
                                    const ProcessMeasurer* processes) {
  pp::ModelProfile profile;
  try {
    profile = pp::profile_sequential(
        model, batch,
        pp::ProfileOptions().intra_op_threads(input.threads).precision(input.precision));
  } catch (const std::exception& error) {  // c10::Error from a layer, BadInput from the profiler
    throw AutoPlanError("cannot profile the model for the auto plan (on a batch of " +
                        std::to_string(batch.size(0)) + " rows): " + message_of(error) +
                        "; give --balance and --schedule explicitly");
  }
  const bool measure_processes = processes && input.ranks > 1;
  note(input, "planning: profiled " + std::to_string(profile.num_layers()) +
                  " layers; calibrating against the runtime" +
                  (measure_processes ? " and the processes" : ""));
  const auto start = std::chrono::steady_clock::now();
  if (measure_processes) profile.transfer = processes->transfer(largest_boundary_bytes(profile));
  calibrate_in_process(model, batch, profile, planner, input.diagnostics);
  if (processes && processes->tensor_parallel_allreduce && input.tensor_parallel_collectives) {
    // The profile and the in-process calibration ran one tp rank's layers with no collective:
    // add the group's before the processes, which run them, calibrate the rest.
    const pp::TransferModel allreduce = processes->tensor_parallel_allreduce();
    input.tensor_parallel_collectives(profile, allreduce);
    note(input,
         format_text("planning: added the tensor-parallel collectives (all-reduce measured on "
                     "the ranks: %.0f us + %.2f GB/s)",
                     allreduce.latency_seconds * 1e6, allreduce.bytes_per_second / 1e9));
  }
  if (measure_processes) calibrate_processes(profile, planner, processes->run);
  note(input,
       format_text("planning: calibrated in %.1f s (%.1f us per layer call, %.2f ms per "
                   "message)",
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                   profile.per_layer_overhead_seconds * 1e6,
                   profile.transfer.message_seconds * 1e3));
  return profile;
}

// [3] [4] The planner's best few, measured against the default (step [5]); the fastest kept.
pp::Plan searched_and_measured(pp::ModelProfile& profile, const pp::PlannerOptions& planner,
                               const AutoRequest& request, const AutoPlanInput& input,
                               const RunPlans& run) {
  pp::PlanReport report = pp::plan_pipeline(profile, planner);
  if (!report.found()) {
    if (planner.memory_limit_bytes > 0 && report.smallest_fitting_limit > 0) {  // [4]
      throw AutoPlanError(no_fit_message(planner.memory_limit_bytes, report.smallest_fitting_limit,
                                         report.smallest_fitting_plan));
    }
    throw AutoPlanError("the planner found no plan for " + std::to_string(input.ranks) +
                        " ranks with these fixed flags; give --schedule/--chunks/--checkpoint "
                        "explicitly");
  }
  const auto start = std::chrono::steady_clock::now();
  const std::optional<pp::Plan> reference = default_if_allowed(profile, planner, request, input);
  recommend_by_measurement(profile, planner, report, reference ? &*reference : nullptr, run,
                           kMeasuredSteps);
  const pp::Plan plan = report.recommended();
  double measured = 0;
  for (const auto& m : report.measured) {
    if (pp::same_plan(m.plan, plan)) measured = m.measured_step_seconds;
  }
  note(input,
       format_text("planning: measured %zu plans together in %.1f s; chosen: %s (%.3g s/step; "
                   "predictions x%.2f)",
                   report.measured.size(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                   plan.describe().c_str(), measured, profile.measured_step_scale));
  return plan;
}

}  // namespace

pp::Plan plan_training(torch::nn::Sequential& model, const torch::Tensor& sample,
                       const AutoRequest& request, const AutoPlanInput& input,
                       const ProcessMeasurer* processes) {
  TORCH_INTERNAL_ASSERT(request.any(), "plan_training without anything to plan");
  const int layers = static_cast<int>(model->size());
  if (input.ranks < 1 || input.ranks * input.virtual_stages > layers) {
    throw AutoPlanError("the auto plan needs " + std::to_string(input.ranks) +
                        " pipeline ranks x " + std::to_string(input.virtual_stages) +
                        " virtual stages <= the model's " + std::to_string(layers) +
                        " layers; use fewer --stages, --nproc or --virtual");
  }
  torch::Tensor batch = sample;
  pp::PlannerOptions planner;
  try {
    planner = planner_for(request, input, batch);
  } catch (const AutoPlanError&) {
    throw;
  } catch (const BadInput& error) {  // the checkpoint name
    throw AutoPlanError(std::string("auto plan: ") + error.what());
  }
  ModelStateGuard guard(model);  // [1], until the plan is chosen
  pp::ModelProfile profile = calibrated_profile(model, batch, planner, input, processes);  // [2]
  const RunPlans run =
      processes && input.ranks > 1
          ? processes->run
          : RunPlans([&](const std::vector<pp::Plan>& plans, int steps) {
              return measure_in_process(model, batch, plans, input.threads, steps, input.precision);
            });
  pp::Plan plan;
  try {
    plan = !input.balance.empty() ? search_with_balance(profile, planner, request, input)
                                  : searched_and_measured(profile, planner, request, input, run);
  } catch (const AutoPlanError&) {
    throw;
  } catch (const BadInput& error) {  // the planner's own checks
    throw AutoPlanError(std::string("auto plan: ") + error.what());
  }
  if (!request.checkpoint) plan.checkpoint = parse_checkpoint(input.checkpoint);
  return plan;
}

std::string describe_auto_plan(const pp::Plan& plan) {
  std::string balance;
  for (int layers : plan.balance) balance += " " + std::to_string(layers);
  std::size_t peak_rank = 0;
  for (std::size_t r = 0; r < plan.peak_memory_per_rank.size(); ++r) {
    if (plan.peak_memory_per_rank[r] > plan.peak_memory_per_rank[peak_rank]) peak_rank = r;
  }
  char predicted[160];
  std::snprintf(predicted, sizeof predicted, "predicted %.3g s/step, peak %s on rank %zu",
                plan.predicted_step_seconds, pp::format_bytes(plan.peak_memory_bytes).c_str(),
                peak_rank);
  return "auto plan: " + plan.schedule + ", chunks " + std::to_string(plan.microbatches) +
         ", balance" + balance + ", checkpoint " + to_string(plan.checkpoint) +
         ", virtual stages " + std::to_string(plan.virtual_stages) + " (" + predicted + ")";
}

namespace {

// Every rank's part of a measurement job: the transfer ping-pong or a plan's timed steps.
nlohmann::json run_job(Distributed& distributed, torch::nn::Sequential& model,
                       const torch::Tensor& sample, const nlohmann::json& job) {
  if (job.at("mode") == "transfer") return ping_pong_on_rank(distributed, job);
  if (job.at("mode") == "allreduce") return measure_allreduce_on_rank(distributed, job);
  return run_plans_on_rank(distributed, model, sample, job.at("runs"), job.at("steps").get<int>());
}

// The results of a job on the ranks of replica 0 (their tp rank 0), by pipeline rank, on rank 0
// (every rank takes part: one broadcast from each of those K world ranks but rank 0), nullopt for
// a rank without one; {} on the other ranks.
std::vector<std::optional<nlohmann::json>> gather_results(Distributed& distributed,
                                                          const nlohmann::json& mine) {
  std::vector<std::optional<nlohmann::json>> results;
  for (int r = 0; r < distributed.layout().pipeline_ranks; ++r) {
    const int from = distributed.layout().rank_of(0, r);  // replica 0, tp rank 0
    const std::string text = from > 0 ? distributed.broadcast_text(mine.dump(), from) : mine.dump();
    const nlohmann::json result = nlohmann::json::parse(text);
    results.push_back(result.is_null() ? std::nullopt : std::optional<nlohmann::json>(result));
  }
  if (distributed.rank() != 0) results.clear();
  return results;
}

}  // namespace

pp::Plan plan_training_on_ranks(Distributed& distributed, torch::nn::Sequential& model,
                                const torch::Tensor& sample, const AutoRequest& request,
                                const AutoPlanInput& input, torch::nn::Sequential* profiled,
                                const torch::Tensor& profiled_sample) {
  std::string last;
  if (distributed.rank() == 0) {
    // plan_training guards the model it profiles; the jobs train `model`: guard it too.
    std::optional<ModelStateGuard> guard;
    if (profiled) guard.emplace(model);
    // Broadcast a job, run this rank's part, gather every rank's result.
    auto on_every_rank = [&](const nlohmann::json& job) {
      distributed.broadcast_text(nlohmann::json{{"job", job}}.dump(), 0);
      return gather_results(distributed, run_job(distributed, model, sample, job));
    };
    ProcessMeasurer measurer;
    measurer.transfer = [&](std::int64_t large) {
      const auto results = on_every_rank(transfer_job(large));
      if (!results[0]) throw TransportFailure("auto plan: the transfer measurement gave nothing");
      return transfer_model_from(*results[0]);
    };
    if (distributed.layout().tensor_parallel > 1) {
      measurer.tensor_parallel_allreduce = [&] {
        const auto results = on_every_rank(allreduce_job(0));
        if (!results[0]) {
          throw TransportFailure("auto plan: the all-reduce measurement gave nothing");
        }
        return allreduce_model_from(*results[0], distributed.layout().tensor_parallel);
      };
    }
    measurer.run = [&](const std::vector<pp::Plan>& plans, int steps) {
      const nlohmann::json job = {{"mode", "plan"},
                                  {"runs", plans_to_run(plans, input.threads, input.precision)},
                                  {"steps", steps}};
      return combine_rank_results(plans, on_every_rank(job));
    };
    try {
      last = nlohmann::json{{"plan", nlohmann::json(plan_training(
                                         profiled ? *profiled : model,
                                         profiled_sample.defined() ? profiled_sample : sample,
                                         request, input, &measurer))}}
                 .dump();
    } catch (const BadInput& error) {
      last = nlohmann::json{{"error", error.what()}}.dump();
    }
    distributed.broadcast_text(last, 0);
  } else {
    ModelStateGuard guard(model);  // the jobs train; plan_training guards rank 0's model
    for (;;) {
      const nlohmann::json message = nlohmann::json::parse(distributed.broadcast_text("", 0));
      if (!message.contains("job")) {
        last = message.dump();
        break;
      }
      gather_results(distributed, run_job(distributed, model, sample, message.at("job")));
    }
  }
  const nlohmann::json decided = nlohmann::json::parse(last);
  if (decided.contains("error")) throw AutoPlanError(decided.at("error").get<std::string>());
  return pp::parse_plan_json(decided.at("plan").dump());
}

AutoPlanInput auto_plan_input(const PipelineRequest& pipeline, const RunLayout& layout,
                              const AutoRequest& request, std::int64_t layers) {
  AutoPlanInput input;
  input.ranks = layout.multi_process ? layout.pipeline_ranks
                : !pipeline.balance.empty()
                    ? static_cast<int>(static_cast<std::int64_t>(pipeline.balance.size()) /
                                       pipeline.virtual_stages)
                    : static_cast<int>(pipeline.stages);
  input.threads = threads_per_rank(pipeline, layout);
  input.data_parallel = layout.replicas;
  input.processes = layout.multi_process;
  input.schedule = pipeline.schedule;
  input.chunks = chunks_of(pipeline, layout);
  input.checkpoint = pipeline.checkpoint;
  input.virtual_stages = pipeline.virtual_stages;
  input.precision = pipeline.precision;
  if (!request.balance) {
    // Not planned: the list given, or the run's own split by layer count (Pipe's rule).
    input.balance = pipeline.balance;
    const std::int64_t stages = input.ranks * pipeline.virtual_stages;
    if (input.balance.empty() && stages >= 1 && stages <= layers) {
      for (int b : pp::even_balance(static_cast<int>(layers), static_cast<int>(stages))) {
        input.balance.push_back(b);
      }
    }
  }
  return input;
}

void apply_auto_plan(PipelineRequest& pipeline, const AutoRequest& request,
                     const partition::Plan& plan) {
  if (request.schedule) pipeline.schedule = plan.schedule;
  if (request.chunks) pipeline.chunks = plan.microbatches;
  if (request.checkpoint) pipeline.checkpoint = to_string(plan.checkpoint);
  if (request.virtual_stages) pipeline.virtual_stages = plan.virtual_stages;
  // One stage needs no balance, and without one a single micro-batch trains sequentially.
  if (request.balance && plan.balance.size() > 1) {
    pipeline.balance.assign(plan.balance.begin(), plan.balance.end());
  }
}

}  // namespace pipetrain::tune
