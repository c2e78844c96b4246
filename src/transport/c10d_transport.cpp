// C10dTransport: bundles between pipeline stages in different processes, over Gloo/NCCL p2p.
//
// One bundle on the wire (tags from c10d_tag, all from the same src rank to the same dst rank):
//
//   sender                                          receiver
//   [1] isend header + data (256 + L(c) bytes) ---> recv into one flat buffer: the header (magic,
//                                                   micro-batch, metadata length, data bytes D,
//                                                   metadata inline), then the data; the tensors
//                                                   are views of it
//   [2] isend metadata (int64s)  ----------------> recv metadata, only when it does not fit inline
//   [3] isend data (D bytes), only when D != L(c) -> recv under kResizedData
//   [4] reaper thread waits the Works of [1..3] (keeps the buffers alive), in order; between
//       begin_sends() and end_sends() a completed bundle's buffers stay until release_sends()
//       covers it (its index since begin_sends() < n), so the bytes held follow the schedule
//
// The header travels with every bundle (no sender-side cache): the receiver may take micro-batches
// of one boundary in another order than they were sent, which would desynchronise a "metadata
// changed since the last message" cache. It rides in the data's message: one message per bundle
// in the steady state (two until 2026-11-24: a message costs a Gloo round of wake-ups on both
// sides, which dominated small micro-batches; docs/DISTRIBUTED.md).
//
// Sizes agreed in advance, per channel c = (src stage, dst stage, micro-batch, payload):
//
//   L(c) = data bytes of the previous bundle on c (0 before the first); both ends track it.
//   receiver, expect() or recv():  post recv(256 + L(c) bytes) under kHeader
//   sender, bundle of D bytes:     D == L(c): send header + data under kHeader
//                                  D != L(c): send header + L(c) filler bytes under kHeader, then
//                                             the data under kResizedData (if D > 0)
//   receiver, after the header:    D == L(c): the data follows the header in the same buffer;
//                                  else post and wait kResizedData. Both ends set L(c) = D.
//
// Message n on c is matched with receive n on c (one message per channel per step, and a rank
// posts step s+1's receives only after it took step s's), so both ends always agree on L(c).
#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>

#include "c10d_internal.h"
#include "pipetrain/base/check.h"
#include "pipetrain/base/message_of.h"
#include "pipetrain/stage/tensor_bytes.h"

namespace pipetrain {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kMagic = 0x5049504554524e31;  // "PIPETRN1"
constexpr int64_t kHeaderSlots = 32;
constexpr int64_t kHeaderBytes = kHeaderSlots * 8;  // a multiple of kAlignment: data follows
constexpr int64_t kHeaderFixed = 4;  // magic, microbatch, metadata length, data bytes
constexpr int64_t kInlineSlots = kHeaderSlots - kHeaderFixed;
constexpr int64_t kAlignment = 64;
constexpr int64_t kUndefined = -1;

int64_t align_up(int64_t n) {
  return (n + kAlignment - 1) / kAlignment * kAlignment;
}

// Byte offset of every tensor in the flat data buffer (-1: undefined or empty) and the total.
std::vector<int64_t> data_layout(const std::vector<torch::Tensor>& tensors, int64_t* total) {
  std::vector<int64_t> offsets;
  int64_t next = 0;
  for (const auto& t : tensors) {
    if (!t.defined() || t.numel() == 0) {
      offsets.push_back(-1);
      continue;
    }
    offsets.push_back(next);
    next = align_up(next + tensor_bytes(t));
  }
  *total = next;
  return offsets;
}

}  // namespace

int c10d_tag(const Envelope& envelope, MessagePart part) {
  PIPETRAIN_CHECK_INPUT(envelope.src_stage >= 0 && envelope.src_stage < kC10dMaxStages,
                        "src_stage ", envelope.src_stage, " does not fit the c10d tag (stages 0..",
                        kC10dMaxStages - 1, "); use fewer stages");
  PIPETRAIN_CHECK_INPUT(envelope.dst_stage >= 0 && envelope.dst_stage < kC10dMaxStages,
                        "dst_stage ", envelope.dst_stage, " does not fit the c10d tag (stages 0..",
                        kC10dMaxStages - 1, "); use fewer stages");
  PIPETRAIN_CHECK_INPUT(envelope.microbatch >= 0 && envelope.microbatch < kC10dMaxMicrobatches,
                        "micro-batch ", envelope.microbatch, " does not fit the c10d tag (0..",
                        kC10dMaxMicrobatches - 1, "); use fewer chunks");
  const int payload = envelope.payload == Payload::kGradient ? 1 : 0;
  return (payload << 29) | (static_cast<int>(part) << 27) | (envelope.src_stage << 20) |
         (envelope.dst_stage << 13) | envelope.microbatch;
}

