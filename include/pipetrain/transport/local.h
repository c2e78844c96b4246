// LocalTransport: the in-process Transport (transport.h). Every rank is a worker thread of one
// process; a message is a Bundle handed over through a mailbox keyed by its Envelope.
//
// Device placement: recv() returns the tensors on the receiving stage's device. The copy is made
// by the receiver (non_blocking on CUDA), after its stream waited for the sender's work
// (stage/device.h markers); same-device messages are passed without a copy. Tensors are
// detached on send, so no autograd graph crosses threads: the receiving stage makes its leaves.
//
// Ownership: the transport owns undelivered Bundles until recv() or reset().
// Thread-safety: every method may be called concurrently; one mutex guards the mailboxes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "pipetrain/stage/device.h"
#include "pipetrain/transport/transport.h"

namespace pipetrain {

class LocalTransport : public Transport {
 public:
  // `stage_devices[j]` is the device of stage j. recv() gives up after `timeout` (a
  // pipetrain::Timeout that names the envelope: a schedule whose send never comes must not hang
  // the process). A message sent twice in one step is a pipetrain::ScheduleInvalid.
  explicit LocalTransport(std::vector<torch::Device> stage_devices,
                          std::chrono::milliseconds timeout = std::chrono::seconds(300));

  void send(const Envelope& envelope, Bundle bundle) override;
  Bundle recv(const Envelope& envelope) override;
  void abort(const std::string& reason) override;
  void reset() override;

  // Messages sent and not yet received (for tests and end-of-step checks).
  size_t pending() const;
  // recv() calls blocked now, waiting for their message (for tests: what abort() must wake).
  size_t waiting_receivers() const;

 private:
  using Key = std::tuple<int, int, int, int>;  // src stage, dst stage, micro-batch, payload
  struct Message {
    Bundle bundle;
    torch::Device device;  // where the sender's tensors live
    ReadyMarker ready;
  };
  static Key key_of(const Envelope& envelope);
  const torch::Device& device_of(int stage) const;

  std::vector<torch::Device> stage_devices_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<Key, Message> mailboxes_;  // GUARDED_BY(mutex_)
  size_t waiting_receivers_ = 0;      // GUARDED_BY(mutex_)
  bool aborted_ = false;              // GUARDED_BY(mutex_)
  std::string abort_reason_;          // GUARDED_BY(mutex_)
};

}  // namespace pipetrain
