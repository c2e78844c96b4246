// The zero-bubble family beyond zb-h1 (zb-h2, zb-v, v-half, v-min, interleaved-zb, zb-auto),
// looped-bfs and dualpipev: the closed forms the papers give, the memory limits each one keeps,
// and the errors for shapes they cannot take.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "pipetrain/base/error.h"
#include "pipetrain/schedule/auto_schedule.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/schedule/validate.h"

namespace pipetrain::schedule {
namespace {

double peak_of(const SimulationResult& result) {
  return *std::max_element(result.peak_rank_activations.begin(),
                           result.peak_rank_activations.end());
}

Costs equal_costs() {
  Costs costs;
  costs.forward = 1;
  costs.backward_input = 1;
  costs.backward_weight = 1;
  costs.backward = 2;
  return costs;
}

std::string shape(int K, int M) {
  return "K=" + std::to_string(K) + " M=" + std::to_string(M);
}

// The anchors: p = 4, M = 8 and p = 8, M = 32 at T_F = T_I = T_W = 1, T_comm = 0.
// Bubble time is the idle time of a rank between its first and last action (the ZB paper's).
TEST(ZeroBubbleFamily, BubbleTimeAndPeakEqualThePapersClosedForms) {
  for (const auto& [K, M] : {std::pair{4, 8}, std::pair{8, 32}}) {
    const SimulationResult h1 = simulate(make_schedule("zb-h1", K, M), equal_costs());
    const SimulationResult h2 = simulate(make_schedule("zb-h2", K, M), equal_costs());
    const SimulationResult v = simulate(make_schedule("zb-v", K, M, 2), equal_costs());
    const SimulationResult one = simulate(make_schedule("1f1b", K, M), equal_costs());
    // ZB-H1: (p-1)(T_F + T_B - T_W); ZB-H2: (p-1)(T_F + T_B - 2T_W); ZB-V: 0. (T_B = T_I here.)
    EXPECT_DOUBLE_EQ(h1.bubble_time, (K - 1) * (1.0 + 1.0 - 1.0)) << shape(K, M);
    EXPECT_DOUBLE_EQ(h2.bubble_time, (K - 1) * (1.0 + 1.0 - 2.0)) << shape(K, M);
    EXPECT_DOUBLE_EQ(v.bubble_time, 0) << shape(K, M);
    // Peaks: zb-h2 2p-1 micro-batches, zb-h1 and zb-v as 1F1B (p).
    EXPECT_DOUBLE_EQ(peak_of(h2), 2 * K - 1) << shape(K, M);
    EXPECT_DOUBLE_EQ(peak_of(h1), peak_of(one)) << shape(K, M);
    EXPECT_DOUBLE_EQ(peak_of(v), peak_of(one)) << shape(K, M);
    EXPECT_DOUBLE_EQ(peak_of(one), K);
    // v-half and v-min: the Controllable Memory paper's (K+2)//2 and (K+4)//3 micro-batches,
    // about a half and a third of 1F1B's K. v-half is faster than 1F1B.
    const SimulationResult half = simulate(make_schedule("v-half", K, M, 2), equal_costs());
    const SimulationResult min = simulate(make_schedule("v-min", K, M, 2), equal_costs());
    EXPECT_EQ(v_half_limit(K), (K + 2) / 2);
    EXPECT_EQ(v_min_limit(K), (K + 4) / 3);
    EXPECT_LE(peak_of(half), v_half_limit(K)) << shape(K, M);
    EXPECT_LE(peak_of(min), v_min_limit(K)) << shape(K, M);
    EXPECT_LT(peak_of(min), peak_of(half));
    EXPECT_LT(half.makespan, one.makespan) << shape(K, M);
  }
}

// H2 with unequal costs, T_F + T_I >= 2 T_W: the closed form holds beyond the equal case.
TEST(ZeroBubbleFamily, ZbH2BubbleFollowsTheClosedFormWithUnequalCosts) {
  Costs costs;
  costs.forward = 1;
  costs.backward_input = 1.5;
  costs.backward_weight = 0.5;
  for (int K : {2, 4, 8}) {
    const SimulationResult h2 = simulate(make_schedule("zb-h2", K, 4 * K), costs);
    EXPECT_LE(h2.bubble_time, (K - 1) * (1.0 + 1.5 - 2 * 0.5) + 1e-9) << K;
  }
}

TEST(ZeroBubbleFamily, EveryFamilyKeepsItsMemoryLimitOnEveryRank) {
  for (int K = 1; K <= 12; ++K) {
    for (int M : {1, 2, K - 1, K, K + 1, 2 * K, 3 * K + 1, 4 * K}) {
      if (M < 1) continue;
      const struct {
        const char* name;
        double limit;
      } families[] = {{"zb-h2", 2.0 * K - 1},        {"zb-v", double(K)},
                      {"v-half", v_half_limit(K)},   {"v-min", v_min_limit(K)},
                      {"interleaved-zb", double(K)}, {"zb-auto", double(K)}};
      for (const auto& family : families) {
        const Schedule s = make_schedule(family.name, K, M, default_virtual_stages(family.name));
        const SimulationResult result = simulate(s);
        for (int r = 0; r < K; ++r) {
          EXPECT_LE(result.peak_rank_activations[r], family.limit + 1e-9)
              << family.name << " " << shape(K, M) << " rank " << r;
        }
      }
    }
  }
}

// The Controllable Memory paper's trade: v-half has less bubble than 1F1B at about half its
// memory; v-min about 1F1B's time (its bubble is ~2/3 of 1F1B's in the paper; here 0.17-1.13 of
// it, makespan within 3 %) at about a third.
TEST(ZeroBubbleFamily, VHalfBeatsOneFOneBAndVMinKeepsItsTimeAtLessMemory) {
  for (int K = 2; K <= 12; ++K) {
    for (int M : {K, 2 * K, 4 * K}) {
      const SimulationResult one = simulate(make_schedule("1f1b", K, M));
      const SimulationResult half = simulate(make_schedule("v-half", K, M, 2));
      const SimulationResult min = simulate(make_schedule("v-min", K, M, 2));
      EXPECT_LT(half.bubble_time, one.bubble_time) << shape(K, M);
      EXPECT_LT(half.makespan, one.makespan) << shape(K, M);
      EXPECT_LE(min.makespan, 1.03 * one.makespan) << shape(K, M);
      if (K >= 4) {
        EXPECT_LT(peak_of(min), peak_of(one)) << shape(K, M);
      }
    }
  }
}

TEST(ZeroBubbleFamily, ZbVHasNoBubbleInTheSteadyStateAtEqualCosts) {
  for (int K = 2; K <= 8; ++K) {
    for (int M : {2 * K, 3 * K, 4 * K + 1}) {
      const SimulationResult v = simulate(make_schedule("zb-v", K, M, 2), equal_costs());
      EXPECT_DOUBLE_EQ(v.bubble_time, 0) << shape(K, M);
      // Every rank does 6 chunk-actions of 1/2 per micro-batch: 3M; the rest is fill and drain.
      const SimulationResult h1 = simulate(make_schedule("zb-h1", K, M), equal_costs());
      EXPECT_LT(v.makespan, h1.makespan) << shape(K, M);
    }
  }
}

// The auto scheduler searches; at 1F1B's memory it is never slower than zb-h1 and at twice that
// never slower than zb-h2, on equal, skewed and communication-bound costs.
TEST(AutoSchedule, NeverSlowerThanZbH1AtItsMemoryNorZbH2AtTwice) {
  std::vector<Costs> cost_sets(4, equal_costs());
  cost_sets[1].forward = 1, cost_sets[1].backward_input = 2, cost_sets[1].backward_weight = 0.5;
  cost_sets[2].forward = 2, cost_sets[2].backward_input = 1, cost_sets[2].backward_weight = 1.5;
  cost_sets[3].comm = 0.7;
  for (const Costs& costs : cost_sets) {
    for (int K : {2, 3, 4, 6, 8}) {
      for (int M : {K / 2 + 1, K, 2 * K, 4 * K}) {
        AutoScheduleOptions options;
        options.ranks = K;
        options.microbatches = M;
        options.costs = costs;
        options.memory_limit = {double(K)};
        const double at_1f1b = simulate(zero_bubble_auto(options), costs).makespan;
        options.memory_limit = {2.0 * K};
        const double at_twice = simulate(zero_bubble_auto(options), costs).makespan;
        EXPECT_LE(at_1f1b, simulate(make_schedule("zb-h1", K, M), costs).makespan + 1e-9)
            << shape(K, M) << " comm " << costs.comm;
        EXPECT_LE(at_twice, simulate(make_schedule("zb-h2", K, M), costs).makespan + 1e-9)
            << shape(K, M) << " comm " << costs.comm;
      }
    }
  }
}

TEST(AutoSchedule, MeasuredPerStageCostsShapeTheSchedule) {
  // A slow last stage: the auto schedule is valid, keeps the limit, and beats 1F1B.
  AutoScheduleOptions options;
  options.ranks = 4;
  options.microbatches = 8;
  options.costs.forward_per_stage = {1, 1, 1, 2};
  options.costs.backward_input_per_stage = {1, 1, 1, 2};
  options.costs.backward_weight_per_stage = {1, 1, 1, 2};
  options.costs.backward_per_stage = {2, 2, 2, 4};
  options.memory_limit = {4};
  const Schedule s = zero_bubble_auto(options);
  EXPECT_TRUE(check(lower(s)).ok);
  const SimulationResult result = simulate(s, options.costs);
  EXPECT_LE(peak_of(result), 4 + 1e-9);
  EXPECT_LT(result.makespan, simulate(make_schedule("1f1b", 4, 8), options.costs).makespan);
}

TEST(AutoSchedule, ALimitTooSmallNamesTheRankAndTheSmallestLimitThatRuns) {
  AutoScheduleOptions options;
  options.ranks = 4;
  options.microbatches = 8;
  options.stage_rank = v_placement(4);
  options.virtual_stages = 2;
  options.memory_limit = {0.25};
  try {
    auto_schedule(options);
    FAIL() << "a limit of a quarter micro-batch ran";
  } catch (const pipetrain::BadInput& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("rank "), std::string::npos) << message;
    EXPECT_NE(message.find("smallest limit that runs is 1"), std::string::npos) << message;
  }
  options.memory_limit = {1};
  EXPECT_TRUE(check(auto_schedule(options)).ok);
}

TEST(AutoSchedule, RejectsAPlacementThatLeavesARankEmpty) {
  AutoScheduleOptions options;
  options.ranks = 3;
  options.microbatches = 2;
  options.stage_rank = {0, 1, 1};
  EXPECT_THROW(auto_schedule(options), pipetrain::BadInput);
  options.stage_rank = {0, 1, 3};
  EXPECT_THROW(auto_schedule(options), pipetrain::BadInput);
}

TEST(DualPipeV, RejectsAnOddRankCountAndTooFewMicrobatchesNamingTheSmallestSetting) {
  try {
    make_schedule("dualpipev", 3, 12, 2);
    FAIL();
  } catch (const pipetrain::BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("even number of ranks (got 3)"), std::string::npos)
        << e.what();
  }
  try {
    make_schedule("dualpipev", 4, 7, 2);
    FAIL();
  } catch (const pipetrain::BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("8 or more"), std::string::npos) << e.what();
  }
}