std::vector<int64_t> encode_bundle_metadata(const Bundle& bundle) {
  PIPETRAIN_CHECK_INPUT(bundle.skip_names.size() <= bundle.tensors.size(), "bundle names ",
                        bundle.skip_names.size(), " skips but holds only ", bundle.tensors.size(),
                        " tensors");
  std::vector<int64_t> meta{static_cast<int64_t>(bundle.tensors.size()),
                            static_cast<int64_t>(bundle.skip_names.size())};
  for (const auto& t : bundle.tensors) {
    if (!t.defined()) {
      meta.push_back(kUndefined);
      continue;
    }
    PIPETRAIN_CHECK_INPUT(t.layout() == torch::kStrided,
                          "the c10d transport carries dense tensors only, got ", t.layout());
    meta.push_back(static_cast<int64_t>(t.scalar_type()));
    meta.push_back(t.dim());
    for (int64_t size : t.sizes()) meta.push_back(size);
  }
  for (const auto& name : bundle.skip_names) {
    meta.push_back(static_cast<int64_t>(name.size()));
    for (std::size_t at = 0; at < name.size(); at += 8) {
      int64_t word = 0;
      std::memcpy(&word, name.data() + at, std::min<std::size_t>(8, name.size() - at));
      meta.push_back(word);
    }
  }
  return meta;
}

Bundle decode_bundle_metadata(const std::vector<int64_t>& meta, const torch::Device& device) {
  std::size_t at = 0;
  auto next = [&]() -> int64_t {
    PIPETRAIN_CHECK(at < meta.size(), TransportFailure, "truncated bundle metadata (", meta.size(),
                    " values)");
    return meta[at++];
  };
  Bundle bundle;
  const int64_t n_tensors = next();
  const int64_t n_skips = next();
  PIPETRAIN_CHECK(n_tensors >= 0 && n_skips >= 0 && n_skips <= n_tensors, TransportFailure,
                  "corrupt bundle metadata: ", n_tensors, " tensors, ", n_skips, " skips");
  for (int64_t t = 0; t < n_tensors; ++t) {
    const int64_t dtype = next();
    if (dtype == kUndefined) {
      bundle.tensors.emplace_back();
      continue;
    }
    const int64_t dim = next();
    std::vector<int64_t> sizes;
    for (int64_t d = 0; d < dim; ++d) sizes.push_back(next());
    bundle.tensors.push_back(torch::empty(
        sizes, torch::TensorOptions().dtype(static_cast<torch::ScalarType>(dtype)).device(device)));
  }
  for (int64_t s = 0; s < n_skips; ++s) {
    const int64_t length = next();
    std::string name(static_cast<std::size_t>(length), '\0');
    for (int64_t done = 0; done < length; done += 8) {
      const int64_t word = next();
      std::memcpy(name.data() + done, &word,
                  static_cast<std::size_t>(std::min<int64_t>(8, length - done)));
    }
    bundle.skip_names.push_back(std::move(name));
  }
  PIPETRAIN_CHECK(at == meta.size(), TransportFailure, "bundle metadata has ", meta.size() - at,
                  " trailing values");
  return bundle;
}

// ---- the transport ----------------------------------------------------------------------------

struct C10dTransport::Impl {
  std::shared_ptr<C10dWorld> world;
  std::shared_ptr<C10dGroup> group;
  std::vector<int> stage_rank;
  C10dTransportOptions options;
  torch::Device wire_device = torch::kCPU;
  int listener = -1;

