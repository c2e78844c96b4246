// released_sends(): which sent messages a rank knows to be received (send_release.h).
#include "pipetrain/schedule/send_release.h"

#include <algorithm>
#include <map>
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

}  // namespace

std::vector<std::vector<int>> released_sends(const Schedule& lowered) {
  if (!is_lowered(lowered) && lowered.num_stages > 1) {
    throw BadInput("released_sends: schedule '" + lowered.name +
                   "' has no sends or receives; lower() it first");
  }
  const int K = lowered.num_ranks;
  using Clock = std::vector<int>;  // per rank: how many of its actions are known to have run
  std::vector<Clock> clock(static_cast<std::size_t>(K), Clock(static_cast<std::size_t>(K), 0));
  std::map<Message, Clock> sent;       // the sender's clock at the send
  std::map<Message, int> received_at;  // the receiver's clock entry right after its receive
  // Per rank: its remote sends in order (message, receiver), and how many are proven received.
  std::vector<std::vector<std::pair<Message, int>>> sends(static_cast<std::size_t>(K));
  std::vector<int> proven(static_cast<std::size_t>(K), 0);
  std::vector<std::vector<int>> result(static_cast<std::size_t>(K));
  std::vector<std::size_t> next(static_cast<std::size_t>(K), 0);
  for (int r = 0; r < K; ++r) {
    result[static_cast<std::size_t>(r)].assign(lowered.actions[static_cast<std::size_t>(r)].size(),
                                               -1);
  }
  // Runs each rank as far as it can (a receive waits for its send) until all are done.
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < K; ++r) {
      const auto& list = lowered.actions[static_cast<std::size_t>(r)];
      Clock& mine = clock[static_cast<std::size_t>(r)];
      for (std::size_t& a = next[static_cast<std::size_t>(r)]; a < list.size(); ++a) {
        const Transfer t = transfer_of(lowered, r, list[a]);
        if (t.remote && !t.send) {
          auto found = sent.find(t.message);
          if (found == sent.end()) break;  // not sent yet: another rank runs first
          for (int q = 0; q < K; ++q) {
            mine[static_cast<std::size_t>(q)] = std::max(
                mine[static_cast<std::size_t>(q)], found->second[static_cast<std::size_t>(q)]);
          }
        }
        mine[static_cast<std::size_t>(r)] = static_cast<int>(a) + 1;
        progress = true;
        if (!t.remote) continue;
        if (!t.send) {
          received_at[t.message] = static_cast<int>(a) + 1;
          continue;
        }
        // Advance the proven prefix: a message is received once its receive is in our past.
        auto& my_sends = sends[static_cast<std::size_t>(r)];
        int& done = proven[static_cast<std::size_t>(r)];
        while (done < static_cast<int>(my_sends.size())) {
          const auto& [message, peer] = my_sends[static_cast<std::size_t>(done)];
          auto at = received_at.find(message);
          if (at == received_at.end() || mine[static_cast<std::size_t>(peer)] < at->second) break;
          ++done;
        }
        result[static_cast<std::size_t>(r)][a] = done;
        my_sends.emplace_back(t.message, t.peer);
        sent[t.message] = mine;
      }
    }
  }
  for (int r = 0; r < K; ++r) {
    const auto& list = lowered.actions[static_cast<std::size_t>(r)];
    const std::size_t at = next[static_cast<std::size_t>(r)];
    if (at < list.size()) {
      throw BadInput("released_sends: schedule '" + lowered.name + "' deadlocks: rank " +
                     std::to_string(r) + " waits forever at " + to_string(list[at]) +
                     " (run validate() for the report)");
    }
  }
  return result;
}

}  // namespace pipetrain::schedule
