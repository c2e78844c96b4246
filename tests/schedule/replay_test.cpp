// Replay (schedule/replay.h): measured durations run again on the simulator.
#include "pipetrain/schedule/replay.h"

#include <gtest/gtest.h>

#include "pipetrain/base/error.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/simulate.h"

namespace pipetrain::schedule {
namespace {

// Every compute action of `s` with F = forward_us and B = backward_us.
MeasuredDurations uniform(const Schedule& s, double forward_us, double backward_us) {
  MeasuredDurations step;
  for (const auto& rank : s.actions) {
    for (const Action& a : rank) {
      if (is_compute(a.op)) step.add(a, a.op == Op::kForward ? forward_us : backward_us);
    }
  }
  return step;
}

TEST(Replay, UniformDurationsReplayToTheSimulatorsMakespan) {
  const Schedule lowered = lower(one_f_one_b(3, 6));
  Costs costs;
  costs.forward = 100;
  costs.backward = 250;
  costs.comm = 20;
  const double expected = simulate(lowered, costs).makespan * 1e-6;
  EXPECT_DOUBLE_EQ(replayed_seconds(lowered, uniform(lowered, 100, 250), 20), expected);
}

TEST(Replay, EfficiencyIsTheMedianOfReplayedOverMeasured) {
  const Schedule lowered = lower(gpipe(2, 2));
  const MeasuredDurations step = uniform(lowered, 1000, 2000);
  const double replayed = replayed_seconds(lowered, step);
  // Measured steps twice, four times and once the replayed time: the median ratio is 1/2.
  const ReplayEfficiency e =
      replay_efficiency(lowered, {step, step, step}, {2 * replayed, 4 * replayed, replayed});
  EXPECT_DOUBLE_EQ(e.efficiency, 0.5);
  EXPECT_DOUBLE_EQ(e.replayed_seconds, replayed);
}

TEST(Replay, AMissingDurationIsBadInputNamingTheAction) {
  const Schedule lowered = lower(gpipe(2, 2));
  MeasuredDurations partial;
  partial.add(Action{0, Op::kForward, 0}, 1.0);
  try {
    replayed_seconds(lowered, partial);
    ADD_FAILURE() << "no error";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("no measured duration for"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pipetrain::schedule