  struct PendingSend {
    c10::intrusive_ptr<detail::C10dWork> work;
    std::string what;
    int64_t bytes = 0;   // the message buffer, held until the send completes
    int64_t bundle = 0;  // which send() posted it, counted from 0 since construction
  };
  // A posted receive, not waited for yet.
  struct PostedRecv {
    c10::intrusive_ptr<detail::C10dWork> work;
    torch::Tensor buffer;
    int64_t id = 0;  // its key in `receiving`
  };
  // The receive of one bundle's header and L(c) data bytes, posted before its recv() (or by it).
  struct BundleRecvs {
    PostedRecv message;      // kHeaderBytes + data_bytes
    int64_t data_bytes = 0;  // L(c) when posted
    bool ahead = false;      // posted by expect()
  };
  using Channel = std::tuple<int, int, int, int>;  // src stage, dst stage, micro-batch, payload
  static Channel channel_of(const Envelope& e) {
    return {e.src_stage, e.dst_stage, e.microbatch, static_cast<int>(e.payload)};
  }

  std::mutex mutex;  // guards everything below
  std::condition_variable changed;
  bool aborted = false;
  std::string abort_reason;
  std::optional<std::string> send_error;
  ErrorKind send_error_kind = ErrorKind::TransportFailure;  // or Timeout
  std::map<int64_t, c10::intrusive_ptr<detail::C10dWork>> receiving;
  int64_t next_receive = 0;
  std::deque<PendingSend> sends;  // front: the one the reaper waits on
  int64_t next_bundle = 0;        // the index of the next send()
  // begin_sends() .. end_sends(): completed sends of bundles >= released_through are kept.
  bool holding = false;
  int64_t hold_from = 0;                      // next_bundle at begin_sends()
  int64_t released_through = 0;               // bundles below it may go
  std::deque<PendingSend> held;               // completed, kept until released (in bundle order)
  std::map<Channel, int64_t> sent_bytes;      // L(c) on the sending side
  std::map<Channel, int64_t> received_bytes;  // L(c) on the receiving side
  std::map<Channel, BundleRecvs> posted;      // by expect(), not yet taken by recv()
  C10dTransport::Stats stats;
  bool stopping = false;
  std::thread reaper;

  int my_rank() const { return world->rank(); }
  // The options' receive timeout, bounded by the world's.
  std::chrono::milliseconds receive_timeout() const {
    const std::chrono::milliseconds bound = world->timeout();
    return options.timeout.count() > 0 ? std::min(options.timeout, bound) : bound;
  }
  void abort_local(const std::string& reason);
  void check_healthy();
  // PeerFailed after an abort; the send's error after a failed send. REQUIRES: mutex held.
  void throw_if_failed() const;
  // Timeout when the wait for a peer ran out of time or the peer hung, else `otherwise`.
  ErrorKind failure_kind(const std::string& failure, ErrorKind otherwise) const;
  // For expect()/recv(): healthy, both stages exist, this rank runs the destination stage.
  // `verb` words the error ("expects", "receives"). Returns the source rank.
  int check_receiver(const Envelope& envelope, const char* verb);
  // An uninitialised buffer of `n` elements on the wire device.
  torch::Tensor wire_buffer(int64_t n, torch::ScalarType dtype) const {
    return torch::empty({n}, torch::TensorOptions().dtype(dtype).device(wire_device));
  }
  void reap();
  // Stats' buffer bytes and their peaks. REQUIRES: mutex held (the _locked ones).
  void hold_receive_locked(int64_t bytes) {
    stats.receive_buffer_bytes += bytes;
    stats.peak_receive_buffer_bytes =
        std::max(stats.peak_receive_buffer_bytes, stats.receive_buffer_bytes);
  }
  void release_receive(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    stats.receive_buffer_bytes -= bytes;
  }
  void hold_send_locked(int64_t bytes) {
    stats.send_buffer_bytes += bytes;
    stats.peak_send_buffer_bytes = std::max(stats.peak_send_buffer_bytes, stats.send_buffer_bytes);
  }
  void post_send(torch::Tensor tensor, int dst, int tag, std::string what, int64_t bundle);
  PostedRecv post_recv(torch::Tensor buffer, int src, int tag);
  void wait_recv(PostedRecv& posted, int src, const Envelope& envelope, const char* part);
  BundleRecvs post_bundle(const Envelope& envelope, int src);
  // The receives expect() posted for this channel, or new ones.
  BundleRecvs take_or_post_bundle(const Envelope& envelope, int src);
  // The bundle's metadata from the received header (and its overflow message when long).
  std::vector<int64_t> read_metadata(BundleRecvs& recvs, int src, const Envelope& envelope,
                                     int64_t* total_bytes);
  // The bundle's data bytes: inside the header's message when L(c) held, else one more message.
  torch::Tensor read_data(BundleRecvs& recvs, int src, const Envelope& envelope, int64_t total);
  // Tensors of `shapes` as views of `data` at `offsets`, on the transport's device.
  std::vector<torch::Tensor> tensors_of(const std::vector<torch::Tensor>& shapes,
                                        const std::vector<int64_t>& offsets,
                                        const torch::Tensor& data) const;
};

