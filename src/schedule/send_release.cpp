// released_sends(): when a rank frees the buffers of the messages it sent (send_release.h).
#include "pipetrain/schedule/send_release.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>

#include "pipetrain/base/error.h"
#include "pipetrain/schedule/lower.h"

namespace pipetrain::schedule {

namespace {

// A message between two stages: (payload 0 activation / 1 gradient, src stage, dst stage, i).
using Message = std::tuple<int, int, int, int>;

struct Transfer {
  bool remote = false;  // the other stage is on another rank
  bool send = false;
  Message message;
  int peer = 0;  // the other rank
};

Transfer transfer_of(const Schedule& s, int r, const Action& a) {
  Transfer t;
  const int j = a.stage;
  int other = -1;
  switch (a.op) {
    case Op::kSendActivation:
      other = j + 1;
      t = {false, true, {0, j, other, a.microbatch}, 0};
      break;
    case Op::kRecvActivation:
      other = j - 1;
      t = {false, false, {0, other, j, a.microbatch}, 0};
      break;
    case Op::kSendGradient:
      other = j - 1;
      t = {false, true, {1, j, other, a.microbatch}, 0};
      break;
    case Op::kRecvGradient:
      other = j + 1;
      t = {false, false, {1, other, j, a.microbatch}, 0};
      break;
    default:
      return t;
  }
  if (other < 0 || other >= s.num_stages) return t;
  t.peer = s.stage_rank[static_cast<std::size_t>(other)];
  t.remote = t.peer != r;
  return t;
}

// One run of the lists with a send window of `window` messages (0: none). Returns the counts, or
// nothing when the ranks wait on each other forever (*stuck names where).
std::optional<std::vector<std::vector<int>>> run_with_window(const Schedule& s, int window,
                                                             std::string* stuck) {
  const int K = s.num_ranks;
  const auto k_of = [](int r) { return static_cast<std::size_t>(r); };
  using Clock = std::vector<int>;  // per rank: how many of its actions are known to have run
  std::vector<Clock> clock(k_of(K), Clock(k_of(K), 0));
  std::map<Message, Clock> sent;       // the sender's clock at the send
  std::map<Message, int> received_at;  // the receiver's clock entry right after its receive
  // Per rank: its remote sends in order (message, receiver) and how many are proven received.
  std::vector<std::vector<std::pair<Message, int>>> sends(k_of(K));
  std::vector<int> proven(k_of(K), 0);
  std::vector<std::vector<int>> result(k_of(K));
  std::vector<std::size_t> next(k_of(K), 0);
  for (int r = 0; r < K; ++r) result[k_of(r)].assign(s.actions[k_of(r)].size(), -1);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < K; ++r) {
      const auto& list = s.actions[k_of(r)];
      Clock& mine = clock[k_of(r)];
      for (std::size_t& a = next[k_of(r)]; a < list.size(); ++a) {
        const Transfer t = transfer_of(s, r, list[a]);
        auto& my_sends = sends[k_of(r)];
        int release = 0;
        if (t.remote && !t.send) {
          auto found = sent.find(t.message);
          if (found == sent.end()) break;  // not sent yet: another rank runs first
          for (int q = 0; q < K; ++q) {
            mine[k_of(q)] = std::max(mine[k_of(q)], found->second[k_of(q)]);
          }
        } else if (t.remote) {
          // The proven prefix: a message is received once its receive is in our past.
          int& done = proven[k_of(r)];
          while (done < static_cast<int>(my_sends.size())) {
            const auto& [message, peer] = my_sends[static_cast<std::size_t>(done)];
            auto at = received_at.find(message);
            if (at == received_at.end() || mine[k_of(peer)] < at->second) break;
            ++done;
          }
          // The window: at most `window` held after this send, so the oldest beyond it are
          // waited for. Counted as complete once its receiver has run the receive: a posted
          // receive is not enough when the message's size changed (the data then travels in a
          // second message that recv() posts, transport/c10d.h).
          const int forced = window > 0 ? static_cast<int>(my_sends.size()) + 1 - window : 0;
          release = std::max(done, forced);
          bool waits = false;
          for (int k = done; k < release && !waits; ++k) {
            waits = received_at.count(my_sends[static_cast<std::size_t>(k)].first) == 0;
          }
          if (waits) break;  // the oldest send's receiver has not taken it yet
        }
        mine[k_of(r)] = static_cast<int>(a) + 1;
        progress = true;
        if (!t.remote) continue;
        if (!t.send) {
          received_at[t.message] = static_cast<int>(a) + 1;
          continue;
        }
        result[k_of(r)][a] = release;
        my_sends.emplace_back(t.message, t.peer);
        sent[t.message] = mine;
      }
    }
  }
  for (int r = 0; r < K; ++r) {
    const auto& list = s.actions[k_of(r)];
    const std::size_t at = next[k_of(r)];
    if (at < list.size()) {
      *stuck = "rank " + std::to_string(r) + " waits forever at " + to_string(list[at]);
      return std::nullopt;
    }
  }
  return result;
}

}  // namespace

std::vector<std::vector<int>> released_sends(const Schedule& lowered, int window) {
  if (!is_lowered(lowered) && lowered.num_stages > 1) {
    throw BadInput("released_sends: schedule '" + lowered.name +
                   "' has no sends or receives; lower() it first");
  }
  if (window < 0) {
    throw BadInput("released_sends: window " + std::to_string(window) + " must be >= 0");
  }
  std::string stuck;
  if (!run_with_window(lowered, 0, &stuck)) {
    throw BadInput("released_sends: schedule '" + lowered.name + "' deadlocks: " + stuck +
                   " (run validate() for the report)");
  }
  // The smallest window from `window` up that lets every rank finish; with none it does.
  std::size_t most_sends = 0;
  for (const auto& list : lowered.actions) most_sends = std::max(most_sends, list.size());
  for (int w = window; w > 0 && static_cast<std::size_t>(w) <= most_sends; ++w) {
    if (auto counts = run_with_window(lowered, w, &stuck)) return *counts;
  }
  return *run_with_window(lowered, 0, &stuck);
}

}  // namespace pipetrain::schedule
