// check() / validate(): the static checks [1]-[4] and the blocking dry run [5] of validate.h.
//
// Every action is an event keyed by (stage, kind, micro-batch). B and I share a kind ("the input
// gradient of j is ready"), so dependencies need not know whether the backward is split.
// The dry run is a work list: a rank runs until its next action needs an event that has not
// happened, parks itself on that event, and is woken when it happens. Each action runs once and
// each rank parks at most once per action, so the run is O(actions).
#include "pipetrain/schedule/validate.h"

#include <algorithm>
#include <deque>
#include <sstream>

namespace pipetrain::schedule {
namespace {

enum Kind : int { kF, kGrad, kW, kSF, kRF, kSB, kRB, kKinds };

Kind kind_of(Op op) {
  switch (op) {
    case Op::kForward:
      return kF;
    case Op::kBackward:
    case Op::kBackwardInput:
      return kGrad;
    case Op::kBackwardWeight:
      return kW;
    case Op::kSendActivation:
      return kSF;
    case Op::kRecvActivation:
      return kRF;
    case Op::kSendGradient:
      return kSB;
    case Op::kRecvGradient:
      return kRB;
  }
  return kF;
}

struct Location {
  int rank = -1;
  int step = -1;
};

class Checker {
 public:
  explicit Checker(const Schedule& s) : s_(s) {}

  CheckResult run() {
    try {
      check_shape();
      index_actions();
      check_completeness();
      check_local_order();
      if (lowered_) check_communication();
      dry_run();
    } catch (const Failure& failure) {
      CheckResult result;
      result.ok = false;
      result.explanation = failure.explanation;
      result.cells = failure.cells;
      result.message = failure.explanation + "\n" + render_grid(s_, failure.cells);
      return result;
    }
    return {};
  }

 private:
  struct Failure {
    std::string explanation;
    std::vector<GridCell> cells;
  };

  [[noreturn]] void fail(const std::string& explanation, std::vector<GridCell> cells = {}) {
    throw Failure{"schedule '" + s_.name + "' is invalid: " + explanation, std::move(cells)};
  }

  std::string label(int r, int k) const { return to_string(s_.actions[r][k]); }
  std::string at(int r, int k) const {
    return "rank " + std::to_string(r) + " step " + std::to_string(k) + " (" + label(r, k) + ")";
  }

  std::size_t key(int j, int kind, int i) const {
    return (static_cast<std::size_t>(j) * kKinds + kind) * M_ + i;
  }

  // [1]
  void check_shape() {
    K_ = s_.num_ranks;
    S_ = s_.num_stages;
    M_ = s_.num_microbatches;
    if (K_ < 1 || S_ < 1 || M_ < 1) {
      fail("needs at least 1 rank, stage and micro-batch (got num_ranks=" + std::to_string(K_) +
           ", num_stages=" + std::to_string(S_) + ", num_microbatches=" + std::to_string(M_) + ")");
    }
    if (static_cast<int>(s_.actions.size()) != K_) {
      fail("num_ranks is " + std::to_string(K_) + " but there are " +
           std::to_string(s_.actions.size()) + " rank lists");
    }
    if (static_cast<int>(s_.stage_rank.size()) != S_) {
      fail("num_stages is " + std::to_string(S_) + " but stage_rank has " +
           std::to_string(s_.stage_rank.size()) + " entries");
    }
    for (int j = 0; j < S_; ++j) {
      if (s_.stage_rank[j] < 0 || s_.stage_rank[j] >= K_) {
        fail("stage " + std::to_string(j) + " is placed on rank " +
             std::to_string(s_.stage_rank[j]) + ", outside 0.." + std::to_string(K_ - 1));
      }
    }
    for (int r = 0; r < K_; ++r) {
      for (int k = 0; k < static_cast<int>(s_.actions[r].size()); ++k) {
        const Action& a = s_.actions[r][k];
        if (a.stage < 0 || a.stage >= S_) {
          fail(at(r, k) + " names stage " + std::to_string(a.stage) + ", but stages are 0.." +
                   std::to_string(S_ - 1),
               {{r, k}});
        }
        if (a.microbatch < 0 || a.microbatch >= M_) {
          fail(at(r, k) + " names micro-batch " + std::to_string(a.microbatch) +
                   ", but micro-batches are 0.." + std::to_string(M_ - 1),
               {{r, k}});
        }
        if (s_.stage_rank[a.stage] != r) {
          fail(at(r, k) + " runs stage " + std::to_string(a.stage) + " on rank " +
                   std::to_string(r) + ", but stage " + std::to_string(a.stage) +
                   " is placed on rank " + std::to_string(s_.stage_rank[a.stage]) +
                   "; move the action to that rank's list",
               {{r, k}});
        }
        if (is_communication(a.op)) lowered_ = true;
      }
    }
  }

