// verify_plans (tune/verify.h) over a RunPlans that returns made-up measurements, so the medians
// and the ratio can be checked by hand.
#include "pipetrain/tune/verify.h"

#include <gtest/gtest.h>

#include "pipetrain/base/error.h"

namespace pipetrain::tune {
namespace {

partition::Plan plan_of(int ranks, double predicted) {
  partition::Plan plan;
  plan.ranks = ranks;
  plan.balance.assign(static_cast<std::size_t>(ranks), 1);
  plan.predicted_step_seconds = predicted;
  return plan;
}

// In units of u = 1/4 s (exact in binary, so the medians compare exactly): round r, plan 0's
// steps take (1, 2, 3) * (r + 1) u, plan 1's twice as long; compute per rank r + 1 and 2 (r + 1) u;
// span 10 u.
constexpr double u = 0.25;
RunPlans made_up(int* calls) {
  return [calls](const std::vector<partition::Plan>& plans, int steps) {
    const int round = (*calls)++;
    std::vector<Measured> all;
    for (std::size_t k = 0; k < plans.size(); ++k) {
      Measured m;
      for (int s = 0; s < steps; ++s) {
        m.step_seconds.push_back(u * (s + 1) * (round + 1) * (k + 1));
      }
      m.median_seconds = m.step_seconds[static_cast<std::size_t>(steps / 2)];
      m.busy_seconds_by_rank = {u * (round + 1), 2 * u * (round + 1)};
      m.span_seconds = 10 * u;
      m.peak_stashed_bytes = {100 * (round + 1), 200};
      all.push_back(m);
    }
    return all;
  };
}

TEST(VerifyPlans, TakesMediansOverEveryStepAndTheRatioOfStepsRunInTurn) {
  int calls = 0;
  const Verification v = verify_plans({plan_of(2, u), plan_of(2, 2 * u)}, made_up(&calls), 3, 3);
  EXPECT_EQ(calls, 3);
  ASSERT_EQ(v.plans.size(), 2u);
  // Plan 0's steps: {1,2,3}, {2,4,6}, {3,6,9} u; the median of the nine is 3 u.
  EXPECT_DOUBLE_EQ(v.plans[0].step_seconds, 3 * u);
  EXPECT_EQ(v.plans[0].each_step_seconds.size(), 9u);
  EXPECT_EQ(v.plans[0].round_step_seconds, (std::vector<double>{2 * u, 4 * u, 6 * u}));
  EXPECT_DOUBLE_EQ(v.plans[1].step_seconds, 6 * u);
  // Compute by rank: medians over the rounds of (1, 2, 3) and (2, 4, 6) u.
  EXPECT_EQ(v.plans[0].compute_seconds_by_rank, (std::vector<double>{2 * u, 4 * u}));
  EXPECT_DOUBLE_EQ(v.plans[0].compute_seconds_per_rank, 3 * u);
  EXPECT_DOUBLE_EQ(v.plans[0].span_seconds, 10 * u);
  EXPECT_EQ(v.plans[0].peak_stashed_bytes, (std::vector<int64_t>{100, 200}));  // the first round
  EXPECT_DOUBLE_EQ(v.first_over_second, 0.5);  // every step of plan 0 took half of plan 1's
}

TEST(VerifyPlans, NoPlanOrNoRoundIsBadInput) {
  int calls = 0;
  EXPECT_THROW(verify_plans({}, made_up(&calls), 1, 1), BadInput);
  EXPECT_THROW(verify_plans({plan_of(1, 1)}, made_up(&calls), 0, 1), BadInput);
  EXPECT_EQ(calls, 0);
}

TEST(VerifyPlans, AMeasurementPerPlanIsRequired) {
  RunPlans short_one = [](const std::vector<partition::Plan>&, int) {
    return std::vector<Measured>(1);
  };
  EXPECT_THROW(verify_plans({plan_of(1, 1), plan_of(1, 1)}, short_one, 1, 1), Error);
}

}  // namespace
}  // namespace pipetrain::tune
