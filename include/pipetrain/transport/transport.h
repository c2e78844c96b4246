// Transport: moves what crosses a stage boundary (activations forward, gradients backward)
// between the ranks of a pipeline.
//
// Implementations: LocalTransport (local.h: in-process queues, one process runs every rank,
// device copies) and C10dTransport (c10d.h: one process per rank over Gloo/NCCL process groups).
// The runtime's interpreter sees only this interface, so every schedule runs unchanged on both.
//
// Ordering: the interpreter posts sends and receives in the order of the lowered schedule, which
// validate() has dry-run for deadlocks. send() never blocks on its receiver; recv() blocks until
// the matching send arrived, the transport is aborted, or the timeout passes.
//
// expect(envelope) is a hint that recv(envelope) comes soon (the interpreter calls it a few
// receive actions ahead): a transport may post the receive now, so that the message lands while
// the receiver still computes instead of waiting for a round trip when recv() is called. It never
// blocks and never changes what recv() returns; a transport may ignore it (LocalTransport does).
//
// Sent buffers: a transport that copies a message keeps the copy until the send completes, which
// depends on when the receiver posts its receive. Between begin_sends() and end_sends() (one
// step of the interpreter) it keeps each copy until release_sends(n) frees the first n messages
// sent since begin_sends(): the interpreter knows from the schedule alone which have been
// received, and waits for the oldest beyond its send window (schedule/send_release.h). So what a
// rank holds in sent messages is the same in every run, and the memory model predicts it
// (partition/memory.h). release_sends() waits for those sends to complete: at once for the
// proven ones, until their receivers post the receives for the window's (the schedule was run
// with the window, so that never deadlocks). After end_sends() the rest are freed as their sends
// complete. LocalTransport copies nothing.
//
// Errors (pipetrain/base/error.h): a recv() that waited past the timeout throws pipetrain::Timeout;
// send()/recv() after an abort throw pipetrain::PeerFailed with the abort's reason; a message that
// could not be moved (a closed connection, corrupt data) is a pipetrain::TransportFailure. The
// site names the rank (where the transport knows it), the stage on this side of the boundary and
// the micro-batch; the message names the peer.
//
// Thread-safety: send/recv may be called concurrently from the worker threads of different
// ranks. abort() may be called from any thread and wakes every blocked recv().
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <torch/types.h>

namespace pipetrain {

enum class Payload { kActivation, kGradient };

// Identifies one message: the activation of micro-batch i from stage j to j+1, or the gradient
// of micro-batch i from stage j+1 back to stage j.
struct Envelope {
  int src_stage = 0;
  int dst_stage = 0;
  int microbatch = 0;
  Payload payload = Payload::kActivation;
};

// "activation of micro-batch 3 from stage 1 to stage 2" (for errors and logs).
inline std::string describe(const Envelope& envelope) {
  return std::string(envelope.payload == Payload::kActivation ? "activation" : "gradient") +
         " of micro-batch " + std::to_string(envelope.microbatch) + " from stage " +
         std::to_string(envelope.src_stage) + " to stage " + std::to_string(envelope.dst_stage);
}

// What crosses a boundary: the positional values (a tensor or a tuple of tensors) followed by the
// named skip tensors in flight (stage/skip.h). For a gradient message the tensors are the
// gradients of the activation message's tensors, in the same order (an undefined tensor means
// "no gradient").
struct Bundle {
  std::vector<torch::Tensor> tensors;
  std::vector<std::string> skip_names;  // names of the last skip_names.size() tensors
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual void send(const Envelope& envelope, Bundle bundle) = 0;
  virtual Bundle recv(const Envelope& envelope) = 0;
  // See "expect" above. REQUIRES: recv(envelope) has not been called for this message yet.
  virtual void expect(const Envelope& envelope) { (void)envelope; }

  // See "Sent buffers" above. REQUIRES: n never decreases between begin_sends() and end_sends(),
  // and the receivers of the first n messages sent since begin_sends() receive them without
  // waiting for this rank.
  // True when the transport keeps sent buffers (then the interpreter works out release_sends()'s
  // counts, which costs O(actions x ranks) per schedule).
  virtual bool keeps_sent_buffers() const { return false; }
  virtual void begin_sends() {}
  virtual void release_sends(int64_t n) { (void)n; }
  // Never throws.
  virtual void end_sends() noexcept {}

  // Wakes every blocked recv() with an error carrying `reason`; later calls fail the same way.
  virtual void abort(const std::string& reason) = 0;
  // Clears an abort and any undelivered messages so the next step starts clean.
  virtual void reset() = 0;
};

}  // namespace pipetrain
