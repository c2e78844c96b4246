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

namespace {

void check_costs(const Costs& costs, int stages) {
  for (double v :
       {costs.forward, costs.backward, costs.backward_input, costs.backward_weight, costs.comm}) {
    if (!(v >= 0)) {
      throw BadInput("simulate: costs must be >= 0 (got " + std::to_string(v) + ")");
    }
  }
  check_vector(costs.forward_per_stage, "forward_per_stage", stages);
  check_vector(costs.backward_per_stage, "backward_per_stage", stages);
  check_vector(costs.backward_input_per_stage, "backward_input_per_stage", stages);
  check_vector(costs.backward_weight_per_stage, "backward_weight_per_stage", stages);
}

// The event loop: each rank runs its compute-only list in order while the inputs of its next
// action have ended; otherwise it parks on the missing input and is woken when that ends.
class EventLoop {
 public:
  EventLoop(const Schedule& schedule, const Schedule& plain, const Costs& costs)
      : schedule_(schedule),
        plain_(plain),
        costs_(costs),
        M_(schedule.num_microbatches),
        end_(static_cast<std::size_t>(schedule.num_stages) * kKinds * M_, -1.0),
        parked_(end_.size()),
        next_(static_cast<std::size_t>(schedule.num_ranks), 0) {}

  // Fills result.ranks and result.busy; returns each rank's end time. Throws on a deadlock.
  std::vector<double> run(SimulationResult& result) {
    const int K = schedule_.num_ranks;
    free_at_.assign(static_cast<std::size_t>(K), 0.0);
    result.ranks.resize(K);
    result.busy.assign(K, 0.0);
    for (int r = 0; r < K; ++r) result.ranks[r].reserve(plain_.actions[r].size());
    for (int r = 0; r < K; ++r) runnable_.push_back(r);
    while (!runnable_.empty()) {
      const int r = runnable_.front();
      runnable_.pop_front();
      while (next_[r] < static_cast<int>(plain_.actions[r].size()) && try_run(r, result)) {
        ++next_[r];
      }
    }
    for (int r = 0; r < K; ++r) {
      if (next_[r] < static_cast<int>(plain_.actions[r].size())) {
        throw BadInput("simulate: schedule '" + schedule_.name + "' deadlocks (rank " +
                       std::to_string(r) + " stops at " + to_string(plain_.actions[r][next_[r]]) +
                       "); run validate() for the full report");
      }
    }
    return free_at_;
  }

 private:
  std::size_t key(int j, int kind, int i) const {
    return (static_cast<std::size_t>(j) * kKinds + kind) * M_ + i;
  }

  // Runs rank r's next action if its inputs have ended; otherwise parks r on the first missing
  // one and returns false.
  bool try_run(int r, SimulationResult& result) {
    const Action& a = plain_.actions[r][next_[r]];
    const int j = a.stage;
    const int i = a.microbatch;
    const int S = schedule_.num_stages;
    // Inputs: (event, crosses ranks?)
    std::size_t needs[2];
    bool remote[2] = {false, false};
    int n = 0;
    if (a.op == Op::kForward && j > 0) {
      needs[n] = key(j - 1, kF, i);
      remote[n++] = schedule_.stage_rank[j - 1] != r;
    } else if (a.op == Op::kBackward || a.op == Op::kBackwardInput) {
      needs[n++] = key(j, kF, i);
      if (j < S - 1) {
        needs[n] = key(j + 1, kGrad, i);
        remote[n++] = schedule_.stage_rank[j + 1] != r;
      }
    } else if (a.op == Op::kBackwardWeight) {
      needs[n++] = key(j, kGrad, i);
    }
    double start = free_at_[r];
    for (int p = 0; p < n; ++p) {
      if (end_[needs[p]] < 0) {
        parked_[needs[p]].push_back(r);
        return false;
      }
      start = std::max(start, end_[needs[p]] + (remote[p] ? costs_.comm : 0.0));
    }
    const double duration =
        costs_.per_action ? costs_.per_action(a) : costs_.of(a.op, j, schedule_.virtual_stages());
    if (!(duration >= 0)) {
      throw BadInput("simulate: per_action cost of " + to_string(a) + " must be >= 0 (got " +
                     std::to_string(duration) + ")");
    }
    const std::size_t event = key(j, kind_of(a.op), i);
    end_[event] = start + duration;
    free_at_[r] = start + duration;
    result.busy[r] += duration;
    result.ranks[r].push_back({a, start, start + duration});
    for (int waiter : parked_[event]) runnable_.push_back(waiter);
    parked_[event].clear();
    return true;
  }

  const Schedule& schedule_;
  const Schedule& plain_;
  const Costs& costs_;
  const int M_;
  std::vector<double> end_;               // by key(j, kind, i): when it ended, -1 before
  std::vector<std::vector<int>> parked_;  // by key: the ranks waiting for it
  std::vector<int> next_;                 // per rank: index of its next action
  std::vector<double> free_at_;           // per rank: when its last action ended
  std::deque<int> runnable_;
};

// Makespan, bubble fraction, and the ZB paper's bubble time (per-rank idle between first and last
// action).
void summarize_time(const std::vector<double>& free_at, SimulationResult& result) {
  const int K = static_cast<int>(free_at.size());
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
}

// Peak activations: a rank runs its actions one after another, so list order is time order.
void count_peak_activations(const Schedule& schedule, const Schedule& plain,
                            SimulationResult& result) {
  const int K = schedule.num_ranks;
  const int S = schedule.num_stages;
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
}

}  // namespace

SimulationResult simulate(const Schedule& schedule, const Costs& costs) {
  check_costs(costs, schedule.num_stages);
  const Schedule plain = is_lowered(schedule) ? compute_only(schedule) : schedule;
  SimulationResult result;
  const std::vector<double> free_at = EventLoop(schedule, plain, costs).run(result);
  summarize_time(free_at, result);
  count_peak_activations(schedule, plain, result);
  return result;
}

}  // namespace pipetrain::schedule