void C10dTransport::Impl::abort_local(const std::string& reason) {
  std::vector<c10::intrusive_ptr<detail::C10dWork>> to_abort;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (aborted) return;
    aborted = true;
    abort_reason = reason;
    for (auto& [id, work] : receiving) to_abort.push_back(work);
    for (auto& send : sends) to_abort.push_back(send.work);
  }
  changed.notify_all();
  // Gloo's SendWork/RecvWork::abort wakes a blocked wait(), which then returns false.
  for (auto& work : to_abort) {
    try {
      work->abort();
    } catch (...) {
      // A backend without abort(): the waiter is bounded by the group timeout instead.
    }
  }
}

void C10dTransport::Impl::check_healthy() {
  std::lock_guard<std::mutex> lock(mutex);
  throw_if_failed();
}

void C10dTransport::Impl::throw_if_failed() const {
  PIPETRAIN_CHECK_AT(!aborted, PeerFailed, (ErrorSite{my_rank(), -1, "", -1}),
                     "transport aborted: ", abort_reason);
  if (send_error) throw_error(send_error_kind, *send_error);
}

ErrorKind C10dTransport::Impl::failure_kind(const std::string& failure, ErrorKind otherwise) const {
  // Gloo words an expired wait "Timed out waiting 3000ms for recv operation to complete"; the
  // watchdog aborts the job when a peer sent no heartbeat for the timeout (a hung rank).
  if (failure.find("imed out") != std::string::npos || world->abort_was_timeout()) {
    return ErrorKind::Timeout;
  }
  return otherwise;
}

void C10dTransport::Impl::reap() {
  while (true) {
    PendingSend send;
    {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait(lock, [&] { return stopping || !sends.empty(); });
      if (sends.empty()) return;
      send = sends.front();
    }
    std::optional<std::string> error;
    ErrorKind kind = ErrorKind::TransportFailure;
    try {
      detail::wait_work(send.work, send.what);
    } catch (const Error& e) {
      error = e.what();
      kind = e.kind();
    } catch (const std::exception& e) {
      error = message_of(e);
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      PendingSend done = std::move(sends.front());
      sends.pop_front();
      if (holding && !error && done.bundle >= released_through && done.bundle >= hold_from) {
        held.push_back(std::move(done));  // not released yet (release_sends)
      } else {
        stats.send_buffer_bytes -= done.bytes;
      }
      if (error && !aborted && !send_error) {
        send_error = *error;
        send_error_kind = kind;
      }
    }
    changed.notify_all();
  }
}

void C10dTransport::Impl::post_send(torch::Tensor tensor, int dst, int tag, std::string what,
                                    int64_t bundle) {
  const int64_t bytes = static_cast<int64_t>(tensor.nbytes());
  std::vector<at::Tensor> one{std::move(tensor)};
  auto work = group->impl().backend->send(one, dst, tag);
  {
    std::lock_guard<std::mutex> lock(mutex);
    sends.push_back({work, std::move(what), bytes, bundle});
    hold_send_locked(bytes);
    if (aborted) work->abort();
  }
  changed.notify_all();
}

C10dTransport::Impl::PostedRecv C10dTransport::Impl::post_recv(torch::Tensor buffer, int src,
                                                               int tag) {
  std::vector<at::Tensor> one{buffer};
  PostedRecv posted;
  posted.work = group->impl().backend->recv(one, src, tag);
  posted.buffer = std::move(buffer);
  std::lock_guard<std::mutex> lock(mutex);
  hold_receive_locked(static_cast<int64_t>(posted.buffer.nbytes()));
  posted.id = next_receive++;
  receiving[posted.id] = posted.work;
  if (aborted) posted.work->abort();
  return posted;
}