  void index_actions() {
    where_.assign(static_cast<std::size_t>(S_) * kKinds * M_, Location{});
    has_b_.assign(static_cast<std::size_t>(S_) * M_, 0);
    has_i_.assign(static_cast<std::size_t>(S_) * M_, 0);
    for (int r = 0; r < K_; ++r) {
      for (int k = 0; k < static_cast<int>(s_.actions[r].size()); ++k) {
        const Action& a = s_.actions[r][k];
        Location& slot = where_[key(a.stage, kind_of(a.op), a.microbatch)];
        if (slot.rank >= 0) {
          const bool mixed = kind_of(a.op) == kGrad && s_.actions[slot.rank][slot.step].op != a.op;
          fail(
              at(r, k) + (mixed ? " is a second backward of stage " : " repeats ") +
                  (mixed ? std::to_string(a.stage) + " micro-batch " +
                               std::to_string(a.microbatch) + " after " + at(slot.rank, slot.step) +
                               "; use either B, or I followed by W, once each"
                         : at(slot.rank, slot.step) + "; each action runs exactly once"),
              {{slot.rank, slot.step}, {r, k}});
        }
        slot = {r, k};
        const std::size_t ji = static_cast<std::size_t>(a.stage) * M_ + a.microbatch;
        if (a.op == Op::kBackward) has_b_[ji] = 1;
        if (a.op == Op::kBackwardInput) has_i_[ji] = 1;
      }
    }
  }

  // [2]
  void check_completeness() {
    for (int j = 0; j < S_; ++j) {
      for (int i = 0; i < M_; ++i) {
        const std::size_t ji = static_cast<std::size_t>(j) * M_ + i;
        const std::string what = "stage " + std::to_string(j) + " micro-batch " + std::to_string(i);
        const Location f = where_[key(j, kF, i)];
        if (f.rank < 0) {
          fail(what + " has no forward " + to_string(Action{j, Op::kForward, i}) +
               "; add it to rank " + std::to_string(s_.stage_rank[j]) + "'s list");
        }
        const Location w = where_[key(j, kW, i)];
        if (has_b_[ji] && w.rank >= 0) {
          fail(what + " has both B and W (" + at(w.rank, w.step) +
                   "); with B there is no W, with W use I instead of B",
               {{w.rank, w.step}});
        }
        if (!has_b_[ji] && !has_i_[ji]) {
          fail(what + " has no backward (" + to_string(Action{j, Op::kBackward, i}) + ", or " +
                   to_string(Action{j, Op::kBackwardInput, i}) + " and " +
                   to_string(Action{j, Op::kBackwardWeight, i}) + ")",
               {{f.rank, f.step}});
        }
        if (has_i_[ji] && w.rank < 0) {
          const Location g = where_[key(j, kGrad, i)];
          fail(what + " has " + at(g.rank, g.step) + " but no weight backward " +
                   to_string(Action{j, Op::kBackwardWeight, i}),
               {{g.rank, g.step}});
        }
      }
    }
  }