TEST(DualPipeV, PairsAForwardWithTheBackwardOfTheOtherChunkAndKeepsThePeakOfTorch) {
  // K = 2, M = 4, rank 0 (stages 0 and 3): the list dualpipev.cpp's header shows.
  const Schedule s = make_schedule("dualpipev", 2, 4, 2);
  std::string rank0;
  for (const Action& a : s.actions[0]) rank0 += to_string(a) + " ";
  EXPECT_EQ(rank0, "0F0 0F1 0F2 3F0 3I0 3W0 3F1 0F3 3B1 3F2 0B0 3B2 3F3 0B1 3B3 0I2 0W2 0I3 0W3 ");
}

TEST(VShaped, OnlyTwoChunksPerRank) {
  for (const std::string name : {"zb-v", "v-half", "v-min", "dualpipev"}) {
    EXPECT_TRUE(is_v_shaped(name));
    EXPECT_EQ(default_virtual_stages(name), 2);
    try {
      make_schedule(name, 4, 8, 3);
      FAIL() << name;
    } catch (const pipetrain::BadInput& e) {
      EXPECT_NE(std::string(e.what()).find("set virtual_stages to 2"), std::string::npos)
          << e.what();
    }
  }
}

TEST(LoopedBfs, RunsEveryMicrobatchThroughAChunkBeforeTheNext) {
  const Schedule s = make_schedule("looped-bfs", 2, 3, 2);
  std::string rank1;
  for (const Action& a : s.actions[1]) rank1 += to_string(a) + " ";
  EXPECT_EQ(rank1, "1F0 1F1 1F2 3F0 3F1 3F2 3B0 3B1 3B2 1B0 1B1 1B2 ");
  // Its fill and drain are V times shorter than GPipe's, its memory GPipe's.
  const SimulationResult bfs = simulate(make_schedule("looped-bfs", 4, 8, 2));
  const SimulationResult fill_drain = simulate(make_schedule("gpipe", 4, 8));
  EXPECT_LT(bfs.makespan, fill_drain.makespan);
  EXPECT_DOUBLE_EQ(peak_of(bfs), 8);
}

}  // namespace
}  // namespace pipetrain::schedule
