// lower(): inserts the sends and receives around each compute action (convention in lower.h).
#include "pipetrain/schedule/lower.h"
#include "pipetrain/base/error.h"

#include <stdexcept>

namespace pipetrain::schedule {

bool is_lowered(const Schedule& schedule) {
  for (const auto& list : schedule.actions) {
    for (const auto& action : list) {
      if (is_communication(action.op)) return true;
    }
  }
  return false;
}

Schedule compute_only(const Schedule& schedule) {
  Schedule result = schedule;
  for (auto& list : result.actions) {
    std::vector<Action> kept;
    kept.reserve(list.size());
    for (const auto& action : list) {
      if (is_compute(action.op)) kept.push_back(action);
    }
    list = std::move(kept);
  }
  return result;
}

Schedule lower(const Schedule& schedule) {
  Schedule result = schedule;
  const int last_stage = schedule.num_stages - 1;
  for (std::size_t r = 0; r < schedule.actions.size(); ++r) {
    std::vector<Action> lowered;
    lowered.reserve(schedule.actions[r].size() * 3);
    for (const auto& a : schedule.actions[r]) {
      const int j = a.stage;
      const int i = a.microbatch;
      switch (a.op) {
        case Op::kForward:
          if (j > 0) lowered.push_back({j, Op::kRecvActivation, i});
          lowered.push_back(a);
          if (j < last_stage) lowered.push_back({j, Op::kSendActivation, i});
          break;
        case Op::kBackward:
        case Op::kBackwardInput:
          if (j < last_stage) lowered.push_back({j, Op::kRecvGradient, i});
          lowered.push_back(a);
          if (j > 0) lowered.push_back({j, Op::kSendGradient, i});
          break;
        case Op::kBackwardWeight:
          lowered.push_back(a);
          break;
        default:
          throw BadInput("lower: schedule '" + schedule.name + "' rank " + std::to_string(r) +
                         " already holds communication action " + to_string(a) +
                         "; lower() takes a compute-only schedule (use "
                         "compute_only() first)");
      }
    }
    result.actions[r] = std::move(lowered);
  }
  return result;
}

}  // namespace pipetrain::schedule
