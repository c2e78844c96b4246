// The balance solver against brute force, and its error messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

#include "pipetrain/base/error.h"
#include "pipetrain/partition/balance.h"

namespace pipetrain::partition {
namespace {

// Every way to cut L layers into K non-empty contiguous parts; returns the least bottleneck.
double brute_force(const std::vector<double>& costs, int K, double first, double last) {
  const int L = static_cast<int>(costs.size());
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> starts = {0};
  std::function<void(int)> place = [&](int k) {
    if (k == K) {
      starts.push_back(L);
      double worst = 0;
      for (int s = 0; s < K; ++s) {
        double cost = 0;
        for (int l = starts[s]; l < starts[s + 1]; ++l) cost += costs[l];
        if (s == 0) cost += first;
        if (s == K - 1) cost += last;
        worst = std::max(worst, cost);
      }
      best = std::min(best, worst);
      starts.pop_back();
      return;
    }
    for (int next = starts.back() + 1; next <= L - (K - k); ++next) {
      starts.push_back(next);
      place(k + 1);
      starts.pop_back();
    }
  };
  place(1);
  return best;
}

void expect_consistent(const Balance& b, const std::vector<double>& costs, int parts, double first,
                       double last) {
  ASSERT_EQ(static_cast<int>(b.sizes.size()), parts);
  EXPECT_EQ(std::accumulate(b.sizes.begin(), b.sizes.end(), 0), static_cast<int>(costs.size()));
  const std::vector<int> bounds = b.boundaries();
  double worst = 0;
  for (int s = 0; s < parts; ++s) {
    EXPECT_GE(b.sizes[s], 1);
    double cost = 0;
    for (int l = bounds[s]; l < bounds[s + 1]; ++l) cost += costs[l];
    if (s == 0) cost += first;
    if (s == parts - 1) cost += last;
    EXPECT_NEAR(b.stage_costs[s], cost, 1e-9);
    worst = std::max(worst, cost);
  }
  EXPECT_NEAR(b.bottleneck, worst, 1e-9);
}

TEST(BalanceSolver, MatchesBruteForceOnRandomVectorsUpToTwelveLayersAndFourStages) {
  std::mt19937 random(12345);
  std::uniform_real_distribution<double> cost(0.0, 10.0);
  std::uniform_int_distribution<int> small(0, 3);
  int cases = 0;
  for (int trial = 0; trial < 60; ++trial) {
    for (int L = 1; L <= 12; ++L) {
      std::vector<double> costs(L);
      for (auto& c : costs) c = trial % 4 == 0 ? small(random) : cost(random);  // ties, zeros
      for (int K = 1; K <= std::min(4, L); ++K) {
        const double first = trial % 3 == 0 ? cost(random) : 0.0;
        const double last = trial % 5 == 0 ? cost(random) : 0.0;
        BalanceOptions options;
        options.first_stage_extra = first;
        options.last_stage_extra = last;
        const Balance b = solve_balance(costs, K, options);
        EXPECT_NEAR(b.bottleneck, brute_force(costs, K, first, last), 1e-9)
            << "L=" << L << " K=" << K << " trial " << trial;
        expect_consistent(b, costs, K, first, last);
        ++cases;
      }
    }
  }
  EXPECT_GT(cases, 1500);
}

TEST(BalanceSolver, VirtualStagesCutIntoRanksTimesChunksAndSumPerRank) {
  std::mt19937 random(7);
  std::uniform_real_distribution<double> cost(0.5, 4.0);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<double> costs(12);
    for (auto& c : costs) c = cost(random);
    BalanceOptions options;
    options.virtual_stages = 2;
    const Balance b = solve_balance(costs, 2, options);
    EXPECT_NEAR(b.bottleneck, brute_force(costs, 4, 0, 0), 1e-9);
    expect_consistent(b, costs, 4, 0, 0);
    ASSERT_EQ(b.rank_costs.size(), 2u);
    EXPECT_NEAR(b.rank_costs[0], b.stage_costs[0] + b.stage_costs[2], 1e-12);
    EXPECT_NEAR(b.rank_costs[1], b.stage_costs[1] + b.stage_costs[3], 1e-12);
  }
}

TEST(BalanceSolver, ExtraCostOnTheFirstStageMovesLayersAway) {
  // Eight equal layers, two stages: 4 + 4; with an embedding worth 2 layers on stage 0: 3 + 5.
  BalanceOptions options;
  options.first_stage_extra = 2;
  EXPECT_EQ(solve_balance(std::vector<double>(8, 1.0), 2).sizes, (std::vector<int>{4, 4}));
  EXPECT_EQ(solve_balance(std::vector<double>(8, 1.0), 2, options).sizes, (std::vector<int>{3, 5}));
  options = {};
  options.last_stage_extra = 2;
  EXPECT_EQ(solve_balance(std::vector<double>(8, 1.0), 2, options).sizes, (std::vector<int>{5, 3}));
}

TEST(BalanceSolver, FourThousandLayersOnSixtyFourStagesStayWithinTheGreedyBound) {
  std::vector<double> costs(4000);
  for (int l = 0; l < 4000; ++l) costs[l] = 1.0 + (l * 7919 % 13);
  const Balance b = solve_balance(costs, 64);
  EXPECT_EQ(b.sizes.size(), 64u);
  // Lower bounds any partition must respect: the average and the biggest layer.
  const double total = std::accumulate(costs.begin(), costs.end(), 0.0);
  EXPECT_GE(b.bottleneck, total / 64 - 1e-9);
  EXPECT_LE(b.bottleneck, total / 64 + 13 + 1e-9);  // greedy bound: average + largest layer
}

TEST(BalanceSolver, MoreStagesThanLayersNamesBothValues) {
  try {
    solve_balance({1, 2, 3}, 5);
    FAIL();
  } catch (const pipetrain::BadInput& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("5 stages"), std::string::npos) << message;
    EXPECT_NE(message.find("3 layers"), std::string::npos) << message;
  }
  BalanceOptions options;
  options.virtual_stages = 2;
  try {
    solve_balance({1, 2, 3}, 2, options);
    FAIL();
  } catch (const pipetrain::BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("2 ranks x 2 chunks"), std::string::npos) << e.what();
  }
}

