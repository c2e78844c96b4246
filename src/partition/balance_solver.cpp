// Exact min-max contiguous partition in O(L*K).
//
// best[k][l] = least possible bottleneck when the first l layers form k stages.
//   best[1][l] = extra_first + sum(0, l)
//   best[k][l] = min over p of max(best[k-1][p], sum(p, l))           (p = first layer of stage k)
// For fixed l, best[k-1][p] never decreases with p (costs >= 0) and sum(p, l) never increases,
// so the optimum sits where the two cross: p* = first p with best[k-1][p] >= sum(p, l), or p*-1.
// As l grows sum(p, l) grows, so p* only moves right: one pointer sweep per k, O(L) each.
//
//     best[k-1][p]  ____----''''        the max of the two is lowest
//     sum(p, l)     ''''----____        at the crossing p*
//                           ^ p*
// The last stage adds extra_last and is solved in one O(L) scan at the end.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "pipetrain/base/error.h"
#include "pipetrain/partition/balance.h"

namespace pipetrain::partition {

std::vector<int> Balance::boundaries() const {
  std::vector<int> result(1, 0);
  for (int size : sizes) result.push_back(result.back() + size);
  return result;
}

namespace {

// Throws BadInput naming what is wrong with solve_balance's arguments.
void check_balance_arguments(const std::vector<double>& layer_costs, int stages,
                             const BalanceOptions& options) {
  const int L = static_cast<int>(layer_costs.size());
  if (stages < 1) {
    throw BadInput("balance: stages must be >= 1 (got " + std::to_string(stages) + ")");
  }
  if (options.virtual_stages < 1) {
    throw BadInput("balance: virtual_stages must be >= 1 (got " +
                   std::to_string(options.virtual_stages) + ")");
  }
  const int K = stages * options.virtual_stages;
  if (K > L) {
    throw BadInput("balance: " + std::to_string(K) + " stages" +
                   (options.virtual_stages > 1
                        ? " (" + std::to_string(stages) + " ranks x " +
                              std::to_string(options.virtual_stages) + " chunks)"
                        : std::string()) +
                   " but only " + std::to_string(L) +
                   " layers; every stage needs at least one layer, so use at most " +
                   std::to_string(L) + " stages or split the model into more layers");
  }
  for (int l = 0; l < L; ++l) {
    if (!(layer_costs[l] >= 0) || !std::isfinite(layer_costs[l])) {
      throw BadInput("balance: layer " + std::to_string(l) + " has cost " +
                     std::to_string(layer_costs[l]) + "; costs must be finite and >= 0");
    }
  }
  for (double extra : {options.first_stage_extra, options.last_stage_extra}) {
    if (!(extra >= 0) || !std::isfinite(extra)) {
      throw BadInput("balance: first/last stage extras must be finite and >= 0 (got " +
                     std::to_string(extra) + ")");
    }
  }
}

}  // namespace

Balance solve_balance(const std::vector<double>& layer_costs, int stages,
                      const BalanceOptions& options) {
  check_balance_arguments(layer_costs, stages, options);
  const int L = static_cast<int>(layer_costs.size());
  const int K = stages * options.virtual_stages;
  std::vector<double> prefix(L + 1, 0.0);
  for (int l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + layer_costs[l];
  auto sum = [&](int from, int to) { return prefix[to] - prefix[from]; };

  Balance result;
  std::vector<int> cut(static_cast<std::size_t>(K + 1) * (L + 1), 0);  // argmin p for (k, l)
  auto at = [&](int k, int l) -> int& { return cut[static_cast<std::size_t>(k) * (L + 1) + l]; };
  const double first = options.first_stage_extra;
  const double last = options.last_stage_extra;
  if (K == 1) {
    result.sizes = {L};
    result.stage_costs = {first + last + prefix[L]};
  } else {
    constexpr double kInf = std::numeric_limits<double>::infinity();
    std::vector<double> previous(L + 1, kInf);
    std::vector<double> current(L + 1, kInf);
    for (int l = 1; l <= L; ++l) previous[l] = first + sum(0, l);
    // Middle stages k = 2..K-1 (no extra); l layers in the first k stages.
    for (int k = 2; k <= K - 1; ++k) {
      std::fill(current.begin(), current.end(), kInf);
      int p = k - 1;
      for (int l = k; l <= L - (K - k); ++l) {
        while (p < l - 1 && previous[p] < sum(p, l)) ++p;
        double best = std::max(previous[p], sum(p, l));
        int choice = p;
        if (p - 1 >= k - 1) {
          const double other = std::max(previous[p - 1], sum(p - 1, l));
          if (other <= best) {
            best = other;
            choice = p - 1;
          }
        }
        current[l] = best;
        at(k, l) = choice;
      }
      std::swap(previous, current);
    }
    // Last stage: one scan.
    double best = kInf;
    int choice = K - 1;
    for (int p = K - 1; p <= L - 1; ++p) {
      const double value = std::max(previous[p], last + sum(p, L));
      if (value < best) {
        best = value;
        choice = p;
      }
    }
    at(K, L) = choice;
    // Walk the cuts back.
    std::vector<int> starts(K + 1, 0);
    starts[K] = L;
    for (int k = K; k >= 2; --k) starts[k - 1] = at(k, starts[k]);
    starts[0] = 0;
    for (int k = 0; k < K; ++k) {
      result.sizes.push_back(starts[k + 1] - starts[k]);
      double cost = sum(starts[k], starts[k + 1]);
      if (k == 0) cost += first;
      if (k == K - 1) cost += last;
      result.stage_costs.push_back(cost);
    }
  }
  result.bottleneck = *std::max_element(result.stage_costs.begin(), result.stage_costs.end());
  result.rank_costs.assign(stages, 0.0);
  for (int j = 0; j < K; ++j) result.rank_costs[j % stages] += result.stage_costs[j];
  return result;
}

BalanceBy parse_balance_by(const std::string& name) {
  if (name == "time") return BalanceBy::kTime;
  if (name == "memory") return BalanceBy::kMemory;
  if (name == "parameters") return BalanceBy::kParameters;
  if (name == "uniform") return BalanceBy::kUniform;
  throw BadInput("unknown balance criterion '" + name +
                 "'; valid: time, memory, parameters, uniform");
}

Balance balance_by(const LayerCosts& costs, BalanceBy by, int stages,
                   const BalanceOptions& options) {
  if (by == BalanceBy::kUniform) {
    return solve_balance(std::vector<double>(std::max(costs.layers, 0), 1.0), stages, options);
  }
  const std::vector<double>& chosen = by == BalanceBy::kTime     ? costs.time
                                      : by == BalanceBy::kMemory ? costs.memory
                                                                 : costs.parameters;
  const char* name = by == BalanceBy::kTime     ? "time"
                     : by == BalanceBy::kMemory ? "memory"
                                                : "parameters";
  if (chosen.empty() || static_cast<int>(chosen.size()) != costs.layers) {
    throw BadInput(std::string("balance by ") + name + ": the " + name + " vector has " +
                   std::to_string(chosen.size()) + " entries but there are " +
                   std::to_string(costs.layers) + " layers; profile the model or fill it by hand");
  }
  return solve_balance(chosen, stages, options);
}

}  // namespace pipetrain::partition
