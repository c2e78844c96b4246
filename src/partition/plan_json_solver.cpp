// The planner's JSON (planner.h): Plan and PlanReport written as JSON, and a plan read back from
// it (parse_plan_json), every field checked first.
// (The "_solver" suffix puts this torch-free file in the pipetrain_schedule library.)
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipetrain/base/error.h"
#include "pipetrain/partition/planner.h"
#include "pipetrain/schedule/checkpoint_mode.h"
#include "pipetrain/schedule/generators.h"

namespace pipetrain::partition {

void to_json(nlohmann::json& out, const Plan& plan) {
  out = {{"schedule", plan.schedule},
         {"ranks", plan.ranks},
         {"chunks", plan.microbatches},
         {"microbatch_size", plan.microbatch_size},
         {"virtual_stages", plan.virtual_stages},
         {"checkpoint", to_string(plan.checkpoint)},
         {"balance", plan.balance},
         {"predicted_step_seconds", plan.predicted_step_seconds},
         {"makespan_seconds", plan.makespan_seconds},
         {"update_seconds", plan.update_seconds},
         {"bubble_fraction", plan.bubble_fraction},
         {"busy_seconds_per_rank", plan.busy_seconds_per_rank},
         {"peak_memory_bytes", plan.peak_memory_bytes},
         {"peak_memory_per_rank", plan.peak_memory_per_rank},
         {"peak_inflight_per_stage", plan.peak_inflight},
         {"fits", plan.fits},
         {"balanced_for_memory", plan.balanced_for_memory}};
}

namespace {

// An integer field as T, checked: nlohmann's get<int>() of 2.6e36 is undefined behaviour (found
// by fuzz/plan_json_fuzzer.cpp), so a non-integer or one outside T's range is BadInput.
template <typename T>
T integer_of(const nlohmann::json& value, const char* key) {
  if (!value.is_number_integer()) {
    throw BadInput(std::string("plan: ") + key + " must be an integer, got " + value.dump());
  }
  if (value.is_number_unsigned()
          ? value.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<T>::max())
          : value.get<std::int64_t>() < std::numeric_limits<T>::min() ||
                value.get<std::int64_t>() > std::numeric_limits<T>::max()) {
    throw BadInput(std::string("plan: ") + key + " " + value.dump() + " is out of range");
  }
  return static_cast<T>(value.get<std::int64_t>());
}

template <typename T>
std::vector<T> integers_of(const nlohmann::json& value, const char* key) {
  if (!value.is_array()) {
    throw BadInput(std::string("plan: ") + key + " must be an array, got " + value.dump());
  }
  std::vector<T> out;
  for (const auto& element : value) out.push_back(integer_of<T>(element, key));
  return out;
}

}  // namespace

void from_json(const nlohmann::json& in, Plan& plan) {
  plan.schedule = in.at("schedule").get<std::string>();
  plan.ranks = integer_of<int>(in.at("ranks"), "ranks");
  plan.microbatches = integer_of<int>(in.at("chunks"), "chunks");
  plan.virtual_stages = integer_of<int>(in.at("virtual_stages"), "virtual_stages");
  plan.checkpoint = parse_checkpoint(in.at("checkpoint").get<std::string>());
  plan.balance = integers_of<int>(in.at("balance"), "balance");
  auto optional = [&in](const char* key, auto& value) {
    if (in.contains(key)) in.at(key).get_to(value);
  };
  if (in.contains("microbatch_size")) {
    plan.microbatch_size = integer_of<std::int64_t>(in.at("microbatch_size"), "microbatch_size");
  }
  optional("predicted_step_seconds", plan.predicted_step_seconds);
  optional("makespan_seconds", plan.makespan_seconds);
  optional("update_seconds", plan.update_seconds);
  optional("bubble_fraction", plan.bubble_fraction);
  optional("busy_seconds_per_rank", plan.busy_seconds_per_rank);
  if (in.contains("peak_memory_bytes")) {
    plan.peak_memory_bytes =
        integer_of<std::int64_t>(in.at("peak_memory_bytes"), "peak_memory_bytes");
  }
  if (in.contains("peak_memory_per_rank")) {
    plan.peak_memory_per_rank =
        integers_of<std::int64_t>(in.at("peak_memory_per_rank"), "peak_memory_per_rank");
  }
  if (in.contains("peak_inflight_per_stage")) {
    plan.peak_inflight =
        integers_of<int>(in.at("peak_inflight_per_stage"), "peak_inflight_per_stage");
  }
  optional("fits", plan.fits);
  optional("balanced_for_memory", plan.balanced_for_memory);
}

Plan parse_plan_json(std::string_view text) {
  Plan plan;
  try {
    const nlohmann::json in = nlohmann::json::parse(text);
    if (!in.is_object()) throw BadInput("a plan must be a JSON object, got " + in.dump());
    from_json(in, plan);
  } catch (const nlohmann::json::exception& error) {
    throw BadInput(std::string("not a plan: ") + error.what());
  }
  if (plan.ranks < 1 || plan.microbatches < 1 || plan.virtual_stages < 1) {
    throw BadInput("plan: ranks, chunks and virtual_stages must be >= 1 (got " +
                   std::to_string(plan.ranks) + ", " + std::to_string(plan.microbatches) + ", " +
                   std::to_string(plan.virtual_stages) + ")");
  }
  if (static_cast<std::int64_t>(plan.balance.size()) !=
      static_cast<std::int64_t>(plan.ranks) * plan.virtual_stages) {
    throw BadInput("plan: balance has " + std::to_string(plan.balance.size()) +
                   " stages but ranks x virtual_stages = " + std::to_string(plan.ranks) + " x " +
                   std::to_string(plan.virtual_stages));
  }
  for (int layers : plan.balance) {
    if (layers < 1) throw BadInput("plan: balance entries must be >= 1 layer each");
  }
  const std::string why =
      schedule::shape_error(plan.schedule, plan.ranks, plan.microbatches, plan.virtual_stages);
  if (!why.empty()) throw BadInput("plan: schedule " + plan.schedule + ": " + why);
  return plan;
}

void to_json(nlohmann::json& out, const PlanReport& report) {
  out = nlohmann::json::object();
  out["recommended"] = report.found() ? nlohmann::json(report.recommended()) : nlohmann::json();
  nlohmann::json ranked = nlohmann::json::array();
  for (const auto& plan : report.ranked) ranked.push_back(plan);
  out["ranked"] = ranked;
  out["recommended_by"] = report.measured.empty() ? "prediction" : "measurement";
  if (!report.measured.empty()) {
    nlohmann::json measured = nlohmann::json::array();
    for (const auto& run : report.measured) {
      nlohmann::json entry = run.plan;
      entry["measured_step_seconds"] = run.measured_step_seconds;
      measured.push_back(entry);
    }
    out["measured"] = measured;
  }
  if (!report.found() && report.smallest_fitting_limit > 0) {
    out["smallest_fitting_limit_bytes"] = report.smallest_fitting_limit;
    out["smallest_fitting_plan"] = report.smallest_fitting_plan;
  }
  out["search"] = {{"candidates", report.candidates},
                   {"simulated", report.simulated},
                   {"pruned", report.pruned},
                   {"rejected_memory", report.rejected_memory},
                   {"planning_seconds", report.planning_seconds}};
}

}  // namespace pipetrain::partition
