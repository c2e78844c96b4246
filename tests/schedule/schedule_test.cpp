// Schedule's placement queries (schedule/schedule.h): where each stage's weight gradients become
// final, and where its data-parallel gradient sum starts.
#include "pipetrain/schedule/schedule.h"

#include <gtest/gtest.h>

#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/lower.h"

namespace pipetrain::schedule {
namespace {

bool is_send(const Action& a) {
  return a.op == Op::kSendActivation || a.op == Op::kSendGradient;
}

TEST(Schedule, TheLastStageOfOneFOneBStartsItsGradientSumAfterSendingItsLastInputGradient) {
  const Schedule s = lower(one_f_one_b(2, 4));
  const auto& last = s.actions[1];
  const std::size_t b = s.last_gradient_actions(1).at(1);
  ASSERT_EQ(last[b].op, Op::kBackward);
  ASSERT_EQ(last[b + 1].op, Op::kSendGradient);  // what rank 0's last backward waits for
  const std::size_t start = s.gradient_sum_starts(1).at(1);
  EXPECT_EQ(start, b + 1);
  // The first stage sends nothing back: its sum starts right after its last backward.
  EXPECT_EQ(s.gradient_sum_starts(0).at(0), s.last_gradient_actions(0).at(0));
}

TEST(Schedule, AGradientSumStartsAfterItsStagesLastBackwardAndEverySendRightBehindIt) {
  for (const Schedule& unlowered :
       {gpipe(4, 8), one_f_one_b(4, 8), interleaved_one_f_one_b(4, 8, 2), zero_bubble_h1(4, 8),
        zero_bubble_v(4, 8), dualpipe_v(4, 8)}) {
    const Schedule s = lower(unlowered);
    for (int r = 0; r < s.num_ranks; ++r) {
      const auto& list = s.actions[static_cast<std::size_t>(r)];
      const auto final_at = s.last_gradient_actions(r);
      const auto starts = s.gradient_sum_starts(r);
      ASSERT_EQ(starts.size(), final_at.size()) << s.name << " rank " << r;
      for (const auto& [stage, a] : final_at) {
        const std::size_t start = starts.at(stage);
        ASSERT_GE(start, a) << s.name << " rank " << r << " stage " << stage;
        for (std::size_t k = a + 1; k <= start; ++k) {
          EXPECT_TRUE(is_send(list[k])) << s.name << " rank " << r << " stage " << stage;
        }
        if (start + 1 < list.size()) {
          EXPECT_FALSE(is_send(list[start + 1])) << s.name << " rank " << r << " stage " << stage;
        }
      }
    }
  }
}

}  // namespace
}  // namespace pipetrain::schedule
