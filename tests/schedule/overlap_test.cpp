// Forward/backward pairs (schedule/overlap.h): which actions a rank may run together, and that
// the reordered schedule still runs.
#include "pipetrain/schedule/overlap.h"

#include <gtest/gtest.h>

#include "pipetrain/base/error.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/validate.h"

namespace pipetrain::schedule {
namespace {

// Rank r's pairs as text, "B0+F1 B1+F2".
std::string pairs_of(const ForwardBackwardPairs& p, int r) {
  std::string text;
  const auto& list = p.schedule.actions[static_cast<size_t>(r)];
  for (size_t a = 0; a < list.size(); ++a) {
    if (!p.starts[static_cast<size_t>(r)][a]) continue;
    const auto name = [](const Action& x) {
      return std::string(op_name(x.op)) + std::to_string(x.microbatch);
    };
    text += (text.empty() ? "" : " ") + name(list[a]) + "+" + name(list[a + 1]);
  }
  return text;
}

TEST(ForwardBackwardPairs, OneRankOneFOneBPairsEachBackwardWithTheNextForward) {
  // F0 B0 F1 B1 F2 B2 F3 B3: F0 and B0 share a micro-batch; each later B is followed by the next
  // micro-batch's F (Megatron's combined 1F1B).
  const ForwardBackwardPairs p = pair_forwards_with_backwards(one_f_one_b(1, 4));
  EXPECT_EQ(pairs_of(p, 0), "B0+F1 B1+F2 B2+F3");
  EXPECT_EQ(p.pairs, 3);
}

TEST(ForwardBackwardPairs, AReorderThatWouldDeadlockIsLeftApart) {
  // GPipe on 2 ranks, 2 micro-batches. Rank 0 runs F0 F1 B0 B1: pairing F1 with B0 would wait for
  // B0's gradient before sending F1's activation, which rank 1 needs before it can run B0. Rank 1
  // (the last stage: B0 waits for no one) may pair them.
  const ForwardBackwardPairs p = pair_forwards_with_backwards(lower(gpipe(2, 2)));
  EXPECT_EQ(pairs_of(p, 0), "");
  EXPECT_EQ(pairs_of(p, 1), "F1+B0");
  EXPECT_EQ(p.pairs, 1);
}

TEST(ForwardBackwardPairs, EveryFamilyStaysRunnableWithItsComputeOrderAndItsPairsAreIndependent) {
  for (const std::string& name : schedule_names()) {
    for (const int ranks : {2, 4}) {
      const int v = default_virtual_stages(name);
      if (!shape_error(name, ranks, 8, v).empty()) continue;
      const Schedule lowered = lower(make_schedule(name, ranks, 8, v));
      const ForwardBackwardPairs p = pair_forwards_with_backwards(lowered);
      SCOPED_TRACE(name + " K=" + std::to_string(ranks));
      EXPECT_TRUE(check(p.schedule)) << check(p.schedule).message;
      int pairs = 0;
      for (int r = 0; r < ranks; ++r) {
        const auto& list = p.schedule.actions[static_cast<size_t>(r)];
        // Only sends and receives moved: each rank's compute order is the generator's.
        EXPECT_EQ(compute_only(p.schedule).actions[static_cast<size_t>(r)],
                  compute_only(lowered).actions[static_cast<size_t>(r)]);
        ASSERT_EQ(p.starts[static_cast<size_t>(r)].size(), list.size());
        for (size_t a = 0; a < list.size(); ++a) {
          if (!p.starts[static_cast<size_t>(r)][a]) continue;
          ++pairs;
          ASSERT_LT(a + 1, list.size());
          const Action& x = list[a];
          const Action& y = list[a + 1];
          EXPECT_NE(x.microbatch, y.microbatch);
          EXPECT_NE(x.op == Op::kForward, y.op == Op::kForward);
          EXPECT_NE(x.op, Op::kBackwardWeight);
          EXPECT_NE(y.op, Op::kBackwardWeight);
        }
      }
      EXPECT_EQ(pairs, p.pairs);
      // The schedules the issue names overlap: DualPipeV's steady state and 1F1B's.
      if (name == "dualpipev" || name == "1f1b") {
        EXPECT_GE(p.pairs, ranks) << pairs_of(p, 0);
      }
    }
  }
}

TEST(ForwardBackwardPairs, AScheduleThatDoesNotRunIsBadInput) {
  Schedule broken = lower(one_f_one_b(2, 2));
  std::swap(broken.actions[0].front(), broken.actions[0].back());
  EXPECT_THROW(pair_forwards_with_backwards(broken), BadInput);
}

}  // namespace
}  // namespace pipetrain::schedule
