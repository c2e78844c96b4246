// The single schedule interpreter (include/pipetrain/runtime/interpreter.h).
#include "pipetrain/runtime/interpreter.h"

#include <exception>
#include <optional>
#include <thread>

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include "pipetrain/base/check.h"
#include "pipetrain/base/message_of.h"
#include "pipetrain/parallel/lane.h"
#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/send_release.h"
#include "pipetrain/stage/auxiliary_loss.h"

namespace pipetrain {
namespace {

using schedule::Op;

double micros_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

// The cause's message for a StepError at (rank, action): without the cause's site when the
// StepError's site says all of it (an in-process transport, a stage), with it otherwise (a c10d
// transport names the world rank, which differs from the pipeline rank when there are replicas).
std::string cause_text(const std::exception& e, int rank, const schedule::Action& action) {
  const auto* cause = dynamic_cast<const Error*>(&e);
  if (cause == nullptr) return message_of(e);
  const ErrorSite& site = cause->site();
  const bool covered = (site.rank < 0 || site.rank == rank) &&
                       (site.stage < 0 || site.stage == action.stage) &&
                       (site.microbatch < 0 || site.microbatch == action.microbatch) &&
                       (site.action.empty() || site.action == schedule::to_string(action));
  return covered ? cause->message() : cause->what();
}

// The StepError of `action` failing with `e`: PeerFailed when another rank's failure cancelled the
// step, else the cause's kind (Runtime for what is not a pipetrain::Error).
StepError step_error(const std::exception& e, bool cancelled, int rank,
                     const schedule::Action& action) {
  const auto* cause = dynamic_cast<const Error*>(&e);
  const ErrorKind kind = cancelled ? ErrorKind::PeerFailed
                         : cause   ? cause->kind()
                                   : ErrorKind::Runtime;
  return StepError(kind, cause_text(e, rank, action), rank, action.stage, action.microbatch,
                   schedule::to_string(action), cancelled);
}

}  // namespace

Interpreter::Interpreter(int rank, const schedule::Schedule& schedule, std::map<int, Stage*> stages,
                         Transport& transport, const std::vector<std::vector<int>>* released_sends,
                         const std::vector<char>* pairs)
    : rank_(rank),
      schedule_(schedule),
      stages_(std::move(stages)),
      transport_(transport),
      lowered_(schedule::is_lowered(schedule)),
      pairs_(pairs) {
  PIPETRAIN_CHECK_INPUT(rank >= 0 && rank < schedule.num_ranks, "rank ", rank,
                        " is out of range for a schedule of ", schedule.num_ranks, " ranks");
  const auto& actions = schedule.actions[static_cast<size_t>(rank)];
  if (pairs_) {
    PIPETRAIN_CHECK_INPUT(pairs_->size() == actions.size(), "the pairs of rank ", rank, " cover ",
                          pairs_->size(), " actions but the rank runs ", actions.size());
    for (size_t a = 0; a < actions.size(); ++a) {
      if (!(*pairs_)[a]) continue;
      const bool ok =
          a + 1 < actions.size() && is_compute(actions[a].op) && is_compute(actions[a + 1].op) &&
          ((actions[a].op == Op::kForward) != (actions[a + 1].op == Op::kForward)) &&
          actions[a].op != Op::kBackwardWeight && actions[a + 1].op != Op::kBackwardWeight;
      PIPETRAIN_CHECK_INPUT(ok, "rank ", rank, "'s action ", a, " (",
                            schedule::to_string(actions[a]),
                            ") starts a pair but it and the next are not a forward and a backward");
    }
  }
  next_backward_.assign(actions.size(), -1);
  for (size_t a = actions.size(); a-- > 1;) {
    const bool backward = actions[a].op == Op::kBackward || actions[a].op == Op::kBackwardInput;
    next_backward_[a - 1] = backward ? static_cast<int>(a) : next_backward_[a];
  }
  for (size_t a = 0; a < actions.size(); ++a) {
    const schedule::Action& action = actions[a];
    if (action.op == Op::kBackwardInput) split_.emplace(action.stage, action.microbatch);
    PIPETRAIN_CHECK_INPUT(stages_.count(action.stage), "rank ", rank, " runs action ",
                          schedule::to_string(action), " but holds no stage ", action.stage);
    const int j = action.stage;
    if (action.op == Op::kRecvActivation && !local(j - 1)) {
      receive_at_.push_back(a);
      receive_envelope_.push_back(Envelope{j - 1, j, action.microbatch, Payload::kActivation});
    } else if (action.op == Op::kRecvGradient && !local(j + 1)) {
      receive_at_.push_back(a);
      receive_envelope_.push_back(Envelope{j + 1, j, action.microbatch, Payload::kGradient});
    }
  }
  if (lowered_ && transport.keeps_sent_buffers()) {
    released_before_ = released_sends
                           ? released_sends->at(static_cast<size_t>(rank))
                           : schedule::released_sends(schedule)[static_cast<size_t>(rank)];
  }
}

bool Interpreter::local(int stage) const {
  return stages_.count(stage) > 0;
}

Bundle Interpreter::take(std::map<std::pair<int, int>, Bundle>& box, int j, int i,
                         const char* what) {
  auto found = box.find({j, i});
  PIPETRAIN_CHECK(found != box.end(), ScheduleInvalid, "no ", what, " of micro-batch ", i,
                  " is waiting at stage ", j, " on rank ", rank_,
                  "; the schedule uses it before it arrives");
  Bundle bundle = std::move(found->second);
  box.erase(found);
  return bundle;
}

void Interpreter::release_sent() {
  if (at_ < released_before_.size() && released_before_[at_] > 0)
    transport_.release_sends(released_before_[at_]);
}

void Interpreter::send_activation(int j, int i) {
  Bundle bundle = take(activations_out_, j, i, "activation to send");
  if (local(j + 1)) {
    activations_in_[{j + 1, i}] = std::move(bundle);  // same rank: no transport
  } else {
    release_sent();
    transport_.send(Envelope{j, j + 1, i, Payload::kActivation}, std::move(bundle));
  }
}

void Interpreter::send_gradient(int j, int i) {
  Bundle bundle = take(gradients_out_, j, i, "gradient to send");
  if (local(j - 1)) {
    gradients_in_[{j - 1, i}] = std::move(bundle);
  } else {
    release_sent();
    transport_.send(Envelope{j, j - 1, i, Payload::kGradient}, std::move(bundle));
  }
}

Bundle Interpreter::receive_activation(int j, int i) {
  if (local(j - 1)) return take(activations_in_, j, i, "activation");
  return transport_.recv(Envelope{j - 1, j, i, Payload::kActivation});
}

Bundle Interpreter::receive_gradient(int j, int i) {
  if (local(j + 1)) return take(gradients_in_, j, i, "gradient");
  return transport_.recv(Envelope{j + 1, j, i, Payload::kGradient});
}

void Interpreter::forward(int j, int i, const StepData& data, RankResult& result) {
  const int last = schedule_.num_stages - 1;
  Stage& stage = *stages_.at(j);
  Bundle input;
  if (j == 0) {
    PIPETRAIN_CHECK_INPUT(i < static_cast<int>(data.inputs.size()), "micro-batch ", i,
                          " has no input (the step has ", data.inputs.size(), " micro-batches)");
    input.tensors = data.inputs[static_cast<size_t>(i)];
  } else {
    // Lowered: RF (or the local SF) left it in the inbox. Compute-only: receive it now.
    input = lowered_ ? take(activations_in_, j, i, "activation") : receive_activation(j, i);
  }
  Bundle output;
  if (!data.training) {
    output = stage.infer(std::move(input));
  } else {
    StageForwardOptions options;
    options.checkpoint = is_checkpointed(data.checkpoint, i, data.num_microbatches);
    options.split_backward = split_.count({j, i}) > 0;
    options.offload = data.offload && options.checkpoint;
    if (j == last) {
      const torch::Tensor& target = data.targets.at(static_cast<size_t>(i));
      const double weight = data.loss_weights.at(static_cast<size_t>(i));
      const LossFn* loss_fn = data.loss_fn;
      options.loss = [loss_fn, &target, weight, j](const std::vector<torch::Tensor>& out) {
        PIPETRAIN_CHECK_INPUT(out.size() == 1, "the last stage (", j, ") returned ", out.size(),
                              " tensors but the loss takes one output; make the last layer "
                              "return a single tensor");
        // One micro-batch is the whole batch: its weight is 1, and a multiply by 1 would cost a
        // kernel and an autograd node each way for nothing.
        torch::Tensor loss = (*loss_fn)(out[0], target);
        return weight == 1.0 ? loss : loss * weight;
      };
    }
    torch::Tensor loss;
    output = stage.forward(i, std::move(input), options, &loss);
    if (j == last) result.losses[static_cast<size_t>(i)] = loss;
  }
  if (j != last) {
    activations_out_[{j, i}] = std::move(output);
    if (!lowered_) send_activation(j, i);
    return;
  }
  PIPETRAIN_CHECK_INPUT(output.skip_names.empty(), "skip '", output.skip_names.front(),
                        "' was stashed but never popped by the last layer; pop every skip");
  if (!data.training) result.outputs[static_cast<size_t>(i)] = std::move(output.tensors);
}

void Interpreter::backward(int j, int i, bool input_only) {
  Stage& stage = *stages_.at(j);
  Bundle grads;
  if (j != schedule_.num_stages - 1) {
    grads = lowered_ ? take(gradients_in_, j, i, "gradient") : receive_gradient(j, i);
  }
  Bundle input_grads = input_only ? stage.backward_input(i, grads) : stage.backward(i, grads);
  if (j > 0) {
    gradients_out_[{j, i}] = std::move(input_grads);
    if (!lowered_) send_gradient(j, i);
  }
}

void Interpreter::execute(const schedule::Action& action, const StepData& data,
                          RankResult& result) {
  const int j = action.stage;
  const int i = action.microbatch;
  switch (action.op) {
    case Op::kForward:
      forward(j, i, data, result);
      break;
    case Op::kBackward:
      backward(j, i, /*input_only=*/false);
      break;
    case Op::kBackwardInput:
      backward(j, i, /*input_only=*/true);
      break;
    case Op::kBackwardWeight:
      stages_.at(j)->backward_weight(i);
      break;
    case Op::kSendActivation:
      send_activation(j, i);
      break;
    case Op::kSendGradient:
      send_gradient(j, i);
      break;
    case Op::kRecvActivation:
      activations_in_[{j, i}] = receive_activation(j, i);
      break;
    case Op::kRecvGradient:
      gradients_in_[{j, i}] = receive_gradient(j, i);
      break;
  }
}

void Interpreter::run(const StepData& data, RankResult& result, const std::atomic<bool>* cancel) {
  activations_in_.clear();
  activations_out_.clear();
  gradients_in_.clear();
  gradients_out_.clear();
  result.losses.assign(static_cast<size_t>(data.num_microbatches), torch::Tensor());
  result.outputs.assign(static_cast<size_t>(data.num_microbatches), {});
  result.events.clear();
  const auto& actions = schedule_.actions[static_cast<size_t>(rank_)];
  size_t next_receive = 0;  // index into receive_at_ of the next receive action to run
  size_t expected = 0;      // receives announced with expect() so far
  // Sent buffers follow the schedule for this step (transport.h, "Sent buffers").
  struct SendsOfThisStep {
    Transport& transport;
    explicit SendsOfThisStep(Transport& t) : transport(t) { transport.begin_sends(); }
    ~SendsOfThisStep() { transport.end_sends(); }
  };
  std::optional<SendsOfThisStep> sends;
  if (!released_before_.empty()) sends.emplace(transport_);
  // The action after which each stage's gradient sum starts: its last B or W here, or the sends
  // right after it (Schedule::gradient_sum_starts).
  std::map<size_t, int> sum_starts_after;
  if (data.training && data.on_stage_gradients) {
    for (const auto& [stage, a] : schedule_.gradient_sum_starts(rank_)) {
      sum_starts_after[a] = stage;
    }
  }
  if (data.parameters && data.residency && data.residency->first >= 0) {
    data.parameters->start_gather(data.residency->first);
  }
  for (size_t a = 0; a < actions.size(); ++a) {
    const schedule::Action& action = actions[a];
    at_ = a;
    if (cancel && cancel->load(std::memory_order_relaxed)) {
      throw StepError(ErrorKind::PeerFailed, "stopped before this action: another rank failed",
                      rank_, action.stage, action.microbatch, schedule::to_string(action),
                      /*cancelled=*/true);
    }
    ActionEvent event{rank_, action, micros_since(data.start), 0};
    try {
      for (; expected < receive_at_.size() && expected < next_receive + kReceiveLookahead;
           ++expected) {
        transport_.expect(receive_envelope_[expected]);
      }
      if (next_receive < receive_at_.size() && receive_at_[next_receive] == a) ++next_receive;
      // Offload: the next backward's inputs start back to the device now, so that the copy
      // overlaps this action.
      if (data.offload && next_backward_[a] >= 0) {
        const schedule::Action& next = actions[static_cast<size_t>(next_backward_[a])];
        stages_.at(next.stage)->prefetch(next.microbatch);
      }
      const schedule::ResidencyStep* residency =
          data.parameters && data.residency ? &data.residency->steps.at(a) : nullptr;
      if (residency && residency->needs >= 0) {
        // The wait for the parameters is the collective's (the trace's collectives row), not the
        // action's: the action starts once they are whole.
        data.parameters->wait_gathered(residency->needs);
        event.start_us = micros_since(data.start);
      }
      if (pairs_ && (*pairs_)[a]) {
        ActionEvent second{rank_, actions[a + 1], 0, 0};
        execute_pair(a, data, result, cancel, event, second);
        // The pair's later event goes after the earlier one's below.
        result.events.push_back(event);
        event = second;
        ++a;
        at_ = a;
      } else {
        execute_scoped(action, data, result, nullptr);
      }
      for (size_t done = event.action == action ? a : a - 1; done <= a; ++done) {
        const auto sum_here = sum_starts_after.find(done);
        if (sum_here != sum_starts_after.end()) data.on_stage_gradients(sum_here->second);
      }
      if (residency && residency->release >= 0) data.parameters->release(residency->release);
      if (residency && residency->prefetch >= 0) data.parameters->start_gather(residency->prefetch);
    } catch (const StepError&) {
      throw;  // a pair's, naming its action
    } catch (const std::exception& e) {
      throw step_error(e, cancel && cancel->load(std::memory_order_relaxed), rank_, action);
    }
    if (event.end_us == 0) event.end_us = micros_since(data.start);
    result.events.push_back(event);
  }
}

void Interpreter::execute_scoped(const schedule::Action& action, const StepData& data,
                                 RankResult& result, const std::atomic<bool>* cancel) {
  try {
    // Micro-batch i's layout for its forward, the recompute inside its backward, inference.
    const auto layout = static_cast<size_t>(action.microbatch);
    const data::LayoutScope scope(layout < data.layouts.size() ? data.layouts[layout].get()
                                                               : nullptr);
    // Its share of the step's loss, for the auxiliary terms its layers attach.
    const AuxiliaryLossScope auxiliary(
        data.training && layout < data.loss_weights.size() ? data.loss_weights[layout] : 1.0);
    execute(action, data, result);
  } catch (const StepError&) {
    throw;
  } catch (const std::exception& e) {
    if (!cancel) throw;  // run() names the action
    throw step_error(e, cancel->load(std::memory_order_relaxed), rank_, action);
  }
}

void Interpreter::execute_pair(size_t a, const StepData& data, RankResult& result,
                               const std::atomic<bool>* cancel, ActionEvent& first,
                               ActionEvent& second) {
  const auto& actions = schedule_.actions[static_cast<size_t>(rank_)];
  const bool forward_first = actions[a].op == Op::kForward;
  ActionEvent& forward_event = forward_first ? first : second;
  ActionEvent& backward_event = forward_first ? second : first;
  const schedule::Action backward_action = backward_event.action;
  // Not null, so that each side's failure names its own action.
  static const std::atomic<bool> never{false};
  const std::atomic<bool>* watch = cancel ? cancel : &never;
  std::exception_ptr backward_failure;
  const at::ThreadLocalState state;  // grad mode, autocast, dispatch keys of this thread
  backward_event.lane = 1;
  backward_event.start_us = micros_since(data.start);
  std::thread lane([&] {
    try {
      at::init_num_threads();  // the process's intra-op threads, as autograd's workers do
      const at::ThreadLocalStateGuard guard(state);
      const parallel::LaneScope on_lane(1);
      execute_scoped(backward_action, data, result, watch);
    } catch (...) {
      backward_failure = std::current_exception();
    }
    backward_event.end_us = micros_since(data.start);
  });
  std::exception_ptr forward_failure;
  forward_event.start_us = micros_since(data.start);
  try {
    execute_scoped(forward_event.action, data, result, watch);
  } catch (...) {
    forward_failure = std::current_exception();
  }
  forward_event.end_us = micros_since(data.start);
  lane.join();
  if (forward_failure) std::rethrow_exception(forward_failure);
  if (backward_failure) std::rethrow_exception(backward_failure);
}

}  // namespace pipetrain
