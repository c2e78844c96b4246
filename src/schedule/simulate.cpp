// simulate(): event-driven run of a schedule on the cost model in simulate.h.
//
// Same work-list shape as validate's dry run: each rank runs while its next action's inputs have
// ended, otherwise parks on the missing input and is woken when it ends. O(actions).
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/base/error.h"

#include <algorithm>
#include <deque>
#include <stdexcept>

#include "pipetrain/schedule/lower.h"

namespace pipetrain::schedule {
namespace {

enum Kind : int { kF, kGrad, kW, kKinds };

Kind kind_of(Op op) {
  if (op == Op::kForward) return kF;
  if (op == Op::kBackwardWeight) return kW;
  return kGrad;
}

void check_vector(const std::vector<double>& values, const char* name, int stages) {
  if (!values.empty() && static_cast<int>(values.size()) != stages) {
    throw BadInput(std::string("simulate: costs.") + name + " has " +
                   std::to_string(values.size()) + " entries but the schedule has " +
                   std::to_string(stages) + " stages; give one per stage or none");
  }
  for (double v : values) {
    if (!(v >= 0)) {
      throw BadInput(std::string("simulate: costs.") + name + " holds a negative or NaN time " +
                     std::to_string(v));
    }
  }
}

}  // namespace

double Costs::of(Op op, int stage, int virtual_stages) const {
  auto pick = [&](const std::vector<double>& per_stage, double scalar) {
    if (!per_stage.empty()) return per_stage[stage];
    return scalar / std::max(virtual_stages, 1);
  };
  switch (op) {
    case Op::kForward:
      return pick(forward_per_stage, forward);
    case Op::kBackward:
      return pick(backward_per_stage, backward);
    case Op::kBackwardInput:
      return pick(backward_input_per_stage, backward_input);
    case Op::kBackwardWeight:
      return pick(backward_weight_per_stage, backward_weight);
    default:
      return 0;
  }
}

Timeline SimulationResult::timeline(const std::string& title) const {
  Timeline result;
  result.title = title;
  result.num_ranks = static_cast<int>(ranks.size());
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    for (const auto& timed : ranks[r]) {
      result.events.push_back(make_event(r, timed.action, timed.start, timed.end));
    }
  }
  return result;
}

