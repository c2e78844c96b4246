// Interpreter: runs one rank's action list of a schedule against its stages and a Transport.
// The only executor of schedules in pipetrain: gpipe, 1f1b, interleaved-1f1b, zb-h1 and custom
// schedules all run through run(); there is no per-schedule code anywhere in the runtime.
//
//   F(j,i)   input: the micro-batch (j = 0) or the activation RF delivered; output kept for SF,
//            or, on the last stage, turned into the weighted loss (training) / kept (inference)
//   B(j,i)   full backward with the gradient RB delivered (the loss on the last stage); the
//            input gradient is kept for SB.   I(j,i): the same, input gradient only.
//   W(j,i)   weight gradients of an earlier I.
//   SF/SB    send through the transport; RF/RB receive (blocking). When both stages of a message
//            run on this rank the message is handed over locally, without the transport.
// A schedule without communication actions (compute-only) is run with implicit receives before
// F/B/I and sends after them. In a lowered schedule the interpreter announces each RF/RB from
// another rank kReceiveLookahead receive actions ahead (Transport::expect), so the transport can
// post it while this rank still computes. Before each send to another rank it tells the
// transport how many of its earlier sends of the step to free first: those the schedule proves
// received, and the oldest beyond the send window (Transport::release_sends,
// schedule/send_release.h), so their buffers go then and not later.
//
// Used per rank: the in-process Pipe runs one Interpreter per worker thread with a
// LocalTransport; a multi-process launcher runs one per process with a c10d transport.
//
// Errors: any failure is rethrown as a StepError naming the rank, the action, the stage and the
// micro-batch, with the original message. `cancel` is polled between actions: when another rank
// failed, run() stops early with a StepError saying so.
//
// Thread-safety: an Interpreter is used by one thread; with `pairs` it runs each pair's backward
// on a second thread it starts and joins within the pair (the two touch disjoint inboxes: a
// forward the activations', a backward the gradients'; Stage keeps its stash under a lock).
// Different ranks' interpreters share only the Transport (thread-safe) and read-only StepData.
#pragma once

#include <atomic>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "pipetrain/base/error.h"
#include "pipetrain/runtime/step.h"
#include "pipetrain/schedule/schedule.h"
#include "pipetrain/schedule/send_release.h"
#include "pipetrain/stage/stage.h"
#include "pipetrain/transport/transport.h"

namespace pipetrain {

// A failure of one action of one rank, or of the whole step (rank/stage/microbatch = -1).
// what() = "rank 1, stage 2, action 2B5, micro-batch 5: <cause>". kind(): PeerFailed when the rank
// stopped because another failed first; the cause's kind when the cause was a pipetrain::Error
// (a Timeout, a TransportFailure, BadInput); Runtime otherwise.
class StepError : public Error {
 public:
  StepError(ErrorKind kind, const std::string& message, int rank, int stage, int microbatch,
            const std::string& action, bool cancelled)
      : Error(kind, message, ErrorSite{rank, stage, action, microbatch}),
        rank(rank),
        stage(stage),
        microbatch(microbatch),
        cancelled(cancelled) {}
  int rank;
  int stage;
  int microbatch;
  bool cancelled;  // stopped because another rank failed first
};

class Interpreter {
 public:
  // `stages[j]` for every stage j placed on `rank` by the schedule. `released_sends`:
  // schedule::released_sends(schedule), for a caller that keeps it between steps (it costs
  // O(actions x ranks), 1.7 ms for 8 ranks x 128 micro-batches x 2 chunks); null: worked out here
  // when the transport keeps sent buffers.
  // REQUIRES: the schedule passed validate(); the stages (and `released_sends`) outlive the
  // interpreter.
  // `pairs`: schedule::pair_forwards_with_backwards(...).starts[rank] for the schedule it made,
  // or null: where it is set, a pair's forward runs on the calling thread while its backward runs
  // on a second one under parallel::LaneScope(1) (the calling thread's state handed over: grad
  // mode, autocast), both events recorded with their lanes; its receives ran before and its
  // sends run after both.
  Interpreter(int rank, const schedule::Schedule& schedule, std::map<int, Stage*> stages,
              Transport& transport, const std::vector<std::vector<int>>* released_sends = nullptr,
              const std::vector<char>* pairs = nullptr);

  // Runs the rank's actions once. Throws StepError (see above).
  void run(const StepData& data, RankResult& result, const std::atomic<bool>* cancel = nullptr);

  // (stage, micro-batch) pairs whose backward this rank runs as I + W.
  const std::set<std::pair<int, int>>& split_backward() const { return split_; }

 private:
  void execute(const schedule::Action& action, const StepData& data, RankResult& result);
  // execute() within the micro-batch's layout and auxiliary-loss scopes; failures become a
  // StepError naming the action.
  void execute_scoped(const schedule::Action& action, const StepData& data, RankResult& result,
                      const std::atomic<bool>* cancel);
  // Actions a (a forward or a backward) and a + 1 together: the backward on lane 1.
  void execute_pair(size_t a, const StepData& data, RankResult& result,
                    const std::atomic<bool>* cancel, ActionEvent& first, ActionEvent& second);
  // F of stage j on micro-batch i: input from the data or the inbox, the loss on the last stage.
  void forward(int j, int i, const StepData& data, RankResult& result);
  // B (or I when `input_only`) of stage j on micro-batch i.
  void backward(int j, int i, bool input_only);
  Bundle take(std::map<std::pair<int, int>, Bundle>& box, int j, int i, const char* what);
  void send_activation(int j, int i);
  void send_gradient(int j, int i);
  // Before a remote send: frees the buffers of the earlier sends released_before_ names.
  void release_sent();
  Bundle receive_activation(int j, int i);
  Bundle receive_gradient(int j, int i);
  bool local(int stage) const;

  // How many receive actions ahead of the next one expect() is called.
  static constexpr size_t kReceiveLookahead = 2;

  int rank_;
  const schedule::Schedule& schedule_;
  std::map<int, Stage*> stages_;
  Transport& transport_;
  bool lowered_;
  const std::vector<char>* pairs_;
  std::set<std::pair<int, int>> split_;
  // [a]: index of the first B or I after action a in this rank's list, -1 if none (offload's
  // prefetch).
  std::vector<int> next_backward_;
  // RF/RB actions of this rank that cross the transport: their index in the action list and what
  // they receive (lowered schedules only).
  std::vector<size_t> receive_at_;
  std::vector<Envelope> receive_envelope_;
  // [a]: for a send to another rank, how many of this rank's earlier remote sends of the step
  // are proven received (schedule::released_sends); -1 otherwise. Empty: compute-only schedule.
  std::vector<int> released_before_;
  size_t at_ = 0;  // the action being run
  // Messages between actions of this rank, by (stage, micro-batch).
  std::map<std::pair<int, int>, Bundle> activations_in_, activations_out_;
  std::map<std::pair<int, int>, Bundle> gradients_in_, gradients_out_;
};

}  // namespace pipetrain