TEST(BalanceSolver, RejectsNegativeCostsAndBadCounts) {
  EXPECT_THROW(solve_balance({1, -2, 3}, 2), pipetrain::BadInput);
  EXPECT_THROW(solve_balance({1, 2, 3}, 0), pipetrain::BadInput);
  BalanceOptions options;
  options.first_stage_extra = -1;
  EXPECT_THROW(solve_balance({1, 2, 3}, 2, options), pipetrain::BadInput);
}

TEST(BalanceBy, PicksTheVectorAndUniformCountsLayers) {
  LayerCosts costs;
  costs.layers = 4;
  costs.time = {10, 1, 1, 1};
  costs.memory = {1, 1, 1, 10};
  EXPECT_EQ(balance_by(costs, BalanceBy::kTime, 2).sizes, (std::vector<int>{1, 3}));
  EXPECT_EQ(balance_by(costs, BalanceBy::kMemory, 2).sizes, (std::vector<int>{3, 1}));
  EXPECT_EQ(balance_by(costs, BalanceBy::kUniform, 2).sizes, (std::vector<int>{2, 2}));
  EXPECT_THROW(balance_by(costs, BalanceBy::kParameters, 2), pipetrain::BadInput);
  EXPECT_EQ(parse_balance_by("memory"), BalanceBy::kMemory);
  try {
    parse_balance_by("flops");
    FAIL();
  } catch (const pipetrain::BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("time, memory, parameters, uniform"), std::string::npos);
  }
}

}  // namespace
}  // namespace pipetrain::partition
