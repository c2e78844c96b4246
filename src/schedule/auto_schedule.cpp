// auto_schedule(): the greedy list scheduler described in auto_schedule.h.
//
// A discrete-event simulation that writes down what it runs. Each round computes, for every
// rank, the earliest time it could start something given the events known so far, and lets the
// rank with the earliest such time run its most urgent action. Every event ends after the time it
// started, so no later round can reveal an input that should have changed an earlier choice:
// the lists are a run of the schedule, which therefore validates.
#include "pipetrain/schedule/auto_schedule.h"
#include "pipetrain/base/error.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <stdexcept>
#include <utility>

#include "generator_util.h"
#include "pipetrain/schedule/validate.h"

namespace pipetrain::schedule {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();
constexpr double kSlack = 1e-9;

enum class Pick { kNone, kGrad, kForward, kWeight };

// The tie-breaks auto_schedule() tries (bit flags); it keeps the fastest result.
constexpr int kEarlierGradient = 1;
constexpr int kForwardOnTie = 2;
constexpr int kWeightFirstWhenFull = 4;
constexpr int kLooseReserve = 8;
constexpr int kPolicies[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};  // all of them

struct Choice {
  double time = kNever;
  Pick pick = Pick::kNone;
  int stage = -1;
};

class Engine {
 public:
  Engine(const AutoScheduleOptions& o, std::vector<int> stage_rank, std::vector<double> limit,
         int policy = 0)
      : o_(o),
        policy_(policy),
        K_(o.ranks),
        S_(static_cast<int>(stage_rank.size())),
        M_(o.microbatches),
        stage_rank_(std::move(stage_rank)),
        limit_(std::move(limit)),
        rank_stages_(K_),
        end_f_(static_cast<std::size_t>(S_) * M_, -1),
        end_g_(static_cast<std::size_t>(S_) * M_, -1),
        next_f_(S_, 0),
        next_g_(S_, 0),
        pending_w_(K_),
        clock_(K_, 0),
        used_(K_, 0),
        later_held_(K_, 0),
        left_(K_, 0) {
    for (int j = 0; j < S_; ++j) rank_stages_[stage_rank_[j]].push_back(j);
    for (int r = 0; r < K_; ++r) {
      left_[r] = static_cast<int>(rank_stages_[r].size()) * M_ * (o.split_backward ? 3 : 2);
    }
    schedule_.name = o.name;
    schedule_.num_ranks = K_;
    schedule_.num_stages = S_;
    schedule_.num_microbatches = M_;
    schedule_.stage_rank = stage_rank_;
    schedule_.actions.resize(K_);
  }

  // Runs the simulation; false when no rank can move while work is left (the limit is too
  // small), with stuck_rank_ set to a rank that still has work.
  bool run() {
    for (;;) {
      int best_rank = -1;
      Choice best;
      for (int r = 0; r < K_; ++r) {
        if (left_[r] == 0) continue;
        const Choice c = choose(r);
        if (c.time < best.time) {
          best = c;
          best_rank = r;
        }
      }
      if (best_rank < 0) {
        for (int r = 0; r < K_; ++r) {
          if (left_[r] > 0) {
            stuck_rank_ = r;
            return false;
          }
        }
        return true;
      }
      execute(best_rank, best);
    }
  }

  Schedule take() { return std::move(schedule_); }
  int stuck_rank() const { return stuck_rank_; }

 private:
  std::size_t at(int j, int i) const { return static_cast<std::size_t>(j) * M_ + i; }
  double share(int r) const { return 1.0 / static_cast<double>(rank_stages_[r].size()); }
  double comm(int from, int to) const {
    return stage_rank_[from] != stage_rank_[to] ? o_.costs.comm : 0.0;
  }
  double cost(Op op, int j) const {
    return o_.costs.of(op, j, static_cast<int>(rank_stages_[stage_rank_[j]].size()));
  }

  double ready_forward(int j) const {
    const int i = next_f_[j];
    if (i >= M_) return kNever;
    if (j == 0) return 0;
    const double e = end_f_[at(j - 1, i)];
    return e < 0 ? kNever : e + comm(j - 1, j);
  }

  double ready_grad(int j) const {
    const int i = next_g_[j];
    if (i >= M_ || i >= next_f_[j]) return kNever;
    const double forward = end_f_[at(j, i)];
    if (j == S_ - 1) return forward;
    const double e = end_g_[at(j + 1, i)];
    return e < 0 ? kNever : std::max(forward, e + comm(j + 1, j));
  }