void C10dTransport::Impl::wait_recv(PostedRecv& posted, int src, const Envelope& envelope,
                                    const char* part) {
  const auto start = Clock::now();
  bool completed = false;
  std::string failure;
  const std::chrono::milliseconds timeout = receive_timeout();
  try {
    completed = posted.work->wait(timeout);
  } catch (const std::exception& e) {
    failure = message_of(e);
  }
  // A peer that failed publishes its reason just before it exits; its closed connection can
  // reach us first. Prefer the reason to "connection closed".
  std::optional<std::string> published;
  if (!completed || !failure.empty())
    published = world->await_abort_reason(std::chrono::seconds(1));
  std::lock_guard<std::mutex> lock(mutex);
  receiving.erase(posted.id);
  // This rank, and the stage and micro-batch it receives for; the message names the peer `src`.
  const ErrorSite site{my_rank(), envelope.dst_stage, "", envelope.microbatch};
  if (aborted) {
    throw_error(failure_kind(failure, ErrorKind::PeerFailed),
                c10::str("receiving the ", describe(envelope), " was aborted: ", abort_reason),
                site);
  }
  if (published) {
    throw_error(failure_kind(failure, ErrorKind::PeerFailed),
                c10::str("receiving the ", describe(envelope), " was aborted: ", *published, " (",
                         failure, ")"),
                site);
  }
  if (completed && failure.empty()) return;
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  throw_error(failure_kind(failure, ErrorKind::TransportFailure),
              c10::str("no ", describe(envelope), " (", part, ") from rank ", src, " after ",
                       waited, " s (timeout ", timeout.count() / 1000.0,
                       " s): ", failure.empty() ? "aborted" : failure, ". Rank ", src, " (stage ",
                       envelope.src_stage,
                       ") may have died or hang: see its log; raise --timeout if it is only slow"),
              site);
}

C10dTransport::Impl::BundleRecvs C10dTransport::Impl::post_bundle(const Envelope& envelope,
                                                                  int src) {
  BundleRecvs recvs;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto known = received_bytes.find(channel_of(envelope));
    recvs.data_bytes = known == received_bytes.end() ? 0 : known->second;
  }
  recvs.message = post_recv(wire_buffer(kHeaderBytes + recvs.data_bytes, torch::kUInt8), src,
                            c10d_tag(envelope, MessagePart::kHeader));
  return recvs;
}

C10dTransport::C10dTransport(std::shared_ptr<C10dWorld> world, std::vector<int> stage_world_rank,
                             C10dTransportOptions options)
    : impl_(std::make_unique<Impl>()) {
  PIPETRAIN_CHECK_INPUT(world, "C10dTransport needs a connected C10dWorld");
  PIPETRAIN_CHECK_INPUT(static_cast<int>(stage_world_rank.size()) <= kC10dMaxStages,
                        "C10dTransport: ", stage_world_rank.size(),
                        " stages exceed the tag space (", kC10dMaxStages, ")");
  for (std::size_t j = 0; j < stage_world_rank.size(); ++j) {
    PIPETRAIN_CHECK_INPUT(stage_world_rank[j] >= 0 && stage_world_rank[j] < world->world_size(),
                          "stage ", j, " is placed on rank ", stage_world_rank[j],
                          " outside the world 0..", world->world_size() - 1);
  }
  impl_->world = world;
  impl_->group = world->world_group();
  impl_->stage_rank = std::move(stage_world_rank);
  impl_->options = options;
  impl_->wire_device =
      world->backend() == CommBackend::kGloo ? torch::Device(torch::kCPU) : options.device;
  Impl* raw = impl_.get();
  impl_->reaper = std::thread([raw] { raw->reap(); });
  impl_->listener =
      world->add_abort_listener([raw](const std::string& reason) { raw->abort_local(reason); });
}

C10dTransport::~C10dTransport() {
  impl_->world->remove_abort_listener(impl_->listener);
  {
    std::unique_lock<std::mutex> lock(impl_->mutex);
    // Healthy: let the receivers take what we sent (bounded by the group timeout in the reaper).
    impl_->stopping = true;
  }
  impl_->changed.notify_all();
  impl_->reaper.join();
}

