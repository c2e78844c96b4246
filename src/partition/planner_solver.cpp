// The plan search (planner.h, plan_pipeline): every candidate the options allow, visited cheapest
// lower bound first, fitted to the memory limit, simulated and ranked; then the steps that
// measure plans and recommend one (plans_to_measure, choose_measured, recommend_measured). What
// one candidate costs and holds is plan_evaluation_solver.cpp (plan_evaluation.h).
// (The "_solver" suffix puts this torch-free file in the pipetrain_schedule library.)
//
// Flow of plan_pipeline():
//   for M, (schedule, V), checkpoint        candidates, each with a time-balanced split [1]
//        and a lower bound on its step time (busiest rank's total work, or one micro-batch's
//        critical path, whichever is larger)
//   sort by lower bound
//   for each candidate, cheapest bound first:
//        bound >= top-th best time so far -> pruned (and so is every later one)
//        memory of the split [2] > limit -> re-split under a memory cap; still over -> rejected
//        simulate [3] -> insert into the table
//   nothing fits -> smallest limit: min over candidates of the memory-minimising split's peak
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "pipetrain/base/error.h"
#include "pipetrain/base/median.h"
#include "pipetrain/partition/planner.h"
#include "pipetrain/schedule/generators.h"
#include "plan_evaluation.h"