  // Room for one more micro-batch on stage j of rank r, keeping room for the next chunk of the
  // same micro-batch on this rank (the V and interleaved placements visit a rank twice or more).
  // With kLooseReserve the room is kept only while no micro-batch holds a later chunk here (one
  // that does can finish without more memory); a run this lets deadlock is discarded.
  bool room_for_forward(int r, int j) const {
    if (limit_.empty()) return true;
    double need = used_[r] + share(r);
    const bool reserve = !(policy_ & kLooseReserve) || later_held_[r] == 0;
    for (int later : rank_stages_[r]) {
      if (later > j && reserve) {
        need += share(r);
        break;
      }
    }
    return need <= limit_[r] + kSlack;
  }
  bool is_later_chunk(int r, int j) const { return j != rank_stages_[r].front(); }

  // [1]..[4] of auto_schedule.h for rank r: the earliest start and what to run then.
  Choice choose(int r) const {
    const double now = clock_[r];
    Choice grad;
    Choice forward;
    bool blocked = false;  // a forward is left that the memory limit holds back
    for (int j : rank_stages_[r]) {
      const double g = std::max(now, ready_grad(j));
      // Ties go to the later stage (its gradient is further along the way back), or with
      // kEarlierGradient to the earlier one.
      const bool later = policy_ & kEarlierGradient ? j < grad.stage : j > grad.stage;
      if (g < grad.time || (g == grad.time && g < kNever && later)) {
        grad = {g, Pick::kGrad, j};
      }
      if (!room_for_forward(r, j)) {
        blocked = blocked || next_f_[j] < M_;
        continue;
      }
      const double f = std::max(now, ready_forward(j));
      // Ties go to the later stage: it brings its micro-batch's backward closer.
      if (f < forward.time || (f == forward.time && f < kNever && j > forward.stage)) {
        forward = {f, Pick::kForward, j};
      }
    }
    Choice best = grad;
    // A forward ready as early as the gradient: the gradient first, or with kForwardOnTie the
    // forward (it starts the next micro-batch's way down sooner).
    if (forward.time < best.time || (policy_ & kForwardOnTie && forward.time == best.time)) {
      best = forward;
    }
    // With kWeightFirstWhenFull, a rank whose memory holds a forward back frees it first: a
    // pending W before a ready I.
    if (policy_ & kWeightFirstWhenFull && blocked && !pending_w_[r].empty()) {
      return {now, Pick::kWeight, -1};
    }
    // Rather than wait, run a pending W: it is never on anyone's critical path.
    if (!pending_w_[r].empty() && now < best.time) best = {now, Pick::kWeight, -1};
    return best;
  }

  void execute(int r, const Choice& c) {
    const double start = c.time;
    Action action;
    switch (c.pick) {
      case Pick::kForward: {
        const int i = next_f_[c.stage]++;
        action = {c.stage, Op::kForward, i};
        used_[r] += share(r);
        if (is_later_chunk(r, c.stage)) ++later_held_[r];
        end_f_[at(c.stage, i)] = start + cost(Op::kForward, c.stage);
        clock_[r] = end_f_[at(c.stage, i)];
        break;
      }
      case Pick::kGrad: {
        const int i = next_g_[c.stage]++;
        const Op op = o_.split_backward ? Op::kBackwardInput : Op::kBackward;
        action = {c.stage, op, i};
        end_g_[at(c.stage, i)] = start + cost(op, c.stage);
        clock_[r] = end_g_[at(c.stage, i)];
        if (o_.split_backward) {
          pending_w_[r].emplace_back(c.stage, i);
        } else {
          used_[r] -= share(r);
          if (is_later_chunk(r, c.stage)) --later_held_[r];
        }
        break;
      }
      case Pick::kWeight: {
        const auto [j, i] = pending_w_[r].front();
        pending_w_[r].pop_front();
        action = {j, Op::kBackwardWeight, i};
        clock_[r] = start + cost(Op::kBackwardWeight, j);
        used_[r] -= share(r);
        if (is_later_chunk(r, j)) --later_held_[r];
        break;
      }
      case Pick::kNone:
        return;
    }
    schedule_.actions[r].push_back(action);
    --left_[r];
  }