  // [3]: same stage, hence same rank; positions compare directly.
  void check_local_order() {
    for (int j = 0; j < S_; ++j) {
      for (int i = 0; i < M_; ++i) {
        const Location f = where_[key(j, kF, i)];
        const Location g = where_[key(j, kGrad, i)];
        const Location w = where_[key(j, kW, i)];
        if (g.step < f.step) {
          fail(at(g.rank, g.step) + " runs before its forward, " + at(f.rank, f.step) +
                   "; a backward needs the activations its forward stashed, so move it after",
               {{g.rank, g.step}});
        }
        if (w.rank >= 0 && w.step < g.step) {
          fail(at(w.rank, w.step) + " runs before its input backward, " + at(g.rank, g.step) +
                   "; W uses the output gradient I receives, so move it after",
               {{w.rank, w.step}});
        }
      }
    }
  }

  // [4]: exactly lower()'s sends and receives.
  void check_communication() {
    auto require = [&](int j, int kind, int i, Op op, const Location& because) {
      if (where_[key(j, kind, i)].rank < 0) {
        fail(at(because.rank, because.step) + " needs " + to_string(Action{j, op, i}) +
                 " on rank " + std::to_string(because.rank) +
                 ", which is missing (every cross-stage value is sent and received explicitly "
                 "in a lowered schedule; see lower.h)",
             {{because.rank, because.step}});
      }
    };
    for (int j = 0; j < S_; ++j) {
      for (int i = 0; i < M_; ++i) {
        const Location f = where_[key(j, kF, i)];
        const Location g = where_[key(j, kGrad, i)];
        if (j > 0) require(j, kRF, i, Op::kRecvActivation, f);
        if (j < S_ - 1) require(j, kSF, i, Op::kSendActivation, f);
        if (j < S_ - 1) require(j, kRB, i, Op::kRecvGradient, g);
        if (j > 0) require(j, kSB, i, Op::kSendGradient, g);
      }
    }
    for (int r = 0; r < K_; ++r) {
      for (int k = 0; k < static_cast<int>(s_.actions[r].size()); ++k) {
        const Action& a = s_.actions[r][k];
        const bool extra = (a.op == Op::kRecvActivation && a.stage == 0) ||
                           (a.op == Op::kSendActivation && a.stage == S_ - 1) ||
                           (a.op == Op::kRecvGradient && a.stage == S_ - 1) ||
                           (a.op == Op::kSendGradient && a.stage == 0);
        if (extra) {
          fail(at(r, k) +
                   " has no partner: stage 0 receives no activation and sends no "
                   "gradient, the last stage sends no activation and receives no gradient",
               {{r, k}});
        }
      }
    }
  }

  // The events action `a` waits for, at most two.
  int prerequisites(const Action& a, std::size_t out[2]) const {
    const int j = a.stage;
    const int i = a.microbatch;
    int n = 0;
    if (!lowered_) {
      switch (a.op) {
        case Op::kForward:
          if (j > 0) out[n++] = key(j - 1, kF, i);
          break;
        case Op::kBackward:
        case Op::kBackwardInput:
          out[n++] = key(j, kF, i);
          if (j < S_ - 1) out[n++] = key(j + 1, kGrad, i);
          break;
        case Op::kBackwardWeight:
          out[n++] = key(j, kGrad, i);
          break;
        default:
          break;
      }
      return n;
    }
    switch (a.op) {
      case Op::kRecvActivation:
        out[n++] = key(j - 1, kSF, i);
        break;
      case Op::kForward:
        if (j > 0) out[n++] = key(j, kRF, i);
        break;
      case Op::kSendActivation:
        out[n++] = key(j, kF, i);
        break;
      case Op::kRecvGradient:
        out[n++] = key(j + 1, kSB, i);
        break;
      case Op::kBackward:
      case Op::kBackwardInput:
        out[n++] = key(j, kF, i);
        if (j < S_ - 1) out[n++] = key(j, kRB, i);
        break;
      case Op::kSendGradient:
        out[n++] = key(j, kGrad, i);
        break;
      case Op::kBackwardWeight:
        out[n++] = key(j, kGrad, i);
        break;
    }
    return n;
  }

