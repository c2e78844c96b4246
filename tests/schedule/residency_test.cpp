// ZeRO-3's residency plan (schedule/residency.h), walked the way the interpreter follows it: every
// compute action finds its stage whole, every stage ends the step freed, and the two policies
// gather once per step (keep) or once per action (reshard after forward).
#include "pipetrain/schedule/residency.h"

#include <functional>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/lower.h"

namespace pipetrain::schedule {
namespace {

struct Walk {
  int gathers = 0;       // freed -> whole transitions
  std::size_t peak = 0;  // most stages whole at once
  std::set<int> whole_at_end;
  bool every_action_found_its_stage_whole = true;
};

// Follows the plan like Interpreter::run: wait before, release then prefetch after.
Walk walk(const Schedule& s, int r, const ResidencyPlan& plan) {
  Walk w;
  std::set<int> whole, in_flight;
  auto start = [&](int j) {
    if (!whole.count(j)) in_flight.insert(j);
  };
  if (plan.first >= 0) start(plan.first);
  const auto& list = s.actions[static_cast<std::size_t>(r)];
  for (std::size_t a = 0; a < list.size(); ++a) {
    const ResidencyStep& step = plan.steps[a];
    if (step.needs >= 0 && !whole.count(step.needs)) {
      in_flight.erase(step.needs);
      whole.insert(step.needs);
      ++w.gathers;
    }
    w.peak = std::max(w.peak, whole.size());
    if (is_compute(list[a].op) && !whole.count(list[a].stage)) {
      w.every_action_found_its_stage_whole = false;
    }
    if (step.release >= 0) whole.erase(step.release);
    if (step.prefetch >= 0) start(step.prefetch);
  }
  w.whole_at_end = whole;
  return w;
}

struct Named {
  std::string name;
  Schedule schedule;
};

std::vector<Named> every_family() {
  return {{"gpipe", gpipe(4, 8)},
          {"1f1b", one_f_one_b(4, 8)},
          {"interleaved-1f1b", interleaved_one_f_one_b(4, 8, 2)},
          {"zb-h1", zero_bubble_h1(4, 8)},
          {"zb-v", zero_bubble_v(4, 8)},
          {"looped-bfs", looped_bfs(2, 4, 3)}};
}

TEST(Residency, KeepingUntilTheLastBackwardGathersEachStageOnceAndFreesAllByTheEnd) {
  for (const Named& family : every_family()) {
    const Schedule s = lower(family.schedule);
    for (int r = 0; r < s.num_ranks; ++r) {
      const Walk w = walk(s, r, parameter_residency(s, r, /*reshard_after_forward=*/false));
      EXPECT_TRUE(w.every_action_found_its_stage_whole) << family.name << " rank " << r;
      EXPECT_TRUE(w.whole_at_end.empty()) << family.name << " rank " << r;
      EXPECT_EQ(w.gathers, static_cast<int>(s.stages_of_rank(r).size()))
          << family.name << " rank " << r;
    }
  }
}

TEST(Residency, ReshardingAfterForwardGathersForEveryActionAndHoldsAtMostOneStage) {
  for (const Named& family : every_family()) {
    const Schedule s = lower(family.schedule);
    for (int r = 0; r < s.num_ranks; ++r) {
      const ResidencyPlan plan = parameter_residency(s, r, /*reshard_after_forward=*/true);
      const Walk w = walk(s, r, plan);
      int compute = 0;
      for (const Action& a : s.actions[static_cast<std::size_t>(r)]) compute += is_compute(a.op);
      EXPECT_TRUE(w.every_action_found_its_stage_whole) << family.name << " rank " << r;
      EXPECT_TRUE(w.whole_at_end.empty()) << family.name << " rank " << r;
      EXPECT_EQ(w.gathers, compute) << family.name << " rank " << r;
      EXPECT_EQ(w.peak, 1u) << family.name << " rank " << r;
    }
  }
}

TEST(Residency, TheNextStageIsPrefetchedRightAfterAnAction) {
  // Interleaved 1F1B on 2 ranks: rank 0 holds stages 0 and 2. Its first F of stage 2 is
  // prefetched by the action before it, and the start gathers stage 0.
  const Schedule s = lower(interleaved_one_f_one_b(2, 4, 2));
  const ResidencyPlan plan = parameter_residency(s, 0, false);
  EXPECT_EQ(plan.first, 0);
  const auto& list = s.actions[0];
  std::size_t first_f2 = 0;
  while (!(list[first_f2].op == Op::kForward && list[first_f2].stage == 2)) ++first_f2;
  std::size_t before = first_f2;
  while (before-- > 0 && !is_compute(list[before].op)) {
  }
  EXPECT_EQ(plan.steps[before].prefetch, 2);
  EXPECT_EQ(plan.steps[before].release, -1);  // stage 0 is used again later
}

}  // namespace
}  // namespace pipetrain::schedule
