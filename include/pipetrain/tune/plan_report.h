// The report of `pipetrain plan --model` in pieces, as text and JSON: the profile, the ranked
// plans, the measured plans and the recommendation, the memory per rank and a verification. The
// CLI prints them; a C++ user who runs the planner prints the same.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipetrain/partition/memory.h"
#include "pipetrain/partition/planner.h"
#include "pipetrain/partition/profile.h"
#include "pipetrain/tune/verify.h"

namespace pipetrain::tune {

// "profile: 6 layers, batch 256, ...", the runtime calibration (or "not calibrated"), threads,
// the transfer model, then one row per layer at `microbatch_size`: parameters, F, B, I and W times
// and activation bytes.
std::string profile_text(const partition::ModelProfile& profile, std::int64_t microbatch_size);

// The ranked plans, one row each (schedule, V, M, checkpoint, step ms, bubble, peak memory per
// rank, balance), the recommended one marked '*'.
std::string plan_table_text(const partition::PlanReport& report);

// The plans measured by recommend_by_measurement, if any (predicted and measured step times,
// `profile.measured_step_scale`), then the recommended plan, its predicted step time and peak.
std::string recommendation_text(const partition::PlanReport& report,
                                const partition::ModelProfile& profile);

// "default (1f1b, 4 chunks, even balance 2,2): predicted 1.234 ms/step, peak 3.2 MiB" for the
// hand-written plan the recommendation is compared with (partition::default_plan, evaluated).
std::string default_plan_text(const partition::Plan& fallback, int chunks);

// One row per rank: parameters, gradients, optimizer state, activations, receive and send
// buffers, total (partition::plan_memory, predict_memory).
std::string rank_memory_text(const std::vector<partition::RankMemory>& ranks);
// `plan` predicted at ZeRO 0, 1, 2 and 3 with `options`' other settings (ZeRO-3 reshards only
// where options asks it), by stage; and the side-by-side table of their rank totals and model
// states per parameter (plan --memory).
std::vector<std::vector<partition::RankMemory>> memory_by_zero_stage(
    const partition::ModelProfile& profile, const partition::Plan& plan,
    partition::PlannerOptions options);
std::string zero_stages_text(const std::vector<std::vector<partition::RankMemory>>& stages,
                             int dp);
nlohmann::json rank_memory_json(const std::vector<partition::RankMemory>& ranks);

// The verification's plans, labelled names[k] ("recommended", "default"): predicted and measured
// step time, compute per rank and the train_step span beside their predictions, then the median
// ratio of the first over the second. REQUIRES: names.size() >= v.plans.size().
std::string verification_text(const Verification& v, const std::vector<std::string>& names);
nlohmann::json verification_json(const Verification& v, const std::vector<std::string>& names);

}  // namespace pipetrain::tune