SimulationResult simulate(const Schedule& schedule, const Costs& costs) {
  const int K = schedule.num_ranks;
  const int S = schedule.num_stages;
  const int M = schedule.num_microbatches;
  const int V = schedule.virtual_stages();
  for (double v :
       {costs.forward, costs.backward, costs.backward_input, costs.backward_weight, costs.comm}) {
    if (!(v >= 0)) {
      throw BadInput("simulate: costs must be >= 0 (got " + std::to_string(v) + ")");
    }
  }
  check_vector(costs.forward_per_stage, "forward_per_stage", S);
  check_vector(costs.backward_per_stage, "backward_per_stage", S);
  check_vector(costs.backward_input_per_stage, "backward_input_per_stage", S);
  check_vector(costs.backward_weight_per_stage, "backward_weight_per_stage", S);

  const Schedule plain = is_lowered(schedule) ? compute_only(schedule) : schedule;
  auto key = [&](int j, int kind, int i) {
    return (static_cast<std::size_t>(j) * kKinds + kind) * M + i;
  };
  std::vector<double> end(static_cast<std::size_t>(S) * kKinds * M, -1.0);
  std::vector<std::vector<int>> parked(end.size());
  std::vector<int> next(K, 0);
  std::vector<double> free_at(K, 0.0);

  SimulationResult result;
  result.ranks.resize(K);
  result.busy.assign(K, 0.0);
  for (int r = 0; r < K; ++r) result.ranks[r].reserve(plain.actions[r].size());

  std::deque<int> runnable;
  for (int r = 0; r < K; ++r) runnable.push_back(r);
  while (!runnable.empty()) {
    const int r = runnable.front();
    runnable.pop_front();
    const auto& list = plain.actions[r];
    while (next[r] < static_cast<int>(list.size())) {
      const Action& a = list[next[r]];
      const int j = a.stage;
      const int i = a.microbatch;
      // Inputs: (event, crosses ranks?)
      std::size_t needs[2];
      bool remote[2] = {false, false};
      int n = 0;
      if (a.op == Op::kForward && j > 0) {
        needs[n] = key(j - 1, kF, i);
        remote[n++] = schedule.stage_rank[j - 1] != r;
      } else if (a.op == Op::kBackward || a.op == Op::kBackwardInput) {
        needs[n++] = key(j, kF, i);
        if (j < S - 1) {
          needs[n] = key(j + 1, kGrad, i);
          remote[n++] = schedule.stage_rank[j + 1] != r;
        }
      } else if (a.op == Op::kBackwardWeight) {
        needs[n++] = key(j, kGrad, i);
      }
      double start = free_at[r];
      bool blocked = false;
      for (int p = 0; p < n; ++p) {
        if (end[needs[p]] < 0) {
          parked[needs[p]].push_back(r);
          blocked = true;
          break;
        }
        start = std::max(start, end[needs[p]] + (remote[p] ? costs.comm : 0.0));
      }
      if (blocked) break;
      const double duration = costs.per_action ? costs.per_action(a) : costs.of(a.op, j, V);
      if (!(duration >= 0)) {
        throw BadInput("simulate: per_action cost of " + to_string(a) + " must be >= 0 (got " +
                       std::to_string(duration) + ")");
      }
      const std::size_t event = key(j, kind_of(a.op), i);
      end[event] = start + duration;
      free_at[r] = start + duration;
      result.busy[r] += duration;
      result.ranks[r].push_back({a, start, start + duration});
      for (int waiter : parked[event]) runnable.push_back(waiter);
      parked[event].clear();
      ++next[r];
    }
  }
  for (int r = 0; r < K; ++r) {
    if (next[r] < static_cast<int>(plain.actions[r].size())) {
      throw BadInput("simulate: schedule '" + schedule.name + "' deadlocks (rank " +
                     std::to_string(r) + " stops at " + to_string(plain.actions[r][next[r]]) +
                     "); run validate() for the full report");
    }
  }
  result.makespan = *std::max_element(free_at.begin(), free_at.end());
  double busy = 0;
  for (double b : result.busy) busy += b;
  result.bubble_fraction =
      result.makespan > 0 ? (K * result.makespan - busy) / (K * result.makespan) : 0.0;

  result.span_idle.assign(K, 0.0);
  for (int r = 0; r < K; ++r) {
    if (result.ranks[r].empty()) continue;
    const double span = result.ranks[r].back().end - result.ranks[r].front().start;
    result.span_idle[r] = std::max(0.0, span - result.busy[r]);
    result.bubble_time = std::max(result.bubble_time, result.span_idle[r]);
  }

  // Peak activations: a rank runs its actions one after another, so list order is time order.
  result.peak_activations.assign(S, 0);
  result.peak_rank_activations.assign(K, 0.0);
  std::vector<int> live(S, 0);
  for (int r = 0; r < K; ++r) {
    const double share =
        1.0 / static_cast<double>(std::max<std::size_t>(1, schedule.stages_of_rank(r).size()));
    int rank_live = 0;
    for (const auto& a : plain.actions[r]) {
      if (a.op == Op::kForward) {
        result.peak_activations[a.stage] =
            std::max(result.peak_activations[a.stage], ++live[a.stage]);
        result.peak_rank_activations[r] =
            std::max(result.peak_rank_activations[r], ++rank_live * share);
      } else if (a.op == Op::kBackward || a.op == Op::kBackwardWeight) {
        --live[a.stage];
        --rank_live;
      }
    }
  }
  return result;
}

}  // namespace pipetrain::schedule