  const AutoScheduleOptions& o_;
  const int policy_;
  const int K_;
  const int S_;
  const int M_;
  const std::vector<int> stage_rank_;
  const std::vector<double> limit_;
  std::vector<std::vector<int>> rank_stages_;
  std::vector<double> end_f_;  // end of F(j, i); -1 = not run yet
  std::vector<double> end_g_;  // end of I or B (j, i)
  std::vector<int> next_f_;    // per stage: next micro-batch to forward
  std::vector<int> next_g_;    // per stage: next micro-batch to run I or B for
  std::vector<std::deque<std::pair<int, int>>> pending_w_;  // per rank: (j, i) awaiting W
  std::vector<double> clock_;                               // per rank: when it is free
  std::vector<double> used_;     // per rank: stashed activations (units of the rank's share)
  std::vector<int> later_held_;  // per rank: of those, activations of a chunk not its first
  std::vector<int> left_;        // per rank: actions still to run
  int stuck_rank_ = -1;
  Schedule schedule_;
};

std::string number(double value) {
  std::string text = std::to_string(value);
  text.erase(text.find_last_not_of('0') + 1);
  if (!text.empty() && text.back() == '.') text.pop_back();
  return text;
}

}  // namespace

std::vector<int> v_placement(int ranks) {
  detail::require_positive("v placement", "ranks", ranks);
  std::vector<int> placement(static_cast<std::size_t>(2 * ranks));
  for (int j = 0; j < 2 * ranks; ++j) placement[j] = j < ranks ? j : 2 * ranks - 1 - j;
  return placement;
}

Schedule auto_schedule(const AutoScheduleOptions& o) {
  detail::require_positive(o.name, "ranks", o.ranks);
  detail::require_positive(o.name, "microbatches", o.microbatches);
  std::vector<int> placement = o.stage_rank;
  if (placement.empty()) {
    detail::require_positive(o.name, "virtual stages", o.virtual_stages);
    placement = detail::empty_schedule(o.name, o.ranks, 1, o.virtual_stages).stage_rank;
  }
  std::vector<int> held(o.ranks, 0);
  for (int j = 0; j < static_cast<int>(placement.size()); ++j) {
    if (placement[j] < 0 || placement[j] >= o.ranks) {
      throw BadInput(o.name + ": stage " + std::to_string(j) + " is placed on rank " +
                     std::to_string(placement[j]) + " but there are " + std::to_string(o.ranks) +
                     " ranks");
    }
    ++held[placement[j]];
  }
  for (int r = 0; r < o.ranks; ++r) {
    if (held[r] == 0) {
      throw BadInput(o.name + ": rank " + std::to_string(r) +
                     " holds no stage; every rank needs at least one");
    }
  }
  std::vector<double> limit = o.memory_limit;
  if (limit.size() == 1) limit.assign(o.ranks, limit[0]);
  if (!limit.empty() && static_cast<int>(limit.size()) != o.ranks) {
    throw BadInput(o.name + ": memory_limit has " + std::to_string(limit.size()) +
                   " values; give none, one, or one per rank (" + std::to_string(o.ranks) + ")");
  }
  Schedule schedule;
  double best = kNever;
  for (int policy : kPolicies) {
    Engine engine(o, placement, limit, policy);
    if (!engine.run()) continue;
    Schedule candidate = engine.take();
    const double makespan = simulate(candidate, o.costs).makespan;
    if (makespan < best - kSlack) {
      best = makespan;
      schedule = std::move(candidate);
    }
  }
  if (best == kNever) {
    // Find the smallest uniform limit that runs, in steps of one chunk, to name it.
    Engine engine(o, placement, limit);
    engine.run();
    const int r = engine.stuck_rank();
    const double step = 1.0 / held[r];
    double enough = *std::max_element(limit.begin(), limit.end());
    for (double trial = step; trial <= enough + o.microbatches; trial += step) {
      AutoScheduleOptions retry = o;
      retry.memory_limit = {trial};
      Engine probe(retry, placement, std::vector<double>(o.ranks, trial));
      if (probe.run()) {
        enough = trial;
        break;
      }
    }
    throw BadInput(o.name + ": the memory limit " + number(limit[r]) + " on rank " +
                   std::to_string(r) + " (in micro-batches of the " +
                   "rank's share) is too small to run " + std::to_string(o.microbatches) +
                   " micro-batches; the smallest "
                   "limit that runs is " +
                   number(enough));
  }
  const CheckResult checked = check(schedule);
  if (!checked.ok) {
    throw std::logic_error(
        o.name + ": the auto scheduler built an invalid schedule (a bug): " + checked.message);
  }
  return schedule;
}

}  // namespace pipetrain::schedule
