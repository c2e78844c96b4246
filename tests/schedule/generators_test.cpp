// Properties every generated schedule must have, over a dense sample of K, M, V, and the
// closed-form bubble and memory figures each family is known for (docs/SCHEDULES.md derives
// them).
#include "pipetrain/schedule/generators.h"
#include "pipetrain/base/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "pipetrain/base/error.h"
#include "pipetrain/schedule/auto_schedule.h"
#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/schedule/validate.h"

namespace pipetrain::schedule {
namespace {

// M values for a given K: the edges around K and a spread up to 64.
std::vector<int> microbatch_sample(int K) {
  std::set<int> values = {1, 2, 3, K - 1, K, K + 1, 2 * K - 1, 2 * K, 2 * K + 1, 3 * K, 13, 31, 64};
  std::vector<int> out;
  for (int m : values) {
    if (m >= 1 && m <= 64) out.push_back(m);
  }
  return out;
}

// Stage j on rank j % K.
std::vector<int> detail_megatron_placement(int K, int V) {
  std::vector<int> placement(K * V);
  for (int j = 0; j < K * V; ++j) placement[j] = j % K;
  return placement;
}

int max_of(const std::vector<int>& values) {
  return *std::max_element(values.begin(), values.end());
}

TEST(Generators, EveryScheduleValidatesAndItsLoweringDryRunsToCompletion) {
  int checked = 0;
  for (int K = 1; K <= 16; ++K) {
    for (int M : microbatch_sample(K)) {
      for (const auto& name : schedule_names()) {
        for (int V : {1, 2, 4}) {
          const bool interleaved =
              name == "interleaved-1f1b" || name == "interleaved-zb" || name == "looped-bfs";
          if (V != default_virtual_stages(name) && !interleaved) continue;
          if (name == "dualpipev" && (K % 2 != 0 || M < 2 * K)) continue;
          const Schedule s = make_schedule(name, K, M, V);
          ASSERT_EQ(s.num_ranks, K);
          ASSERT_EQ(s.num_stages, K * V);
          ASSERT_EQ(s.num_microbatches, M);
          ASSERT_FALSE(is_lowered(s)) << name;
          const std::vector<int> placement =
              is_v_shaped(name) ? v_placement(K) : detail_megatron_placement(K, V);
          ASSERT_EQ(s.stage_rank, placement) << name;
          const CheckResult plain = check(s);
          ASSERT_TRUE(plain.ok) << name << " K=" << K << " M=" << M << " V=" << V << "\n"
                                << plain.message;
          const CheckResult lowered = check(lower(s));
          ASSERT_TRUE(lowered.ok) << name << " K=" << K << " M=" << M << " V=" << V << "\n"
                                  << lowered.message;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 2500);
}

TEST(Generators, InterleavedHandlesEveryMicrobatchCountWithoutDeadlock) {
  // Megatron requires M % K == 0; ours must not, including M < K.
  for (int K : {2, 3, 4, 5, 8}) {
    for (int M = 1; M <= 3 * K + 1; ++M) {
      for (int V : {2, 3}) {
        const CheckResult result = check(lower(interleaved_one_f_one_b(K, M, V)));
        EXPECT_TRUE(result.ok) << "K=" << K << " M=" << M << " V=" << V << "\n" << result.message;
      }
    }
  }
}

// With F = 1 and B = 2 on every stage, fill and drain each cost (K-1)(F+B) per rank and the
// work is M(F+B): bubble = (K-1)/(M+K-1) (GPipe paper, section 2.2; same for PipeDream-flush).
TEST(Bubble, GpipeAndOneFOneBMatchTheClosedForm) {
  for (int K = 1; K <= 16; ++K) {
    for (int M : microbatch_sample(K)) {
      const double expected = static_cast<double>(K - 1) / (M + K - 1);
      for (const char* name : {"gpipe", "1f1b"}) {
        const SimulationResult r = simulate(make_schedule(name, K, M));
        EXPECT_NEAR(r.bubble_fraction, expected, 1e-9) << name << " K=" << K << " M=" << M;
        EXPECT_NEAR(r.makespan, 3.0 * (M + K - 1), 1e-9) << name << " K=" << K << " M=" << M;
      }
    }
  }
}

TEST(Memory, OneFOneBKeepsAtMostStagesLeftActivationsInFlight) {
  for (int K = 1; K <= 16; ++K) {
    for (int M : microbatch_sample(K)) {
      const SimulationResult one_f_one_b = simulate(make_schedule("1f1b", K, M));
      const SimulationResult gpipe = simulate(make_schedule("gpipe", K, M));
      for (int j = 0; j < K; ++j) {
        EXPECT_EQ(one_f_one_b.peak_activations[j], std::min(K - j, M)) << "K=" << K << " M=" << M;
        EXPECT_EQ(gpipe.peak_activations[j], M) << "K=" << K << " M=" << M;
      }
    }
  }
}

TEST(Bubble, InterleavingShrinksTheBubbleWhenThereAreEnoughMicrobatches) {
  for (int K = 2; K <= 16; ++K) {
    for (int M : microbatch_sample(K)) {
      if (M < K) continue;
      const double one_f_one_b = simulate(make_schedule("1f1b", K, M)).bubble_fraction;
      for (int V : {2, 4}) {
        const double interleaved =
            simulate(make_schedule("interleaved-1f1b", K, M, V)).bubble_fraction;
        EXPECT_LT(interleaved, one_f_one_b - 1e-9) << "K=" << K << " M=" << M << " V=" << V;
      }
    }
  }
}

TEST(Bubble, InterleavedWithDivisibleMicrobatchesMatchesMegatronsFormula) {
  // Megatron-LM (Narayanan et al. 2021, eq. for the interleaved schedule): bubble time per rank
  // (K-1)(F+B)/V, so fraction = ((K-1)/V) / (M + (K-1)/V) with F+B = 3 units per micro-batch.
  for (int K : {2, 4, 8}) {
    for (int M : {K, 2 * K, 4 * K}) {
      for (int V : {2, 4}) {
        const double b = (K - 1.0) / V;
        const SimulationResult r = simulate(make_schedule("interleaved-1f1b", K, M, V));
        EXPECT_NEAR(r.bubble_fraction, b / (M + b), 1e-9) << "K=" << K << " M=" << M << " V=" << V;
      }
    }
  }
}

// Zero Bubble paper, section 3.1: ZB-H1's bubble is (K-1)(T_F + T_I - T_W) per rank against
// 1F1B's (K-1)(T_F + T_I + T_W); with F = I = W = 1 that is K-1 against 3(K-1): a third,
// exactly, once M >= K (fewer micro-batches than stages cannot fill the tail). As a fraction of
// the makespan: (K-1)/(3M+K-1).
TEST(Bubble, ZeroBubbleH1HasAThirdOfOneFOneBsIdleTimeWhenMIsAtLeastK) {
  for (int K = 2; K <= 16; ++K) {
    for (int M : microbatch_sample(K)) {
      const SimulationResult zb = simulate(make_schedule("zb-h1", K, M));
      const SimulationResult base = simulate(make_schedule("1f1b", K, M));
      const double zb_idle = zb.bubble_fraction * zb.makespan;  // per rank, average
      const double base_idle = base.bubble_fraction * base.makespan;
      if (M >= K) {
        EXPECT_NEAR(zb.makespan, 3.0 * M + K - 1, 1e-9) << "K=" << K << " M=" << M;
        EXPECT_NEAR(zb_idle, base_idle / 3, 1e-9) << "K=" << K << " M=" << M;
        EXPECT_NEAR(zb.bubble_fraction, (K - 1.0) / (3.0 * M + K - 1), 1e-9);
      } else {
        EXPECT_LE(zb_idle, base_idle * 2 / 3 + 1e-9) << "K=" << K << " M=" << M;
      }
    }
  }
}

TEST(Memory, ZeroBubbleH1NeverHoldsMoreThanOneFOneBsPeak) {
  for (int K = 1; K <= 16; ++K) {
    for (int M : microbatch_sample(K)) {
      const SimulationResult zb = simulate(make_schedule("zb-h1", K, M));
      const SimulationResult base = simulate(make_schedule("1f1b", K, M));
      EXPECT_LE(max_of(zb.peak_activations), max_of(base.peak_activations)) << K << " " << M;
      for (int j = 0; j < K; ++j) EXPECT_LE(zb.peak_activations[j], std::min(K, M));
    }
  }
}

TEST(Generators, ZeroBubbleRunsEachInputBackwardBeforeItsWeightBackward) {
  const Schedule s = zero_bubble_h1(4, 8);
  for (const auto& list : s.actions) {
    std::set<int> inputs_done;
    for (const auto& a : list) {
      if (a.op == Op::kBackwardInput) inputs_done.insert(a.microbatch);
      if (a.op == Op::kBackwardWeight) {
        EXPECT_TRUE(inputs_done.count(a.microbatch)) << a;
      }
      EXPECT_NE(a.op, Op::kBackward);
    }
  }
}

TEST(Generators, NaiveModelParallelIsGpipeWithOneMicrobatch) {
  const Schedule s = gpipe(3, 1);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(s.actions[r], (std::vector<Action>{{r, Op::kForward, 0}, {r, Op::kBackward, 0}}));
  }
}

TEST(MakeSchedule, UnknownNameListsTheValidNames) {
  try {
    make_schedule("pipedream", 2, 2);
    FAIL() << "accepted an unknown name";
  } catch (const pipetrain::BadInput& e) {
    const std::string message = e.what();
    for (const auto& name : schedule_names()) {
      EXPECT_NE(message.find(name), std::string::npos) << message;
    }
    EXPECT_NE(message.find("pipedream"), std::string::npos);
  }
}

TEST(MakeSchedule, RejectsNonPositiveCountsNamingTheValue) {
  EXPECT_THROW(make_schedule("1f1b", 0, 4), pipetrain::BadInput);
  EXPECT_THROW(make_schedule("gpipe", 2, 0), pipetrain::BadInput);
  EXPECT_THROW(make_schedule("interleaved-1f1b", 2, 4, 0), pipetrain::BadInput);
  try {
    make_schedule("1f1b", 2, -3);
  } catch (const pipetrain::BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("-3"), std::string::npos) << e.what();
  }
}

TEST(MakeSchedule, VirtualStagesOnlyForInterleaved) {
  EXPECT_THROW(make_schedule("1f1b", 2, 4, 2), pipetrain::BadInput);
  EXPECT_EQ(make_schedule("interleaved-1f1b", 2, 4, 2).num_stages, 4);
  // V = 1 interleaving is plain 1F1B.
  EXPECT_EQ(make_schedule("interleaved-1f1b", 4, 8, 1).actions, one_f_one_b(4, 8).actions);
}

}  // namespace
}  // namespace pipetrain::schedule