namespace pipetrain::partition {

using detail::Candidate;
using detail::faster;
using detail::PlanEvaluator;
using detail::ScheduleEntry;
using detail::splits_backward;

bool same_plan(const Plan& a, const Plan& b) {
  return a.schedule == b.schedule && a.ranks == b.ranks && a.microbatches == b.microbatches &&
         a.virtual_stages == b.virtual_stages && a.checkpoint == b.checkpoint &&
         a.balance == b.balance;
}

std::vector<Plan> plans_to_measure(const PlanReport& report, const Plan* reference, int count,
                                   double within) {
  std::vector<Plan> plans;
  for (const Plan& plan : report.ranked) {
    if (static_cast<int>(plans.size()) >= count ||
        plan.predicted_step_seconds > report.ranked.front().predicted_step_seconds * (1 + within)) {
      break;
    }
    plans.push_back(plan);
  }
  if (reference && reference->fits &&
      std::none_of(plans.begin(), plans.end(),
                   [&](const Plan& plan) { return same_plan(plan, *reference); })) {
    plans.push_back(*reference);
  }
  return plans;
}

std::size_t choose_measured(const std::vector<std::vector<double>>& step_seconds,
                            std::size_t reference, double margin) {
  if (step_seconds.empty()) {
    throw BadInput("choose_measured: no candidates; measure at least one plan");
  }
  for (std::size_t k = 0; k < step_seconds.size(); ++k) {
    if (step_seconds[k].empty()) {
      throw BadInput("choose_measured: candidate " + std::to_string(k) +
                     " has no timed steps; time at least one");
    }
  }
  if (reference >= step_seconds.size()) {
    std::size_t fastest = 0;
    for (std::size_t k = 1; k < step_seconds.size(); ++k) {
      if (median(step_seconds[k]) < median(step_seconds[fastest])) fastest = k;
    }
    return fastest;
  }
  std::size_t best = reference;
  double best_ratio = 1 - margin;
  for (std::size_t k = 0; k < step_seconds.size(); ++k) {
    if (k == reference) continue;
    std::vector<double> ratios;
    for (std::size_t s = 0; s < step_seconds[k].size() && s < step_seconds[reference].size(); ++s) {
      if (step_seconds[reference][s] > 0) {
        ratios.push_back(step_seconds[k][s] / step_seconds[reference][s]);
      }
    }
    if (!ratios.empty() && median(ratios) < best_ratio) {
      best_ratio = median(ratios);
      best = k;
    }
  }
  return best;
}

void recommend_measured(ModelProfile& profile, const PlannerOptions& options, PlanReport& report,
                        const std::vector<Plan>& candidates,
                        const std::vector<double>& measured_seconds, std::size_t chosen) {
  if (candidates.empty() || candidates.size() != measured_seconds.size() ||
      chosen >= candidates.size()) {
    throw BadInput("recommend_measured: " + std::to_string(candidates.size()) +
                   " candidates with " + std::to_string(measured_seconds.size()) +
                   " measured times, candidate " + std::to_string(chosen) +
                   " chosen; give one time per candidate, at least one, and choose "
                   "one of them");
  }
  std::vector<double> ratios;
  for (std::size_t k = 0; k < candidates.size(); ++k) {
    if (!(measured_seconds[k] > 0) || !(candidates[k].predicted_step_seconds > 0)) {
      throw BadInput("recommend_measured: candidate " + candidates[k].describe() + " measured " +
                     std::to_string(measured_seconds[k]) + " s for a prediction of " +
                     std::to_string(candidates[k].predicted_step_seconds) + " s; both must be > 0");
    }
    ratios.push_back(measured_seconds[k] / candidates[k].predicted_step_seconds);
  }
  const double ratio = median(ratios);

  const double before =
      profile.measured_step_scale_ranks == options.ranks ? profile.measured_step_scale : 1.0;
  profile.measured_step_scale = before * ratio;
  profile.measured_step_scale_ranks = options.ranks;
  for (Plan& plan : report.ranked) plan.predicted_step_seconds *= ratio;
  report.measured.clear();
  for (std::size_t k = 0; k < candidates.size(); ++k) {
    MeasuredPlan run{candidates[k], measured_seconds[k]};
    run.plan.predicted_step_seconds *= ratio;
    report.measured.push_back(std::move(run));
  }

  const Plan& recommended = report.measured[chosen].plan;
  auto in_table = std::find_if(report.ranked.begin(), report.ranked.end(),
                               [&](const Plan& plan) { return same_plan(plan, recommended); });
  if (in_table == report.ranked.end()) {
    in_table = report.ranked.insert(
        std::upper_bound(report.ranked.begin(), report.ranked.end(), recommended, faster),
        recommended);
  }
  report.recommended_index = static_cast<std::size_t>(in_table - report.ranked.begin());
}

namespace {

// Whether the planner tries `name` with V chunks per rank on K ranks and M micro-batches:
// interleaved-1f1b takes any V (V = 1 is 1F1B, tried as such when 1f1b is searched);
// interleaved-zb and looped-bfs V >= 2 (their V = 1 is zb-auto's and GPipe's order); the
// V-shaped families exactly 2 (dualpipev also an even K and M >= 2K); the rest V = 1.
bool tries(const std::string& name, int V, int K, int M, bool searches_1f1b) {
  if (name == "interleaved-1f1b") return V > 1 || !searches_1f1b;
  if (name == "interleaved-zb" || name == "looped-bfs") return V >= 2;
  return schedule::shape_error(name, K, M, V).empty();
}

// The options with every empty search dimension filled with its default.
PlannerOptions with_defaults(const ModelProfile& profile, const PlannerOptions& given) {
  PlannerOptions options = given;
  if (options.schedules.empty()) options.schedules = schedule::schedule_names();
  if (options.microbatch_counts.empty()) {
    options.microbatch_counts = default_microbatch_counts(profile.batch_size);
  }
  if (options.checkpoint_modes.empty()) options.checkpoint_modes = all_checkpoint_modes();
  if (options.virtual_stages.empty()) options.virtual_stages = {1, 2, 4};
  return options;
}

// [1] Every (schedule, M, V, checkpoint) the options allow, with its time balance and lower
// bound, cheapest bound first.
std::vector<Candidate> enumerate_candidates(const ModelProfile& profile,
                                            const PlannerOptions& options,
                                            PlanEvaluator& evaluator) {
  const bool searches_1f1b = std::find(options.schedules.begin(), options.schedules.end(),
                                       "1f1b") != options.schedules.end();
  const int L = static_cast<int>(profile.num_layers());
  std::vector<Candidate> candidates;
  for (int M : options.microbatch_counts) {
    if (M < 1 || profile.batch_size % M != 0) {
      throw BadInput("planner: " + std::to_string(M) +
                     " micro-batches do not divide the batch of " +
                     std::to_string(profile.batch_size) + "; pick divisors");
    }
    for (const auto& name : options.schedules) {
      for (int V : options.virtual_stages) {
        if (!tries(name, V, options.ranks, M, searches_1f1b)) continue;
        if (options.ranks * V > L) continue;
        for (Checkpoint mode : options.checkpoint_modes) {
          if (splits_backward(name) && mode != Checkpoint::kNever) continue;
          Candidate c{name, M, V, mode, {}, 0};
          c.balance = evaluator.time_balance(c);
          c.lower_bound = evaluator.lower_bound(c);
          candidates.push_back(std::move(c));
        }
      }
    }
  }
  std::stable_sort(
      candidates.begin(), candidates.end(),
      [](const Candidate& a, const Candidate& b) { return a.lower_bound < b.lower_bound; });
  return candidates;
}

// [2] A balance of `c` within `limit` (its time balance when that fits, else the memory-capped
// one, else the leanest); false when none fits. Updates c's balance and lower bound.
bool fit_to_memory(Candidate& c, const ScheduleEntry& s, PlanEvaluator& evaluator,
                   std::int64_t limit) {
  Plan trial = evaluator.memory_plan(c, s);
  if (trial.fits) return true;
  std::vector<int> capped = evaluator.memory_capped_balance(c, s, limit);
  if (!capped.empty()) {
    trial.balance = capped;
    evaluator.fill_memory(trial, s);
  }
  if (capped.empty() || !trial.fits) {
    // The cap is limit / V per stage; with V > 1 a rank can fit while one stage is over its
    // share, so try the leanest split too (it is what smallest_fitting_limit reports).
    capped = evaluator.memory_balance(c, s);
    trial.balance = capped;
    evaluator.fill_memory(trial, s);
  }
  if (!trial.fits) return false;
  c.balance = capped;
  c.lower_bound = evaluator.lower_bound(c);
  return true;
}

// [3] Nothing fits: the smallest limit any candidate could meet with its leanest split, and that
// plan with its predicted time (for the message "needs X; would take Y").
void find_smallest_fitting(const std::vector<Candidate>& candidates, PlanEvaluator& evaluator,
                           PlanReport& report) {
  bool have = false;
  for (const Candidate& original : candidates) {
    Candidate c = original;
    const ScheduleEntry& s = evaluator.schedule_of(c.schedule, c.microbatches, c.virtual_stages);
    c.balance = evaluator.memory_balance(c, s);
    Plan trial = evaluator.memory_plan(c, s);
    if (!have || trial.peak_memory_bytes < report.smallest_fitting_limit) {
      have = true;
      report.smallest_fitting_limit = trial.peak_memory_bytes;
      report.smallest_fitting_plan = trial;
    }
  }
  if (have) {
    const Candidate c = detail::candidate_of(report.smallest_fitting_plan);
    const ScheduleEntry& s = evaluator.schedule_of(c.schedule, c.microbatches, c.virtual_stages);
    report.smallest_fitting_plan = evaluator.predict(c, s);
  }
}

}  // namespace

PlanReport plan_pipeline(const ModelProfile& profile, const PlannerOptions& options_in) {
  const auto started = std::chrono::steady_clock::now();
  detail::check_planner_options(profile, options_in);
  const PlannerOptions options = with_defaults(profile, options_in);
  PlanEvaluator evaluator(profile, options);
  PlanReport report;
  std::vector<Candidate> candidates = enumerate_candidates(profile, options, evaluator);  // [1]
  report.candidates = static_cast<int>(candidates.size());

  // Candidates in order of their lower bound: once the table holds `top` plans and a bound is no
  // better than its slowest, that candidate cannot enter it (pruned).
  const std::int64_t limit = options.memory_limit_bytes;
  auto table_full_and_beats = [&](double bound) {
    return static_cast<int>(report.ranked.size()) >= options.top &&
           bound >= report.ranked.back().predicted_step_seconds;
  };
  for (Candidate& c : candidates) {
    if (table_full_and_beats(c.lower_bound)) {
      ++report.pruned;
      continue;
    }
    const ScheduleEntry& s = evaluator.schedule_of(c.schedule, c.microbatches, c.virtual_stages);
    const std::vector<int> time_balance = c.balance;
    if (limit > 0 && !fit_to_memory(c, s, evaluator, limit)) {  // [2]
      ++report.rejected_memory;
      continue;
    }
    const bool for_memory = c.balance != time_balance;
    if (for_memory && table_full_and_beats(c.lower_bound)) {
      ++report.pruned;
      continue;
    }
    Plan plan = evaluator.predict(c, s);
    plan.balanced_for_memory = for_memory;
    ++report.simulated;
    auto at = std::upper_bound(report.ranked.begin(), report.ranked.end(), plan, faster);
    report.ranked.insert(at, std::move(plan));
    if (static_cast<int>(report.ranked.size()) > options.top) report.ranked.pop_back();
  }
  if (report.ranked.empty() && limit > 0)
    find_smallest_fitting(candidates, evaluator, report);  // [3]
  report.planning_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return report;
}

std::vector<int> default_microbatch_counts(std::int64_t batch) {
  std::vector<int> counts;
  for (std::int64_t m = 1; m <= batch; m *= 2) {
    if (batch % m == 0) counts.push_back(static_cast<int>(m));
  }
  if (counts.back() != batch) counts.push_back(static_cast<int>(batch));
  return counts;
}

}  // namespace pipetrain::partition
