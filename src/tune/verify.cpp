// Plans measured in turn against each other (pipetrain/tune/verify.h).
#include "pipetrain/tune/verify.h"

#include <string>
#include <utility>

#include "pipetrain/base/error.h"
#include "pipetrain/base/median.h"

namespace pipetrain::tune {
namespace {

// Medians over the rounds of what the runtime measured of one plan.
PlanVerification summarize(const partition::Plan& plan, std::vector<Measured>& rounds) {
  PlanVerification v;
  v.plan = plan;
  std::vector<double> busy, span;
  std::vector<std::vector<double>> busy_of_rank(static_cast<std::size_t>(plan.ranks));
  for (const Measured& m : rounds) {
    v.each_step_seconds.insert(v.each_step_seconds.end(), m.step_seconds.begin(),
                               m.step_seconds.end());
    v.round_step_seconds.push_back(m.median_seconds);
    busy.push_back(m.busy_seconds_per_rank());
    span.push_back(m.span_seconds);
    for (std::size_t r = 0; r < busy_of_rank.size() && r < m.busy_seconds_by_rank.size(); ++r) {
      busy_of_rank[r].push_back(m.busy_seconds_by_rank[r]);
    }
  }
  for (const auto& of_rank : busy_of_rank) {
    if (!of_rank.empty()) v.compute_seconds_by_rank.push_back(median(of_rank));
  }
  v.step_seconds = median(v.each_step_seconds);
  v.compute_seconds_per_rank = median(busy);
  v.span_seconds = median(span);
  if (!rounds.empty()) v.peak_stashed_bytes = rounds.front().peak_stashed_bytes;
  return v;
}

}  // namespace

Verification verify_plans(const std::vector<partition::Plan>& plans, const RunPlans& run,
                          int rounds, int steps) {
  if (plans.empty() || rounds < 1 || steps < 1) {
    throw BadInput("verify_plans: give at least one plan, rounds >= 1 and steps >= 1 (got " +
                   std::to_string(plans.size()) + " plans, " + std::to_string(rounds) +
                   " rounds, " + std::to_string(steps) + " steps)");
  }
  std::vector<std::vector<Measured>> measured(plans.size());
  std::vector<double> ratios;
  for (int round = 0; round < rounds; ++round) {
    std::vector<Measured> all = run(plans, steps);
    if (all.size() != plans.size()) {
      throw Error(ErrorKind::Runtime, "verify_plans: " + std::to_string(plans.size()) +
                                          " plans ran but " + std::to_string(all.size()) +
                                          " measurements came back");
    }
    if (plans.size() > 1) {
      for (std::size_t s = 0; s < all[0].step_seconds.size() && s < all[1].step_seconds.size();
           ++s) {
        ratios.push_back(all[0].step_seconds[s] / all[1].step_seconds[s]);
      }
    }
    for (std::size_t k = 0; k < plans.size(); ++k) measured[k].push_back(std::move(all[k]));
  }
  Verification verification;
  verification.rounds = rounds;
  verification.steps_per_round = steps;
  for (std::size_t k = 0; k < plans.size(); ++k) {
    verification.plans.push_back(summarize(plans[k], measured[k]));
  }
  verification.first_over_second = median(ratios);
  return verification;
}

}  // namespace pipetrain::tune
