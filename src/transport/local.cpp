// In-process mailboxes with device copies (include/pipetrain/transport/local.h).
#include "pipetrain/transport/local.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include "pipetrain/base/check.h"

namespace pipetrain {

LocalTransport::LocalTransport(std::vector<torch::Device> stage_devices,
                               std::chrono::milliseconds timeout)
    : stage_devices_(std::move(stage_devices)), timeout_(timeout) {}

LocalTransport::Key LocalTransport::key_of(const Envelope& envelope) {
  return Key{envelope.src_stage, envelope.dst_stage, envelope.microbatch,
             static_cast<int>(envelope.payload)};
}

const torch::Device& LocalTransport::device_of(int stage) const {
  PIPETRAIN_CHECK_INPUT(stage >= 0 && stage < static_cast<int>(stage_devices_.size()), "stage ",
                        stage, " is out of range: the transport knows ", stage_devices_.size(),
                        " stages");
  return stage_devices_[static_cast<size_t>(stage)];
}

void LocalTransport::send(const Envelope& envelope, Bundle bundle) {
  const torch::Device& device = device_of(envelope.src_stage);
  for (auto& t : bundle.tensors) {
    if (t.defined()) t = t.detach();
  }
  Message message{std::move(bundle), device, mark_ready(device)};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const ErrorSite site{-1, envelope.src_stage, "", envelope.microbatch};
    PIPETRAIN_CHECK_AT(!aborted_, PeerFailed, site, "send of the ", describe(envelope),
                       " after the transport was aborted: ", abort_reason_);
    auto inserted = mailboxes_.emplace(key_of(envelope), std::move(message));
    PIPETRAIN_CHECK(inserted.second, ScheduleInvalid, "the ", describe(envelope),
                    " was sent twice in one step; check the schedule");
  }
  arrived_.notify_all();
}

Bundle LocalTransport::recv(const Envelope& envelope) {
  const torch::Device& device = device_of(envelope.dst_stage);
  Message message{{}, torch::kCPU, {}};
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const Key key = key_of(envelope);
    ++waiting_receivers_;
    const bool ready =
        arrived_.wait_for(lock, timeout_, [&] { return aborted_ || mailboxes_.count(key) > 0; });
    --waiting_receivers_;
    const ErrorSite site{-1, envelope.dst_stage, "", envelope.microbatch};
    PIPETRAIN_CHECK_AT(!aborted_, PeerFailed, site, "receive of the ", describe(envelope),
                       " aborted: ", abort_reason_);
    PIPETRAIN_CHECK_AT(ready, Timeout, site, "timed out after ", timeout_.count(),
                       " ms waiting for the ", describe(envelope),
                       "; the sender never sent it (a schedule that deadlocks, or "
                       "a stage much slower than the timeout: raise it)");
    auto found = mailboxes_.find(key);
    message = std::move(found->second);
    mailboxes_.erase(found);
  }
  wait_ready(message.ready, device);
  for (auto& t : message.bundle.tensors) {
    if (!t.defined()) continue;
    // The sender's stream made t. Read here on another stream (or copied from here, on the
    // current stream of t's device), t must not go back to the sender's stream for reuse
    // before that read is done.
    record_use_on_current_stream(t);
    if (t.device() != device) t = t.to(device, /*non_blocking=*/device.is_cuda());
  }
  return std::move(message.bundle);
}

void LocalTransport::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_) abort_reason_ = reason;
    aborted_ = true;
  }
  arrived_.notify_all();
}

void LocalTransport::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = false;
  abort_reason_.clear();
  mailboxes_.clear();
}

size_t LocalTransport::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return mailboxes_.size();
}

size_t LocalTransport::waiting_receivers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waiting_receivers_;
}

}  // namespace pipetrain