namespace {
// Both ends of a message must name existing stages; `verb` says which end is checking.
void check_stages_exist(const Envelope& envelope, int me, const char* verb, std::size_t stages) {
  PIPETRAIN_CHECK_INPUT(envelope.src_stage >= 0 && envelope.src_stage < static_cast<int>(stages) &&
                            envelope.dst_stage >= 0 &&
                            envelope.dst_stage < static_cast<int>(stages),
                        "rank ", me, ": ", verb, " of the ", describe(envelope),
                        ": no such stage (", stages, " stages)");
}
}  // namespace

void C10dTransport::send(const Envelope& envelope, Bundle bundle) {
  impl_->check_healthy();
  const int me = impl_->my_rank();
  check_stages_exist(envelope, me, "send", impl_->stage_rank.size());
  PIPETRAIN_CHECK_INPUT(impl_->stage_rank[envelope.src_stage] == me, "rank ", me, " sends the ",
                        describe(envelope), " but stage ", envelope.src_stage, " runs on rank ",
                        impl_->stage_rank[envelope.src_stage]);
  const int dst = impl_->stage_rank[envelope.dst_stage];
  const std::string what = "rank " + std::to_string(me) + ": send of the " + describe(envelope) +
                           " to rank " + std::to_string(dst);

  torch::NoGradGuard no_grad;
  const std::vector<int64_t> meta = encode_bundle_metadata(bundle);
  int64_t total = 0;
  const std::vector<int64_t> offsets = data_layout(bundle.tensors, &total);
  auto header = torch::zeros({kHeaderSlots}, torch::kLong);
  auto* h = header.data_ptr<int64_t>();
  h[0] = kMagic;
  h[1] = envelope.microbatch;
  h[2] = static_cast<int64_t>(meta.size());
  h[3] = total;
  const bool inline_meta = static_cast<int64_t>(meta.size()) <= kInlineSlots;
  if (inline_meta) std::copy(meta.begin(), meta.end(), h + kHeaderFixed);

  int64_t agreed = 0;  // L(c)
  int64_t bundle_index = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    bundle_index = impl_->next_bundle++;
    auto& last = impl_->sent_bytes[Impl::channel_of(envelope)];
    agreed = last;
    last = total;
    ++impl_->stats.bundles_sent;
    impl_->stats.data_bytes_sent += total;
    if (total != agreed) ++impl_->stats.resized_sent;
  }

  // Packs the bundle's tensors at `at` (total bytes, the offsets above) on the wire device.
  auto pack = [&](torch::Tensor at) {
    auto* base = static_cast<uint8_t*>(at.data_ptr());
    for (std::size_t t = 0; t < bundle.tensors.size(); ++t) {
      if (offsets[t] < 0) continue;
      const auto& source = bundle.tensors[t];
      torch::from_blob(base + offsets[t], source.sizes(),
                       source.options().device(impl_->wire_device).requires_grad(false))
          .copy_(source.detach());
    }
  };
  // [1] The header, then the agreed L(c) bytes: the data when its size is still L(c), else filler
  // whose contents the receiver ignores.
  torch::Tensor message = impl_->wire_buffer(kHeaderBytes + agreed, torch::kUInt8);
  message.narrow(0, 0, kHeaderBytes).copy_(header.view(torch::kUInt8).to(impl_->wire_device));
  if (total == agreed && total > 0) pack(message.narrow(0, kHeaderBytes, total));
  impl_->post_send(message, dst, c10d_tag(envelope, MessagePart::kHeader),
                   what + " (header and data)", bundle_index);
  // [2]
  if (!inline_meta) {
    auto overflow = torch::tensor(meta, torch::kLong).to(impl_->wire_device);
    impl_->post_send(overflow, dst, c10d_tag(envelope, MessagePart::kMetadata),
                     what + " (metadata)", bundle_index);
  }
  // [3]
  if (total == agreed || total == 0) return;
  torch::Tensor data = impl_->wire_buffer(total, torch::kUInt8);
  pack(data);
  impl_->post_send(data, dst, c10d_tag(envelope, MessagePart::kResizedData), what + " (data)",
                   bundle_index);
}

