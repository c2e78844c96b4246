// Expert parallelism's checks (pipetrain/parallel/expert_parallel.h).
#include "pipetrain/parallel/expert_parallel.h"

#include <algorithm>
#include <sstream>
#include <string>

#include "pipetrain/base/error.h"
#include "pipetrain/parallel/lane.h"

namespace pipetrain::parallel {
namespace {

std::string divisors_of(int64_t n, int64_t limit) {
  std::string list;
  for (int64_t d = 1; d <= n && d <= limit; ++d) {
    if (n % d == 0) list += (list.empty() ? "" : ", ") + std::to_string(d);
  }
  return list;
}

int64_t gcd(int64_t a, int64_t b) {
  return b == 0 ? a : gcd(b, a % b);
}

}  // namespace

C10dGroup& ExpertParallel::group_of_lane() const {
  return parallel::group_of_lane(*group, second.get());
}

double routing_imbalance_bound(int64_t experts, int64_t top_k, int ep) {
  const int64_t k = std::max<int64_t>(1, top_k);
  const int64_t local = ep > 0 ? experts / ep : experts;
  return static_cast<double>(ep) * static_cast<double>(std::min(k, local)) / static_cast<double>(k);
}

void check_routing_imbalance(double imbalance, bool mixture, int64_t experts, int64_t top_k,
                             int ep) {
  if (imbalance == 1.0) return;
  auto text = [](double x) {
    std::ostringstream out;
    out << x;
    return out.str();
  };
  const std::string given = "--routing-imbalance " + text(imbalance);
  if (ep <= 1 || !mixture) {
    throw BadInput(given +
                   " plans for the rows routing sends to the busiest expert-parallel rank: give a "
                   "mixture with --ep 2 or more (at --ep 1 every rank computes its own tokens' "
                   "choices)");
  }
  const std::string most = text(routing_imbalance_bound(experts, top_k, ep));
  if (!(imbalance >= 1.0) || imbalance > routing_imbalance_bound(experts, top_k, ep)) {
    throw BadInput(given + " is outside 1.." + most + ", what routing can reach at --ep " +
                   std::to_string(ep) + " (1: balanced; " + most +
                   ": every token of the group choosing one rank's experts)");
  }
}

void check_expert_parallel(int64_t experts, int ep, int dp) {
  if (ep < 1) throw BadInput("--ep must be 1 or more, got " + std::to_string(ep));
  if (ep == 1) return;
  const int64_t both = gcd(experts, dp);
  if (experts % ep != 0) {
    throw BadInput("--ep " + std::to_string(ep) + " does not divide the model's " +
                   std::to_string(experts) + " experts per layer; --ep " + divisors_of(both, dp) +
                   " divides them and --dp " + std::to_string(dp));
  }
  if (dp % ep != 0) {
    throw BadInput("--ep " + std::to_string(ep) +
                   " carves expert-parallel groups out of the data-parallel replicas and does not "
                   "divide --dp " +
                   std::to_string(dp) + "; --ep " + divisors_of(both, dp) +
                   " divides both it and the " + std::to_string(experts) + " experts");
  }
}

bool is_expert_parameter(const std::string& name) {
  return name.find(".experts.") != std::string::npos;
}

}  // namespace pipetrain::parallel