  std::string describe_wait(std::size_t event) const {
    const int i = static_cast<int>(event % M_);
    const int kind = static_cast<int>((event / M_) % kKinds);
    const int j = static_cast<int>(event / M_ / kKinds);
    const Location p = where_[event];
    const Action producer = s_.actions[p.rank][p.step];
    const std::string mb = " of micro-batch " + std::to_string(i);
    if ((kind == kF || kind == kSF) && p.rank != current_rank_) {
      return "the activation" + mb + " from stage " + std::to_string(j);
    }
    if ((kind == kGrad || kind == kSB) && p.rank != current_rank_) {
      return "the gradient" + mb + " from stage " + std::to_string(j);
    }
    return to_string(producer);
  }

  // [5]
  void dry_run() {
    std::vector<char> done(where_.size(), 0);
    std::vector<std::vector<int>> parked(where_.size());
    std::vector<int> next(K_, 0);
    std::vector<std::size_t> blocked_on(K_, 0);
    std::deque<int> runnable;
    for (int r = 0; r < K_; ++r) runnable.push_back(r);
    while (!runnable.empty()) {
      const int r = runnable.front();
      runnable.pop_front();
      const auto& list = s_.actions[r];
      while (next[r] < static_cast<int>(list.size())) {
        const Action& a = list[next[r]];
        std::size_t needs[2];
        const int n = prerequisites(a, needs);
        bool blocked = false;
        for (int p = 0; p < n; ++p) {
          if (!done[needs[p]]) {
            parked[needs[p]].push_back(r);
            blocked_on[r] = needs[p];
            blocked = true;
            break;
          }
        }
        if (blocked) break;
        const std::size_t event = key(a.stage, kind_of(a.op), a.microbatch);
        done[event] = 1;
        for (int waiter : parked[event]) runnable.push_back(waiter);
        parked[event].clear();
        ++next[r];
      }
    }
    std::vector<GridCell> stuck;
    for (int r = 0; r < K_; ++r) {
      if (next[r] < static_cast<int>(s_.actions[r].size())) stuck.push_back({r, next[r]});
    }
    if (stuck.empty()) return;
    // Follow the chain of waits from the first stuck rank until it closes on itself.
    std::string story;
    std::vector<char> visited(K_, 0);
    int r = stuck.front().rank;
    for (int hop = 0;; ++hop) {
      visited[r] = 1;
      current_rank_ = r;
      const std::size_t event = blocked_on[r];
      const Location producer = where_[event];
      story += (hop == 0 ? "rank " + std::to_string(r) + " waits at step " : "waiting at step ") +
               std::to_string(next[r]) + " (" + label(r, next[r]) + ") for " +
               describe_wait(event) + ", which ";
      if (producer.rank == r) {
        story += "it only runs later, at step " + std::to_string(producer.step) +
                 ": an action cannot wait for one behind it on its own rank";
        break;
      }
      story += "rank " + std::to_string(producer.rank) + " only runs at step " +
               std::to_string(producer.step) + " (" + label(producer.rank, producer.step) + ")";
      if (visited[producer.rank]) {
        story += "; rank " + std::to_string(producer.rank) +
                 " is itself waiting in this chain, so none of them can proceed";
        break;
      }
      story += ", after ";
      r = producer.rank;
    }
    fail("deadlock: " + story +
             ". Reorder the marked actions so that each value is produced before the rank that "
             "needs it blocks.",
         stuck);
  }

  const Schedule& s_;
  int K_ = 0;
  int S_ = 0;
  int M_ = 0;
  bool lowered_ = false;
  int current_rank_ = -1;
  std::vector<Location> where_;
  std::vector<char> has_b_;
  std::vector<char> has_i_;
};

}  // namespace

CheckResult check(const Schedule& schedule) {
  return Checker(schedule).run();
}

void validate(const Schedule& schedule) {
  CheckResult result = check(schedule);
  if (!result.ok) throw ScheduleError(result.message, result.cells);
}

}  // namespace pipetrain::schedule