int C10dTransport::Impl::check_receiver(const Envelope& envelope, const char* verb) {
  check_healthy();
  const int me = my_rank();
  check_stages_exist(envelope, me, "receive", stage_rank.size());
  PIPETRAIN_CHECK_INPUT(stage_rank[envelope.dst_stage] == me, "rank ", me, " ", verb, " the ",
                        describe(envelope), " but stage ", envelope.dst_stage, " runs on rank ",
                        stage_rank[envelope.dst_stage]);
  return stage_rank[envelope.src_stage];
}

void C10dTransport::expect(const Envelope& envelope) {
  const int src = impl_->check_receiver(envelope, "expects");
  const Impl::Channel channel = Impl::channel_of(envelope);
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->posted.count(channel)) return;
  }
  Impl::BundleRecvs recvs = impl_->post_bundle(envelope, src);
  recvs.ahead = true;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->posted.emplace(channel, std::move(recvs));
}

C10dTransport::Impl::BundleRecvs C10dTransport::Impl::take_or_post_bundle(const Envelope& envelope,
                                                                          int src) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto found = posted.find(channel_of(envelope));
    if (found != posted.end()) {
      BundleRecvs ahead = std::move(found->second);
      posted.erase(found);
      return ahead;
    }
  }
  return post_bundle(envelope, src);
}

std::vector<int64_t> C10dTransport::Impl::read_metadata(BundleRecvs& recvs, int src,
                                                        const Envelope& envelope,
                                                        int64_t* total_bytes) {
  wait_recv(recvs.message, src, envelope, "header and data");
  const torch::Tensor header =
      recvs.message.buffer.narrow(0, 0, kHeaderBytes).cpu().view(torch::kLong);
  const auto* h = header.data_ptr<int64_t>();
  const ErrorSite site{my_rank(), envelope.dst_stage, "", envelope.microbatch};
  PIPETRAIN_CHECK_AT(h[0] == kMagic && h[1] == envelope.microbatch, TransportFailure, site,
                     "corrupt header for the ", describe(envelope), " from rank ", src, " (magic ",
                     h[0], ", micro-batch ", h[1],
                     "): both ranks must run the same pipetrain build");
  const int64_t length = h[2];
  *total_bytes = h[3];
  if (length <= kInlineSlots) return {h + kHeaderFixed, h + kHeaderFixed + length};
  auto overflow =
      post_recv(wire_buffer(length, torch::kLong), src, c10d_tag(envelope, MessagePart::kMetadata));
  wait_recv(overflow, src, envelope, "metadata");
  const torch::Tensor values = overflow.buffer.cpu();
  release_receive(static_cast<int64_t>(overflow.buffer.nbytes()));
  return {values.data_ptr<int64_t>(), values.data_ptr<int64_t>() + length};
}

torch::Tensor C10dTransport::Impl::read_data(BundleRecvs& recvs, int src, const Envelope& envelope,
                                             int64_t total) {
  if (total == 0) return torch::Tensor();
  if (total == recvs.data_bytes) return recvs.message.buffer.narrow(0, kHeaderBytes, total);
  auto resized = post_recv(wire_buffer(total, torch::kUInt8), src,
                           c10d_tag(envelope, MessagePart::kResizedData));
  wait_recv(resized, src, envelope, "data");
  return resized.buffer;
}

