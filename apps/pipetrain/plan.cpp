// `pipetrain plan`: builds (or loads) a schedule, validates it, simulates it on a cost model and
// prints the result as JSON, a text grid, or an SVG Gantt chart.
//
//   pipetrain plan --stages 4 --microbatches 8 --schedule 1f1b --format text
//   pipetrain plan --schedule-file my.sched --format json
//   pipetrain plan --stages 4 --microbatches 8 --schedule zb-h1 --format svg --output zb.svg
//
// Flow: [1] flags -> PlanRequest, checked (UsageError, exit 2)  [2] schedule: generated or
// loaded, then validated (a bad one exits 2 with the marked grid)  [3] costs: from the --cost-*
// flags (a model-driven planner adds its costs here)  [4] simulate  [5] write json/text/svg.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "job_flags.h"
#include "pipetrain/base/atomic_file.h"
#include "pipetrain/job/console_observer.h"
#include "pipetrain/job/model_data.h"
#include "pipetrain/job/run_job.h"
#include "pipetrain/schedule/auto_schedule.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/grid.h"
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/schedule/text_format.h"
#include "pipetrain/schedule/timeline_svg.h"
#include "pipetrain/schedule/validate.h"

namespace pipetrain::cli {
namespace {

namespace ps = pipetrain::schedule;

struct PlanRequest {
  int stages = 0;  // K: pipeline ranks (0 = not given)
  int microbatches = 0;
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  bool virtual_given = false;  // false: the schedule's own (ps::default_virtual_stages)
  double memory_limit = 0;     // --activation-limit, zb-auto: per rank, micro-batches (0 = K)
  double cost_f = 1;
  double cost_b = 2;
  double cost_i = 1;
  double cost_w = 1;
  double cost_comm = 0;
  std::string schedule_file;
  std::string format = "text";
  std::string output;
  std::string save;
};

// [1]
void check_request(const PlanRequest& request) {
  if (request.format != "json" && request.format != "text" && request.format != "svg") {
    throw UsageError("unknown --format '" + request.format + "'; valid: json, text, svg");
  }
  if (request.format == "svg" && request.output.empty()) {
    throw UsageError("--format svg needs --output FILE (an SVG is not printed to the terminal)");
  }
  const std::pair<const char*, double> costs[] = {{"--cost-f", request.cost_f},
                                                  {"--cost-b", request.cost_b},
                                                  {"--cost-i", request.cost_i},
                                                  {"--cost-w", request.cost_w},
                                                  {"--cost-comm", request.cost_comm}};
  for (const auto& [flag, value] : costs) {
    if (!(value >= 0) || !std::isfinite(value)) {
      throw UsageError(std::string(flag) + " must be a finite time >= 0 (got " +
                       std::to_string(value) + ")");
    }
  }
  if (request.virtual_stages < 1) {
    throw UsageError("--virtual must be >= 1 (got " + std::to_string(request.virtual_stages) + ")");
  }
  if (!(request.memory_limit >= 0) || !std::isfinite(request.memory_limit)) {
    throw UsageError("--activation-limit must be a finite number of micro-batches > 0 (got " +
                     std::to_string(request.memory_limit) + ")");
  }
  if (request.memory_limit > 0 && request.schedule != "zb-auto") {
    throw UsageError("--activation-limit is for --schedule zb-auto (" + request.schedule +
                     " has its own memory)");
  }
  if (!request.schedule_file.empty()) return;  // counts come from the file
  if (request.stages < 1) {
    throw UsageError("--stages must be >= 1 (got " + std::to_string(request.stages) +
                     "); give the number of pipeline ranks, or --schedule-file");
  }
  if (request.microbatches < 1) {
    throw UsageError("--microbatches must be >= 1 (got " + std::to_string(request.microbatches) +
                     ")");
  }
  const auto& names = ps::schedule_names();
  if (std::find(names.begin(), names.end(), request.schedule) == names.end()) {
    throw UsageError("unknown --schedule '" + request.schedule +
                     "'; valid: " + job::join_names(names) + " (or --schedule-file FILE)");
  }
}

int virtual_stages_of(const PlanRequest& request) {
  return request.virtual_given ? request.virtual_stages
                               : ps::default_virtual_stages(request.schedule);
}

// [3]
ps::Costs resolve_costs(const PlanRequest& request) {
  ps::Costs costs;
  costs.forward = request.cost_f;
  costs.backward = request.cost_b;
  costs.backward_input = request.cost_i;
  costs.backward_weight = request.cost_w;
  costs.comm = request.cost_comm;
  return costs;
}

// [2]
ps::Schedule resolve_schedule(const PlanRequest& request) {
  ps::Schedule schedule;
  if (!request.schedule_file.empty()) {
    try {
      schedule = ps::load_schedule(request.schedule_file);
    } catch (const std::exception& e) {
      throw UsageError(e.what());
    }
    if (request.stages > 0 && request.stages != schedule.num_ranks) {
      throw UsageError("--stages " + std::to_string(request.stages) + " but '" +
                       request.schedule_file + "' has " + std::to_string(schedule.num_ranks) +
                       " rank lines; drop --stages or fix the file");
    }
    if (request.microbatches > 0 && request.microbatches != schedule.num_microbatches) {
      throw UsageError("--microbatches " + std::to_string(request.microbatches) + " but '" +
                       request.schedule_file + "' uses " +
                       std::to_string(schedule.num_microbatches) + " micro-batches");
    }
  } else {
    try {
      if (request.schedule == "zb-auto") {
        // The auto scheduler on this request's costs and memory limit.
        ps::AutoScheduleOptions options;
        options.ranks = request.stages;
        options.microbatches = request.microbatches;
        options.virtual_stages = virtual_stages_of(request);
        const std::string why =
            ps::shape_error("zb-auto", options.ranks, options.microbatches, options.virtual_stages);
        if (!why.empty()) throw UsageError(why);
        options.costs = resolve_costs(request);
        options.memory_limit = {request.memory_limit > 0 ? request.memory_limit
                                                         : double(request.stages)};
        schedule = ps::zero_bubble_auto(options);
      } else {
        schedule = ps::make_schedule(request.schedule, request.stages, request.microbatches,
                                     virtual_stages_of(request));
      }
    } catch (const pipetrain::BadInput& e) {
      throw UsageError(e.what());
    }
  }
  ps::CheckResult result = ps::check(schedule);
  if (!result.ok) throw UsageError(result.message);
  return schedule;
}

// [5]
std::string to_json(const ps::Schedule& schedule, const ps::SimulationResult& result) {
  nlohmann::json actions = nlohmann::json::array();
  for (const auto& list : schedule.actions) {
    nlohmann::json rank = nlohmann::json::array();
    for (const auto& action : list) rank.push_back(ps::to_string(action));
    actions.push_back(std::move(rank));
  }
  nlohmann::json out = {{"schedule", schedule.name},
                        {"stages", schedule.num_ranks},
                        {"total_stages", schedule.num_stages},
                        {"microbatches", schedule.num_microbatches},
                        {"virtual_stages", schedule.virtual_stages()},
                        {"makespan", result.makespan},
                        {"bubble_fraction", result.bubble_fraction},
                        {"bubble_time", result.bubble_time},
                        {"span_idle", result.span_idle},
                        {"peak_activations", result.peak_activations},
                        {"peak_rank_activations", result.peak_rank_activations},
                        {"stage_rank", schedule.stage_rank},
                        {"actions", std::move(actions)}};
  return out.dump() + "\n";
}

std::string to_text(const ps::Schedule& schedule, const ps::SimulationResult& result) {
  std::ostringstream out;
  out << schedule.name << ": " << schedule.num_ranks << " ranks, " << schedule.num_stages
      << " stages, " << schedule.num_microbatches << " micro-batches\n";
  out << "makespan " << result.makespan << ", bubble fraction " << result.bubble_fraction
      << ", bubble time " << result.bubble_time << "\npeak activations per stage:";
  for (int peak : result.peak_activations) out << ' ' << peak;
  out << "\npeak activations per rank (micro-batches of its share):";
  for (double peak : result.peak_rank_activations) out << ' ' << peak;
  out << "\n\n" << ps::render_time_grid(result.timeline());
  return out.str();
}

void run_plan(const PlanRequest& request) {
  check_request(request);
  for (const auto& [flag, path] :
       {std::pair{"--save", request.save}, {"--output", request.output}}) {
    if (!path.empty()) as_bad_input(flag, [&] { pipetrain::check_writable(path); });
  }
  const ps::Schedule schedule = resolve_schedule(request);
  const ps::Costs costs = resolve_costs(request);
  const ps::SimulationResult result = ps::simulate(schedule, costs);
  if (!request.save.empty()) ps::save_schedule(schedule, request.save, schedule.name);
  if (request.format == "svg") {
    char title[256];
    std::snprintf(title, sizeof title, "%s: %d ranks, %d micro-batches, bubble %.3f",
                  schedule.name.c_str(), schedule.num_ranks, schedule.num_microbatches,
                  result.bubble_fraction);
    ps::save_svg(result.timeline(title), request.output);
    return;
  }
  const std::string text =
      request.format == "json" ? to_json(schedule, result) : to_text(schedule, result);
  if (request.output.empty()) {
    std::cout << text;
  } else {
    pipetrain::write_file_atomically(request.output, text);
  }
}

}  // namespace

void add_plan_command(CLI::App& app, int& exit_code) {
  auto request = std::make_shared<PlanRequest>();
  auto* command = app.add_subcommand(
      "plan", "Build or load a pipeline schedule, validate it, simulate it on a cost model");
  command->add_option("--microbatches", request->microbatches, "Micro-batches M (>= 1)");
  command->add_option("--schedule", request->schedule,
                      "gpipe | 1f1b | interleaved-1f1b | zb-h1 | zb-h2 | zb-v | v-half | v-min | "
                      "interleaved-zb | looped-bfs | dualpipev | zb-auto (default 1f1b)");
  command
      ->add_option("--virtual", request->virtual_stages,
                   "Chunks per rank V (interleaved-1f1b, interleaved-zb, looped-bfs; default: 2, "
                   "but 1 for interleaved-1f1b; the V-shaped schedules take only 2)")
      ->each([request](const std::string&) { request->virtual_given = true; });
  command->add_option("--activation-limit", request->memory_limit,
                      "zb-auto: most stashed micro-batches per rank (default K, 1F1B's peak)");
  command->add_option("--save", request->save,
                      "Also write the schedule to FILE (text form, or torch's CSV for *.csv)");
  command->add_option("--cost-f", request->cost_f, "Forward time per rank's share (default 1)");
  command->add_option("--cost-b", request->cost_b, "Full backward time (default 2)");
  command->add_option("--cost-i", request->cost_i, "Input-gradient backward time (default 1)");
  command->add_option("--cost-w", request->cost_w, "Weight-gradient backward time (default 1)");
  command->add_option("--cost-comm", request->cost_comm,
                      "Transfer latency between ranks (default 0)");
  command->add_option(
      "--schedule-file", request->schedule_file,
      "Load a custom schedule (one line per rank, e.g. 0F0,0F1,0B0,0B1; *.csv: torch's CSV)");
  // --model: profile a model and search the plan space (job::run_model_plan); the job's fields
  // include --stages, --format and --output, which a schedule's plan reads too.
  std::shared_ptr<JobCommand> job = add_job_flags(*command, job::Command::kPlanModel);
  auto rank_job = std::make_shared<std::string>();
  command->add_option("--rank-job", *rank_job)->group("");
  command->callback([request, job, rank_job, &exit_code] {
    if (!job->config.plan.model.empty()) {
      apply_deepspeed_config(*job);
      if (print_config_if_asked(*job)) {
        exit_code = 0;
        return;
      }
      job::ConsoleObserver console;
      exit_code = job::run_model_plan(job->config, console, *rank_job).exit_code;
      return;
    }
    request->stages = static_cast<int>(job->config.plan.stages);
    request->format = job->config.plan.format;
    request->output = job->config.plan.output;
    run_plan(*request);
    exit_code = 0;
  });
}

}  // namespace pipetrain::cli
