// ZeRO-3's plan by unit (schedule/unit_residency.h), walked as the sharded optimizer follows it:
// every use finds its unit whole, every unit ends the step freed, and the policy's bounds hold.
#include "pipetrain/schedule/unit_residency.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pipetrain/base/error.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/lower.h"

namespace pipetrain::schedule {
namespace {

struct Walk {
  bool every_use_found_its_unit_whole_or_gathered_it = true;
  std::set<UnitId> live_at_end;
  std::int64_t peak = 0;
  int gathers = 0;
  int gathered_at_use = 0;  // uses that waited for a gather nobody prefetched
};

// Follows the plan: `first` before the first use; at a use, a unit not live is gathered then;
// after it, the releases, then the gathers.
Walk walk(const UnitPlan& plan, const std::vector<std::int64_t>& bytes) {
  Walk w;
  std::set<UnitId> live;
  std::int64_t live_bytes = 0;
  auto gather = [&](UnitId x) {
    EXPECT_FALSE(live.count(x)) << "unit " << x << " gathered while live";
    live.insert(x);
    live_bytes += bytes[static_cast<std::size_t>(x)];
    ++w.gathers;
    w.peak = std::max(w.peak, live_bytes);
  };
  for (UnitId x : plan.first) gather(x);
  for (std::size_t t = 0; t < plan.uses.size(); ++t) {
    const UnitId x = plan.uses[t];
    if (!live.count(x)) {
      gather(x);
      ++w.gathered_at_use;
    }
    for (UnitId r : plan.after[t].release) {
      EXPECT_TRUE(live.count(r)) << "unit " << r << " released while not live";
      live.erase(r);
      live_bytes -= bytes[static_cast<std::size_t>(r)];
    }
    for (UnitId g : plan.after[t].gather) gather(g);
  }
  w.live_at_end = live;
  return w;
}

std::vector<std::int64_t> equal_bytes(int units, std::int64_t each) {
  return std::vector<std::int64_t>(static_cast<std::size_t>(units), each);
}

std::string text(const std::vector<UnitId>& uses) {
  std::string s;
  for (UnitId x : uses) s += (s.empty() ? "" : " ") + std::to_string(x);
  return s;
}

TEST(UnitResidency, TheUsesFollowForwardUpAndBackwardDownWithTheRecomputeFirst) {
  const Schedule s = one_f_one_b(2, 2);  // rank 1: F0 B0 F1 B1
  const UnitIds ids = unit_ids({{1, 3}});
  EXPECT_EQ(text(unit_uses(s, 1, ids, Checkpoint::kNever)), "0 1 2 2 1 0 0 1 2 2 1 0");
  // except_last: micro-batch 0 is recomputed before its backward, 1 is not.
  EXPECT_EQ(text(unit_uses(s, 1, ids, Checkpoint::kExceptLast)), "0 1 2 0 1 2 2 1 0 0 1 2 2 1 0");
  // The lowered list gives the same uses: communication uses no unit.
  EXPECT_EQ(unit_uses(lower(s), 1, ids, Checkpoint::kNever), unit_uses(s, 1, ids, Checkpoint::kNever));
}

TEST(UnitResidency, ASplitBackwardUsesTheUnitsDownInIAndUpInW) {
  const Schedule s = zero_bubble_h1(2, 2);
  const UnitIds ids = unit_ids({{1, 2}});
  const std::vector<UnitId> uses = unit_uses(s, 1, ids, Checkpoint::kNever);
  // Rank 1 runs F, I and W of each micro-batch: (0 1) (1 0) (0 1) per micro-batch.
  int f = 0, i = 0, w = 0;
  for (const Action& a : s.actions[1]) {
    f += a.op == Op::kForward;
    i += a.op == Op::kBackwardInput;
    w += a.op == Op::kBackwardWeight;
  }
  EXPECT_EQ(static_cast<int>(uses.size()), 2 * (f + i + w));
}

TEST(UnitResidency, StagesOfOneRankHaveTheirOwnIds) {
  const Schedule s = interleaved_one_f_one_b(2, 4, 2);  // rank 0 holds stages 0 and 2
  const UnitIds ids = unit_ids({{0, 2}, {2, 3}});
  EXPECT_EQ(ids.first.at(0), 0);
  EXPECT_EQ(ids.first.at(2), 2);
  EXPECT_EQ(ids.total, 5);
  for (UnitId x : unit_uses(s, 0, ids, Checkpoint::kNever)) EXPECT_LT(x, 5);
}

TEST(UnitResidency, EveryUseFindsItsUnitAndEveryUnitEndsFreedUnderEveryPolicy) {
  const std::vector<Schedule> schedules = {gpipe(4, 8),        one_f_one_b(4, 8),
                                           zero_bubble_h1(4, 8),        zero_bubble_v(4, 8),
                                           interleaved_one_f_one_b(2, 4, 2), dualpipe_v(4, 8)};
  const std::vector<UnitPolicy> policies = {
      {0, 0, -1}, {0, 0, 0}, {100, 0, 0}, {250, 300, 100}, {250, 300, -1}, {1000, 0, 1 << 20}};
  for (const Schedule& s : schedules) {
    for (int r = 0; r < s.num_ranks; ++r) {
      std::map<int, int> units;
      for (int j : s.stages_of_rank(r)) units[j] = 3 + j % 2;
      const UnitIds ids = unit_ids(units);
      std::vector<std::int64_t> bytes;
      for (int x = 0; x < ids.total; ++x) bytes.push_back(100 + 50 * (x % 3));
      for (Checkpoint c : all_checkpoint_modes()) {
        const std::vector<UnitId> uses = unit_uses(s, r, ids, c);
        for (const UnitPolicy& p : policies) {
          const UnitPlan plan = plan_units(uses, bytes, p);
          const Walk w = walk(plan, bytes);
          SCOPED_TRACE(s.name + " rank " + std::to_string(r) + " " + to_string(c) + " prefetch " +
                       std::to_string(p.prefetch_bytes) + " live " +
                       std::to_string(p.max_live_bytes) + " reuse " +
                       std::to_string(p.max_reuse_distance));
          EXPECT_TRUE(w.live_at_end.empty());
          EXPECT_EQ(w.gathers, plan.gathers);
          EXPECT_EQ(w.peak, plan.peak_bytes);
          if (p.max_reuse_distance < 0) {
            EXPECT_EQ(plan.gathers, static_cast<int>(uses.size()));
          }
          if (p.prefetch_bytes == 0) {
            EXPECT_EQ(w.gathered_at_use, plan.gathers);
          }
          if (p.max_live_bytes > 0 && p.max_reuse_distance < 0) {
            // A prefetch never passes the bound; a use may, by its own unit.
            EXPECT_LE(plan.peak_bytes,
                      p.max_live_bytes + *std::max_element(bytes.begin(), bytes.end()));
          }
        }
      }
    }
  }
}

TEST(UnitResidency, AUnitUsedNextIsKeptAndOneUsedLaterIsFreed) {
  // Last stage of 1F1B: F0 ends with unit 2 and B0 begins with it.
  const std::vector<UnitId> uses = {0, 1, 2, 2, 1, 0};
  const UnitPlan plan = plan_units(uses, equal_bytes(3, 10), {0, 0, 0});
  EXPECT_TRUE(plan.after[2].release.empty());  // unit 2: its next use is the next
  EXPECT_EQ(plan.after[0].release, std::vector<UnitId>{0});  // unit 0: 40 bytes come between
  EXPECT_EQ(plan.gathers, 5);
  EXPECT_EQ(plan.peak_bytes, 10);
  // A reuse distance of 40 bytes keeps unit 0 through 1 2 2 1 (30 bytes of others): 3 gathers,
  // and all three whole at once.
  const UnitPlan keep = plan_units(uses, equal_bytes(3, 10), {0, 0, 40});
  EXPECT_EQ(keep.gathers, 3);
  EXPECT_EQ(keep.peak_bytes, 30);
  // -1 frees after every use.
  EXPECT_EQ(plan_units(uses, equal_bytes(3, 10), {0, 0, -1}).gathers, 6);
}

TEST(UnitResidency, PrefetchStartsTheNextUnitsWithinItsBytesAndTheLiveBound) {
  const std::vector<UnitId> uses = {0, 1, 2, 3, 4};
  // 25 bytes of prefetch: two units of 10 ahead (the third would be 30).
  const UnitPlan plan = plan_units(uses, equal_bytes(5, 10), {25, 0, -1});
  EXPECT_EQ(plan.first, (std::vector<UnitId>{0, 1}));
  EXPECT_EQ(plan.after[0].gather, (std::vector<UnitId>{2}));
  EXPECT_EQ(plan.after[1].gather, (std::vector<UnitId>{3}));
  EXPECT_TRUE(plan.after[4].gather.empty());
  EXPECT_EQ(walk(plan, equal_bytes(5, 10)).gathered_at_use, 0);
  // A budget smaller than a unit still starts the next one.
  EXPECT_EQ(plan_units(uses, equal_bytes(5, 10), {1, 0, -1}).first, std::vector<UnitId>{0});
  // The live bound stops a prefetch: with 15 live bytes at most, unit 1 waits for unit 0's
  // release before it is gathered ahead.
  const UnitPlan bounded = plan_units(uses, equal_bytes(5, 10), {100, 15, -1});
  EXPECT_EQ(bounded.first, std::vector<UnitId>{0});
  EXPECT_EQ(bounded.after[0].gather, std::vector<UnitId>{1});
  EXPECT_EQ(bounded.peak_bytes, 10);
}

TEST(UnitResidency, AUseOfAnUnknownUnitIsBadInput) {
  EXPECT_THROW(plan_units({0, 3}, equal_bytes(3, 1), {}), BadInput);
  EXPECT_THROW(unit_ids({{0, -1}}), BadInput);
}

}  // namespace
}  // namespace pipetrain::schedule