std::vector<torch::Tensor> C10dTransport::Impl::tensors_of(const std::vector<torch::Tensor>& shapes,
                                                           const std::vector<int64_t>& offsets,
                                                           const torch::Tensor& data) const {
  std::vector<torch::Tensor> tensors;
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    const auto& shape = shapes[t];
    if (!shape.defined()) {
      tensors.emplace_back();
      continue;
    }
    auto tensor_options = torch::TensorOptions().dtype(shape.scalar_type()).device(wire_device);
    torch::Tensor tensor;
    if (offsets[t] < 0) {
      tensor = torch::empty(shape.sizes(), tensor_options);
    } else {
      // A view of the flat buffer; the deleter keeps the buffer alive as long as any view.
      auto* base = static_cast<uint8_t*>(data.data_ptr()) + offsets[t];
      tensor = torch::from_blob(
          base, shape.sizes(), [keep = data](void*) {}, tensor_options);
    }
    if (tensor.device() != options.device) tensor = tensor.to(options.device);
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

Bundle C10dTransport::recv(const Envelope& envelope) {
  const int src = impl_->check_receiver(envelope, "receives");
  Impl::BundleRecvs recvs = impl_->take_or_post_bundle(envelope, src);
  int64_t total = 0;
  const std::vector<int64_t> meta = impl_->read_metadata(recvs, src, envelope, &total);
  // Shapes only: the tensors are replaced by views of the received buffer below.
  Bundle shapes = decode_bundle_metadata(meta, torch::Device(torch::kMeta));
  int64_t expected = 0;
  const std::vector<int64_t> offsets = data_layout(shapes.tensors, &expected);
  PIPETRAIN_CHECK_AT(expected == total, TransportFailure,
                     (ErrorSite{impl_->my_rank(), envelope.dst_stage, "", envelope.microbatch}),
                     "the ", describe(envelope), " announces ", total,
                     " bytes but its metadata describes ", expected);
  const torch::Tensor data = impl_->read_data(recvs, src, envelope, total);
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    // The buffers now belong to the bundle's tensors (views of them), not to the transport.
    const bool resized = total > 0 && total != recvs.data_bytes;
    impl_->stats.receive_buffer_bytes -=
        static_cast<int64_t>(recvs.message.buffer.nbytes()) + (resized ? total : 0);
    impl_->received_bytes[Impl::channel_of(envelope)] = total;
    ++impl_->stats.bundles_received;
    if (recvs.ahead) ++impl_->stats.received_expected;
  }
  Bundle bundle;
  bundle.skip_names = std::move(shapes.skip_names);
  bundle.tensors = impl_->tensors_of(shapes.tensors, offsets, data);
  return bundle;
}

C10dTransport::Stats C10dTransport::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->stats;
}

void C10dTransport::reset_peak_buffer_bytes() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->stats.peak_receive_buffer_bytes = impl_->stats.receive_buffer_bytes;
  impl_->stats.peak_send_buffer_bytes = impl_->stats.send_buffer_bytes;
}

void C10dTransport::abort(const std::string& reason) {
  impl_->abort_local("rank " + std::to_string(impl_->my_rank()) + ": " + reason);
  impl_->world->abort(reason);
}

void C10dTransport::reset() {
  // Healthy: nothing to clear (every message of a finished step has been received). Aborted: stay
  // aborted; a Gloo group may hold half-delivered messages, so only a restart is clean.
}

void C10dTransport::begin_sends() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->holding = true;
  impl_->hold_from = impl_->next_bundle;
  impl_->released_through = impl_->hold_from;
}

void C10dTransport::release_sends(int64_t n) {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  Impl& d = *impl_;
  const int64_t target = d.hold_from + n;
  if (!d.holding || target <= d.released_through) return;
  PIPETRAIN_CHECK_INPUT(target <= d.next_bundle, "rank ", d.my_rank(), ": release_sends(", n,
                        ") but only ", d.next_bundle - d.hold_from,
                        " bundles were sent since begin_sends()");
  d.released_through = target;
  // Proven received: complete or about to be. Beyond the send window: their receivers take them
  // without waiting for us (schedule::released_sends ran the lists with the window).
  const std::chrono::milliseconds timeout = d.receive_timeout();
  const bool seen = d.changed.wait_for(lock, timeout, [&] {
    return d.aborted || d.send_error || d.sends.empty() || d.sends.front().bundle >= target;
  });
  d.throw_if_failed();
  if (!seen) {
    throw_error(
        ErrorKind::Timeout,
        c10::str("rank ", d.my_rank(), ": the first ", n,
                 " sends of the step did not complete within ", timeout.count() / 1000.0,
                 " s (its receiver has not taken it); first pending: ", d.sends.front().what),
        ErrorSite{d.my_rank(), -1, "", -1});
  }
  while (!d.held.empty() && d.held.front().bundle < target) {
    d.stats.send_buffer_bytes -= d.held.front().bytes;
    d.held.pop_front();
  }
}

void C10dTransport::end_sends() noexcept {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->holding = false;
  for (const auto& send : impl_->held) impl_->stats.send_buffer_bytes -= send.bytes;
  impl_->held.clear();
}

void C10dTransport::flush() {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  impl_->changed.wait(lock, [&] { return impl_->sends.empty() || impl_->aborted; });
  impl_->throw_if_failed();
}

}  // namespace pipetrain
