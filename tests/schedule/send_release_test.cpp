// Send release (schedule/send_release.h): which of a rank's sent messages the schedule proves
// received, checked against an independent happens-before graph for every family.
#include "pipetrain/schedule/send_release.h"

#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "pipetrain/base/error.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/lower.h"

namespace pipetrain::schedule {
namespace {

// The counts of rank r's remote sends, in list order.
std::vector<int> counts_of(const std::vector<std::vector<int>>& released, int r) {
  std::vector<int> counts;
  for (int c : released[static_cast<std::size_t>(r)]) {
    if (c >= 0) counts.push_back(c);
  }
  return counts;
}

TEST(SendRelease, OneFOneBOnTwoRanksReleasesTheMessageBeforeLast) {
  // The worked example of send_release.h.
  const auto released = released_sends(lower(one_f_one_b(2, 4)));
  EXPECT_EQ(counts_of(released, 0), (std::vector<int>{0, 0, 1, 2}));
  EXPECT_EQ(counts_of(released, 1), (std::vector<int>{0, 0, 1, 2}));
}

TEST(SendRelease, GpipeStageZeroKnowsNothingUntilItsFirstBackwardSoTheWindowBoundsIt) {
  // Every forward of stage 0 is sent before it receives anything: without a window all M are
  // held; with the window of 2 the oldest goes before each send from the third on.
  const Schedule s = lower(gpipe(2, 4));
  EXPECT_EQ(counts_of(released_sends(s, /*window=*/0), 0), (std::vector<int>{0, 0, 0, 0}));
  EXPECT_EQ(counts_of(released_sends(s), 0), (std::vector<int>{0, 0, 1, 2}));
}

TEST(SendRelease, TheWindowWidensWhereItWouldDeadlock) {
  // Rank 1 takes the activations in reverse order. With a window of 2 rank 0 would wait, before
  // sending activation 2, for rank 1 to take activation 0, which it does only after activation
  // 2. A window of 3 runs.
  Schedule s;
  s.name = "reversed";
  s.num_ranks = 2;
  s.num_stages = 2;
  s.num_microbatches = 3;
  s.stage_rank = {0, 1};
  s.actions.resize(2);
  for (int i : {0, 1, 2}) s.actions[0].push_back({0, Op::kForward, i});
  for (int i : {2, 1, 0}) s.actions[1].push_back({1, Op::kForward, i});
  for (int i : {0, 1, 2}) s.actions[1].push_back({1, Op::kBackward, i});
  for (int i : {0, 1, 2}) s.actions[0].push_back({0, Op::kBackward, i});
  const Schedule lowered = lower(s);
  EXPECT_EQ(counts_of(released_sends(lowered), 0), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(counts_of(released_sends(lowered, 1), 0), (std::vector<int>{0, 0, 0}));
}

TEST(SendRelease, SendsBetweenStagesOfOneRankAreNotCounted) {
  // One rank holding both stages: they talk, but nothing goes through a transport.
  const Schedule s = lower(make_schedule("interleaved-1f1b", 1, 3, 2));
  ASSERT_TRUE(is_lowered(s));
  EXPECT_TRUE(counts_of(released_sends(s), 0).empty());
}

TEST(SendRelease, ComputeOnlySchedulesAndBadSettingsAreRefused) {
  EXPECT_THROW(released_sends(one_f_one_b(2, 4)), BadInput);
  EXPECT_THROW(released_sends(lower(one_f_one_b(2, 4)), -1), BadInput);
}

// ---- an independent check: reachability in the graph of actions ------------------------------

using Node = std::pair<int, int>;  // rank, action index

// The happens-before graph of a lowered schedule: each action to the next on its rank, each
// remote send to its receive. reaches(a, b): a happens before (or is) b.
class HappensBefore {
 public:
  explicit HappensBefore(const Schedule& s) : s_(s) {
    std::map<std::tuple<int, int, int, int>, Node> sends;
    std::map<std::tuple<int, int, int, int>, Node> receives;
    for (int r = 0; r < s.num_ranks; ++r) {
      const auto& list = s.actions[static_cast<std::size_t>(r)];
      for (int a = 0; a < static_cast<int>(list.size()); ++a) {
        const Action& x = list[static_cast<std::size_t>(a)];
        const int j = x.stage;
        const int i = x.microbatch;
        if (x.op == Op::kSendActivation) sends[{0, j, j + 1, i}] = {r, a};
        if (x.op == Op::kRecvActivation) receives[{0, j - 1, j, i}] = {r, a};
        if (x.op == Op::kSendGradient) sends[{1, j, j - 1, i}] = {r, a};
        if (x.op == Op::kRecvGradient) receives[{1, j + 1, j, i}] = {r, a};
      }
    }
    for (const auto& [message, from] : sends) {
      const Node to = receives.at(message);
      if (to.first != from.first) edges_[from].push_back(to);
      receive_of_[from] = to;
    }
  }
  bool reaches(Node from, Node to) const {
    std::vector<Node> todo{from};
    std::map<Node, bool> seen;
    while (!todo.empty()) {
      const Node n = todo.back();
      todo.pop_back();
      if (n == to) return true;
      if (seen[n]) continue;
      seen[n] = true;
      if (n.first == to.first && n.second > to.second) continue;  // past `to` on its rank
      if (n.second + 1 < static_cast<int>(s_.actions[static_cast<std::size_t>(n.first)].size()))
        todo.push_back({n.first, n.second + 1});
      auto out = edges_.find(n);
      if (out != edges_.end()) todo.insert(todo.end(), out->second.begin(), out->second.end());
    }
    return false;
  }
  Node receive_of(Node send) const { return receive_of_.at(send); }

 private:
  const Schedule& s_;
  std::map<Node, std::vector<Node>> edges_;
  std::map<Node, Node> receive_of_;
};

// Calls f(name, ranks, lowered schedule) for every family at K = 2 and 4 ranks, M = 2K.
template <typename F>
void for_every_family(F&& f) {
  for (const std::string& name : schedule_names()) {
    for (const int ranks : {2, 4}) {
      const int v = default_virtual_stages(name);
      const int m = 2 * ranks;
      if (!shape_error(name, ranks, m, v).empty()) continue;
      f(name, ranks, lower(make_schedule(name, ranks, m, v)));
    }
  }
}

// Without a window: exactly the proven prefix.
TEST(SendRelease, EveryFamilyReleasesExactlyTheProvenPrefix) {
  for_every_family([](const std::string& name, int ranks, const Schedule& s) {
    const auto released = released_sends(s, /*window=*/0);
    const HappensBefore hb(s);
    for (int r = 0; r < ranks; ++r) {
      std::vector<Node> earlier;  // rank r's remote sends so far
      const auto& list = s.actions[static_cast<std::size_t>(r)];
      for (int a = 0; a < static_cast<int>(list.size()); ++a) {
        const int count = released[static_cast<std::size_t>(r)][static_cast<std::size_t>(a)];
        if (count < 0) continue;
        const std::string where = name + " K=" + std::to_string(ranks) + " rank " +
                                  std::to_string(r) + " at " +
                                  to_string(list[static_cast<std::size_t>(a)]);
        ASSERT_LE(count, static_cast<int>(earlier.size())) << where;
        // The receive of every released send happened before this send ...
        for (int k = 0; k < count; ++k) {
          EXPECT_TRUE(hb.reaches(hb.receive_of(earlier[static_cast<std::size_t>(k)]), {r, a}))
              << where << ": released send " << k << " is not proven received";
        }
        // ... and the next one's did not: the prefix is the longest proven one.
        if (count < static_cast<int>(earlier.size())) {
          EXPECT_FALSE(hb.reaches(hb.receive_of(earlier[static_cast<std::size_t>(count)]), {r, a}))
              << where << ": send " << count << " is proven received but kept";
        }
        earlier.push_back({r, a});
      }
    }
  });
}

// With the window: at least the proven prefix (so never more held than without the window),
// and no more than the window of 2 except in the V-shaped families, whose ranks would wait on
// each other with 2 (their window widens; zb-v at K = 4 holds up to 5).
TEST(SendRelease, EveryFamilyHoldsAtMostTheWindowAndFreesAtLeastTheProvenPrefix) {
  for_every_family([](const std::string& name, int ranks, const Schedule& s) {
    const auto proven = released_sends(s, 0);
    const auto windowed = released_sends(s);
    const bool widens = is_v_shaped(name);
    for (int r = 0; r < ranks; ++r) {
      const std::vector<int> p = counts_of(proven, r);
      const std::vector<int> w = counts_of(windowed, r);
      ASSERT_EQ(p.size(), w.size());
      for (std::size_t e = 0; e < w.size(); ++e) {
        const std::string where = name + " K=" + std::to_string(ranks) + " rank " +
                                  std::to_string(r) + " send " + std::to_string(e);
        EXPECT_GE(w[e], p[e]) << where;
        if (!widens) {
          EXPECT_LE(static_cast<int>(e) + 1 - w[e], kSendWindow) << where;
        }
        if (e > 0) {
          EXPECT_GE(w[e], w[e - 1]) << where;
        }
      }
    }
  });
}

}  // namespace
}  // namespace pipetrain::schedule
