// simulate(): the cost model on hand-computable cases, and its speed on a big pipeline.
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/base/error.h"

#include <gtest/gtest.h>

#include <chrono>

#include "pipetrain/base/error.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/text_format.h"

namespace pipetrain::schedule {
namespace {

TEST(Simulate, TwoStagesOneMicrobatchIsASerialChain) {
  // F0 on rank 0 [0,1], comm 0.5, F0 on rank 1 [1.5,2.5], B [2.5,4.5], comm, B on rank 0 [5,7].
  Costs costs;
  costs.comm = 0.5;
  const SimulationResult r = simulate(gpipe(2, 1), costs);
  EXPECT_DOUBLE_EQ(r.makespan, 7.0);
  EXPECT_DOUBLE_EQ(r.ranks[1][0].start, 1.5);
  EXPECT_DOUBLE_EQ(r.ranks[0][1].start, 5.0);
  EXPECT_DOUBLE_EQ(r.busy[0], 3.0);
  EXPECT_NEAR(r.bubble_fraction, (2 * 7.0 - 6.0) / 14.0, 1e-12);
}

TEST(Simulate, VirtualStagesDivideScalarCostsButNotPerStageOnes) {
  const Schedule s = interleaved_one_f_one_b(2, 2, 2);
  const SimulationResult r = simulate(s);
  for (const auto& rank : r.ranks) {
    for (const auto& timed : rank) {
      const double expected = timed.action.op == Op::kForward ? 0.5 : 1.0;
      EXPECT_DOUBLE_EQ(timed.end - timed.start, expected) << timed.action;
    }
  }
  Costs per_stage;
  per_stage.forward_per_stage = {1, 2, 3, 4};
  const SimulationResult q = simulate(s, per_stage);
  for (const auto& rank : q.ranks) {
    for (const auto& timed : rank) {
      if (timed.action.op == Op::kForward) {
        EXPECT_DOUBLE_EQ(timed.end - timed.start, timed.action.stage + 1.0);
      }
    }
  }
}

TEST(Simulate, LoweredAndComputeOnlyGiveTheSameTimeline) {
  const Schedule s = zero_bubble_h1(4, 8);
  Costs costs;
  costs.comm = 0.25;
  EXPECT_DOUBLE_EQ(simulate(s, costs).makespan, simulate(lower(s), costs).makespan);
}

TEST(Simulate, SameRankStagesHandOverWithoutCommCost) {
  // K = 1, two stages on rank 0: comm must not be charged.
  Costs costs;
  costs.comm = 100;
  const SimulationResult r = simulate(interleaved_one_f_one_b(1, 1, 2), costs);
  EXPECT_DOUBLE_EQ(r.makespan, 3.0);
}

TEST(Simulate, RejectsNegativeCostsAndWrongSizedVectors) {
  Costs negative;
  negative.forward = -1;
  EXPECT_THROW(simulate(gpipe(2, 2), negative), pipetrain::BadInput);
  Costs wrong;
  wrong.backward_per_stage = {1, 2, 3};
  EXPECT_THROW(simulate(gpipe(2, 2), wrong), pipetrain::BadInput);
}

TEST(Simulate, PerActionCostsReplayEachActionsOwnDuration) {
  // gpipe(2, 2), comm 0. F(0,1) takes 5 instead of 1, so F(1,1) waits for it: rank 1 runs
  // F(1,0) [1,2], F(1,1) [6,7], B(1,1) [7,9], B(1,0) [9,11]; rank 0 then B(0,1) [9,11],
  // B(0,0) [11,13].
  Costs costs;
  costs.forward = 100;  // ignored: per_action replaces the scalars
  costs.per_action = [](const Action& a) {
    if (a.op == Op::kForward) return a.stage == 0 && a.microbatch == 1 ? 5.0 : 1.0;
    return 2.0;
  };
  const SimulationResult r = simulate(gpipe(2, 2), costs);
  EXPECT_DOUBLE_EQ(r.makespan, 13.0);
  EXPECT_DOUBLE_EQ(r.ranks[1][1].start, 6.0);
  EXPECT_DOUBLE_EQ(r.busy[0], 1.0 + 5.0 + 2.0 + 2.0);

  Costs negative;
  negative.per_action = [](const Action& a) { return a.op == Op::kBackward ? -1.0 : 1.0; };
  EXPECT_THROW(simulate(gpipe(2, 2), negative), pipetrain::BadInput);
}

TEST(Simulate, DeadlockedScheduleThrowsInsteadOfHanging) {
  EXPECT_THROW(simulate(parse_schedule("0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n")), pipetrain::BadInput);
}

TEST(Simulate, TimelineHasOneEventPerComputeAction) {
  const SimulationResult r = simulate(one_f_one_b(3, 4));
  const Timeline t = r.timeline("t");
  EXPECT_EQ(t.events.size(), 3u * 4 * 2);
  EXPECT_DOUBLE_EQ(t.makespan(), r.makespan);
  EXPECT_EQ(t.rows(), 3);
}

// The work the simulator does is one event per action: at 64 stages x 512 micro-batches it times
// every one of the 2 x 64 x 512 actions exactly once (the time it takes is printed, not judged).
TEST(Simulate, SixtyFourStagesTimesFiveHundredTwelveMicrobatchesTimesEachActionOnce) {
  const auto start = std::chrono::steady_clock::now();
  const SimulationResult r = simulate(make_schedule("1f1b", 64, 512));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NEAR(r.bubble_fraction, 63.0 / 575.0, 1e-9);
  std::size_t timed = 0;
  for (const auto& rank : r.ranks) timed += rank.size();
  EXPECT_EQ(timed, 2u * 64 * 512);
  std::printf("64 x 512 1f1b: generate + simulate %.3f s\n", seconds);
}

}  // namespace
}  // namespace pipetrain::schedule
