// Schedule helpers that need no generator: placement queries.
#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

std::vector<int> Schedule::stages_of_rank(int r) const {
  std::vector<int> stages;
  for (int j = 0; j < static_cast<int>(stage_rank.size()); ++j) {
    if (stage_rank[j] == r) stages.push_back(j);
  }
  return stages;
}

std::map<int, std::size_t> Schedule::last_gradient_actions(int r) const {
  std::map<int, std::size_t> last;
  const auto& list = actions.at(static_cast<std::size_t>(r));
  for (std::size_t a = 0; a < list.size(); ++a) {
    if (list[a].op == Op::kBackward || list[a].op == Op::kBackwardWeight) last[list[a].stage] = a;
  }
  return last;
}

std::map<int, std::size_t> Schedule::gradient_sum_starts(int r) const {
  std::map<int, std::size_t> starts = last_gradient_actions(r);
  const auto& list = actions.at(static_cast<std::size_t>(r));
  for (auto& [stage, a] : starts) {
    while (a + 1 < list.size() &&
           (list[a + 1].op == Op::kSendActivation || list[a + 1].op == Op::kSendGradient)) {
      ++a;
    }
  }
  return starts;
}

bool Schedule::splits_backward() const {
  for (const auto& rank_actions : actions) {
    for (const auto& action : rank_actions) {
      if (action.op == Op::kBackwardInput || action.op == Op::kBackwardWeight) return true;
    }
  }
  return false;
}

}  // namespace pipetrain::schedule
