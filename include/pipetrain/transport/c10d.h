// c10d: every call into PyTorch's distributed library (c10d) lives behind this header and in
// src/transport/c10d*.cpp. Nothing else in pipetrain includes a c10d header (nor the Gloo headers
// ProcessGroupGloo.hpp needs), so a change of LibTorch's c10d API is met in one place.
//
// Three types:
//   C10dWorld      the rendezvous (a TCPStore hosted by rank 0), the world process group, and the
//                  abort channel every rank watches (a store key plus heartbeats).
//   C10dGroup      a process group over a subset of the world's ranks (data-parallel replicas of
//                  one stage, the holders of a tied weight): blocking, bounded collectives.
//   C10dTransport  the Transport (transport.h) between pipeline stages in different processes.
//
// Message tags (docs/DISTRIBUTED.md, "Tags"): a transport message is identified by
// (payload, src_stage, dst_stage, microbatch, part) packed into the 30 low bits of a Gloo tag;
// tags >= 2^30 are reserved for control messages (parameter gathering). Gloo matches a receive
// by (source rank, tag), so distinct envelopes never collide; the bit widths bound the number of
// stages (128) and micro-batches (8192) and are checked with errors naming the limit.
//
// What crosses a boundary (docs/DISTRIBUTED.md, "Metadata"): every bundle is sent as
//   [header]  fixed 32 x int64: magic, micro-batch, metadata length, data bytes, inline metadata
//   [meta]    only when the metadata does not fit inline (many tensors or long skip names)
//   [data]    one flat byte buffer holding every defined tensor, 64-byte aligned
// The header is sent with every bundle: a shape, dtype or skip-name change is therefore always
// seen by the receiver, and out-of-order receives across micro-batches stay correct.
//
// Receives posted ahead (Transport::expect, docs/DISTRIBUTED.md "Posting receives early"): Gloo
// moves a message's data only once both ends have posted it; a send whose receive is not posted
// yet is finished later by the sender's network thread, which on a busy CPU waits for a time
// slice (measured: 2 to 8 ms per message on 2 cores). So the receiver posts header AND data
// receives ahead of need, and both ends must agree on the data size before the header is read:
// the size of message n on a channel (src stage, dst stage, micro-batch, payload) is the size of
// message n-1 on that channel (0 for the first). When a bundle's size differs, the sender sends
// that many filler bytes under the data tag and the real data under the "resized" tag, which the
// receiver posts after reading the header: a changed shape costs one extra round trip, never a
// mis-received message.
//
// Ownership: C10dWorld is shared (std::shared_ptr) by the groups and transports made from it and
// outlives them. Thread-safety: C10dTransport's send/recv/abort may be called from any thread.
// C10dGroup collectives must be called in the same order by every member (c10d's rule) and from
// one thread at a time per group. C10dWorld::abort may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "pipetrain/transport/transport.h"

namespace pipetrain {

// Which c10d process-group implementation carries the messages.
enum class CommBackend { kGloo, kNccl, kMpi };

// "gloo", "nccl", "mpi".
std::string comm_backend_name(CommBackend backend);
// Parses "gloo" | "nccl" | "mpi"; throws pipetrain::BadInput listing the valid names.
CommBackend parse_comm_backend(const std::string& name);
// Gloo for CPU stages, NCCL for CUDA stages.
CommBackend comm_backend_for_device(const torch::Device& device);

// True when this build, on this machine, can create `backend` process groups: NCCL needs a CUDA
// build (the *_cuda.cpp / *_nocuda.cpp seam) and a visible CUDA device; MPI needs a LibTorch
// built with MPI, which PyPI's is not.
bool comm_backend_available(CommBackend backend);
// Why `backend` is not available ("" when it is), e.g. "NCCL needs a CUDA device and this
// machine has none visible".
std::string comm_backend_unavailable_reason(CommBackend backend);

struct RendezvousOptions {
  std::string master_addr;  // MASTER_ADDR: host of rank 0, which runs the TCPStore server
  int master_port = 0;      // MASTER_PORT
  int rank = 0;             // RANK, 0 .. world_size-1
  int world_size = 1;       // WORLD_SIZE
  // Bound on every wait: rendezvous, each receive, each collective, heartbeats of dead peers.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
  CommBackend backend = CommBackend::kGloo;
  // Attempts of this job before this one (DistributedEnvironment::restart_count). Above 0 the
  // world's keys go under a prefix of their own: a store that outlives the ranks (torchrun's
  // agent's) still holds the last attempt's.
  int attempt = 0;
  // The CUDA device index this rank's NCCL communicator runs on (backend kNccl); -1: none. NCCL
  // refuses two ranks of one communicator on one GPU ("Duplicate GPU detected", at the first
  // send), so the rendezvous compares every rank's (host, device) and fails with BadInput, naming
  // both ranks, before any communicator exists.
  int cuda_device = -1;
  // Rank 0: a socket already listening on master_port that the store's server takes over (and
  // closes with it); -1: the server binds master_port itself.
  int listen_socket = -1;
  // Ranks on each host, hosts holding consecutive ranks (torchrun's LOCAL_WORLD_SIZE): what the
  // groups count as traffic within a host and between hosts (C10dGroup::traffic). 0: one host.
  int ranks_per_host = 0;
};

// Where rank r's NCCL communicator runs, as the rendezvous compares them: "host cuda:i".
std::string gpu_placement(const std::string& host, int cuda_device);
// "" when every placement (placements[r] is rank r's, from gpu_placement) differs; otherwise why
// NCCL cannot run: the first two ranks sharing a GPU and what to do instead.
std::string shared_gpu_conflict(const std::vector<std::string>& placements);

class C10dGroup;

// What a member's collectives have sent (C10dGroup::traffic), counted when each is posted, as a
// ring sends them: each member to the next in rank order (the last to the first), an all-reduce
// of B bytes 2 (n - 1) B / n, a reduce-scatter of a flat B (n - 1) B / n, an all-gather of a
// shard b (n - 1) b, a broadcast B from every member but the root's predecessor. Split by whether
// the next member is on this member's host (RendezvousOptions::ranks_per_host). Barriers and
// gathers of bytes are not counted. The count of a model: Gloo picks its own algorithms, whose
// bytes may differ. An all-to-all of B bytes is no ring: each member sends B / n to each other
// member, counted within or between hosts by that member's host.
enum class TrafficKind { kAllReduce, kBroadcast, kReduceScatter, kAllGather, kAllToAll };
constexpr int kTrafficKinds = 5;
const char* to_string(TrafficKind kind);  // "all-reduce", ..., "all-to-all"
struct CollectiveTraffic {
  std::int64_t within_host = 0;
  std::int64_t between_hosts = 0;
};

// While one lives, the collectives its thread posts (on any group of the world) are counted under
// `label` too (C10dWorld::labelled_traffic): what ZeRO's forward gathers, backward gathers and
// gradients send, apart. Labels nest: the innermost counts. Not copyable; destroy on the thread
// that made it.
class TrafficLabel {
 public:
  explicit TrafficLabel(std::string label);
  ~TrafficLabel();
  TrafficLabel(const TrafficLabel&) = delete;
  TrafficLabel& operator=(const TrafficLabel&) = delete;

 private:
  std::string previous_;
};

// The world: store, world group, abort channel and heartbeat watchdog of one process.
class C10dWorld {
 public:
  // Connects to (rank 0: starts) the TCPStore at master_addr:master_port, waits until all
  // world_size ranks have arrived, then creates the world process group.
  // Throws pipetrain::BadInput on: invalid options; an unavailable backend; rank 0 unable to
  // start the store on MASTER_PORT; a rank that started twice; ranks disagreeing on WORLD_SIZE;
  // more processes than WORLD_SIZE. Throws pipetrain::Timeout (site: this rank) when the store is
  // not reachable within the timeout or ranks are missing after it (the message lists them:
  // "missing ranks: 2"). Creating a process group that fails: Timeout or TransportFailure.
  // Sets SIGPIPE to SIG_IGN where it has its default action (a handler of the program's is kept):
  // a write to a killed peer then fails with EPIPE, naming the peer, instead of ending the
  // process without a word.
  static std::shared_ptr<C10dWorld> connect(const RendezvousOptions& options);

  ~C10dWorld();
  C10dWorld(const C10dWorld&) = delete;
  C10dWorld& operator=(const C10dWorld&) = delete;

  int rank() const;
  int world_size() const;
  std::chrono::milliseconds timeout() const;
  CommBackend backend() const;
  const RendezvousOptions& options() const;
  // Whether every group checks the order of its collectives before posting them
  // (TORCH_DISTRIBUTED_DEBUG=DETAIL when connect() ran; C10dGroup below).
  bool checks_collectives() const;

  // The group of all ranks.
  std::shared_ptr<C10dGroup> world_group();
  // C10dGroup::traffic summed over every group this process made (those gone included).
  CollectiveTraffic traffic(TrafficKind collective) const;
  // The same by TrafficLabel (every kind together), over every group of the world.
  std::map<std::string, CollectiveTraffic> labelled_traffic() const;
  // A group over `ranks` (world ranks, ascending, containing this rank), named `name`, which must
  // be the same on every member and unique in the job. Only the members call it.
  // REQUIRES: rank() is in `ranks`.
  std::shared_ptr<C10dGroup> new_group(const std::string& name, std::vector<int> ranks);

  // Publishes an abort: the first reason published wins ("rank r: reason"); every rank's watchdog
  // sees it within about 100 ms and runs its abort listeners. Never throws.
  void abort(const std::string& reason);
  // The published abort reason, if any rank aborted or the watchdog declared a peer dead.
  std::optional<std::string> abort_reason() const;
  // True when this rank's watchdog raised the abort because a peer sent no heartbeat for the
  // timeout (it hangs or was killed): a transport then reports a Timeout rather than PeerFailed.
  bool abort_was_timeout() const;
  // The abort reason, reading the store for at most `max` if none is known yet: a receive that
  // failed because its peer vanished asks whether the peer published why. Never throws.
  std::optional<std::string> await_abort_reason(std::chrono::milliseconds max);
  // Runs `listener(reason)` once, from the watchdog thread or from abort(), when an abort is seen.
  // Listeners must be quick and must not throw. Returns an id for remove_abort_listener.
  int add_abort_listener(std::function<void(const std::string&)> listener);
  // After it returns the listener is not running and will not run: what it reads may be freed.
  // (Called from inside a listener it does not wait for the listeners being run.)
  void remove_abort_listener(int id);

  // Rank 0 hosts the store: after an abort it waits (at most `max`) until every other rank has
  // read the reason, so they report it rather than "lost the store". Other ranks return at once.
  void linger_until_abort_seen(std::chrono::milliseconds max);

  // Clean shutdown: this rank says it is finished (its heartbeat may stop without alarm). Rank 0,
  // which hosts the store, waits (bounded by the timeout) for every rank to finish so that no rank
  // loses the store while it still needs it. Idempotent.
  void finalize();

  struct Impl;

 private:
  explicit C10dWorld(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class C10dGroup;
  friend class C10dTransport;
};

// A process group over some ranks of the world. Collectives are blocking; Gloo bounds them by the
// world's timeout. A rank-local index: group rank g is world rank ranks()[g].
//
// Every member must post a group's collectives in one order; threads of one process that post to
// the same group must be ordered by their caller (ZeRO's communication thread is drained before
// the training loop posts: train/sharded_optimizer.h, post_started_collectives). Under
// TORCH_DISTRIBUTED_DEBUG=DETAIL (read when the world connects; torch's switch for its own such
// check) each collective is checked before it is posted: the members all-gather its fingerprint
// (kind, dtype, elements, root, how many the group checked before it; gather_bytes: kind and root)
// over a Gloo group of their own, and a difference throws pipetrain::Error (Runtime) on every
// member, naming its collective and one that differs ("collective mismatch over group 'dp/0': group
// rank 0 (rank 0) posts all-reduce of 52 Float as its collective 7, group rank 1 (rank 2) posts
// reduce-scatter of 9336 Float ..."), where Gloo would abort the process or hang. Nothing is posted
// then, and the group goes on working. Each check is one more small collective: for debugging.
class C10dGroup {
 public:
  int rank() const;  // this process's index within the group
  int size() const;
  const std::vector<int>& ranks() const;  // world ranks of the members, ascending
  const std::string& name() const;
  // Where a tensor of data on `device` is best summed: there for an NCCL group (its collectives
  // take the GPU's tensors; CPU tensors go to its Gloo twin), on the CPU otherwise (Gloo).
  torch::Device collective_device(const torch::Device& device) const;

  // In-place sum over the members. Tensors on the group's device; dense; any float dtype.
  void allreduce_sum(std::vector<torch::Tensor>& tensors);
  // The same, started: returns at once, and the returned function waits until the sums are in
  // the tensors (throwing what allreduce_sum throws). The tensors must stay alive and untouched
  // until then. Members start their collectives on a group in the same order.
  std::function<void()> allreduce_sum_start(std::vector<torch::Tensor>& tensors);
  // In place: every member receives root's tensors. `root` is a group rank.
  void broadcast(std::vector<torch::Tensor>& tensors, int root);
  void barrier();
  // ZeRO's pair. reduce_scatter_sum: `shard` (n elements) receives member rank()'s n-element
  // slice of the sum over members of `flat` (size() * n elements). all_gather: `flat` (size() * n
  // elements) receives every member's `shard`, member g's at [g * n, (g + 1) * n). Contiguous
  // tensors of one dtype on the group's device; throws BadInput naming the sizes otherwise.
  void reduce_scatter_sum(const torch::Tensor& flat, torch::Tensor& shard);
  // The same, started: the returned function waits until `shard` holds the sum (both tensors
  // must stay alive and untouched until then).
  std::function<void()> reduce_scatter_sum_start(const torch::Tensor& flat, torch::Tensor& shard);
  void all_gather(const torch::Tensor& shard, torch::Tensor& flat);
  // The same, started: the returned function waits until `flat` holds every shard (both tensors
  // must stay alive, and `shard` untouched, until then).
  std::function<void()> all_gather_start(const torch::Tensor& shard, torch::Tensor& flat);
  // `input` and `output` (contiguous, one dtype, size() x n elements each): member g's slice
  // [g * n, (g + 1) * n) of `input` goes to member g, whose `output` receives it at
  // [rank() * n, ...). ZeRO++'s quantized gradients pass through two of them.
  void all_to_all(const torch::Tensor& input, torch::Tensor& output);
  // Slices of their own sizes along dimension 0 (expert parallelism's token rows): the first
  // send[0] rows of `input` go to member 0, the next send[1] to member 1, ...; `output` receives
  // receive[g] rows from member g, in member order. Both contiguous, one dtype, the same size
  // beyond dimension 0, their row counts the sums of `send` and `receive` (size() entries each;
  // what a member sends another is what that one expects: the caller exchanges the counts).
  void all_to_all(const torch::Tensor& input, const std::vector<int64_t>& send,
                  torch::Tensor& output, const std::vector<int64_t>& receive);
  // The same, started: the returned function waits until `output` holds the rows (both tensors
  // must stay alive, and `input` untouched, until then).
  std::function<void()> all_to_all_start(const torch::Tensor& input,
                                         const std::vector<int64_t>& send, torch::Tensor& output,
                                         const std::vector<int64_t>& receive);
  // Byte blobs gathered to group rank 0 (empty vector on others); result[g] is member g's blob.
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine);

  // What this member's collectives on the group have sent so far (CollectiveTraffic, above).
  using Collective = TrafficKind;
  using Traffic = CollectiveTraffic;
  Traffic traffic(Collective collective) const;

  // A group of `size` members in this one process, as member `rank`, whose every other member
  // holds what this one holds: all_gather repeats the shard, allreduce_sum multiplies by size,
  // reduce_scatter_sum keeps `size` x this member's slice, broadcast and barrier do nothing,
  // gather_bytes repeats `mine`, all_to_all of equal slices gives this member's slice for itself
  // from every member, of slices of their own sizes gives member g's rows as this member's rows
  // for g, cut or padded with zeros to the count (shapes only). Nothing is sent. It gives a single
  // process the shapes and allocations of one member of a real group (the memory model profiles a
  // tensor-parallel rank's layers with it: train/memory_report.h); the values are those of a group
  // of identical members. REQUIRES: 0 <= rank < size (BadInput otherwise).
  static std::shared_ptr<C10dGroup> mirror(int size, int rank = 0);
  bool is_mirror() const;

  struct Impl;  // src/transport/c10d_internal.h
  explicit C10dGroup(std::shared_ptr<Impl> impl);
  ~C10dGroup();
  Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<Impl> impl_;
};

// The messages of a bundle (see src/transport/c10d_transport.cpp); part of the tag. kHeader
// carries the header and the data (or, when the size changed, filler) in one message;
// kResizedData the data when its size differs from the channel's previous message; kData is no
// longer sent (the data joined the header's message) and keeps its value so the others do.
enum class MessagePart : int { kHeader = 0, kMetadata = 1, kData = 2, kResizedData = 3 };

// Tag layout (30 bits; bit 30 is 0 for transport messages):
//   bit 29       payload (0 activation, 1 gradient)
//   bits 27..28  part (header, metadata, data, resized data)
//   bits 20..26  src_stage (< 128)
//   bits 13..19  dst_stage (< 128)
//   bits  0..12  microbatch (< 8192)
// Throws pipetrain::BadInput naming the field and its limit when a value does not fit.
int c10d_tag(const Envelope& envelope, MessagePart part);
constexpr int kC10dMaxStages = 128;
constexpr int kC10dMaxMicrobatches = 8192;
constexpr int kC10dControlTagBase = 1 << 30;

// Encodes a bundle's metadata (tensor count, dtypes, shapes, undefined markers, skip names) as
// int64 values, and back. Exposed for tests; the wire format is internal.
std::vector<int64_t> encode_bundle_metadata(const Bundle& bundle);
// Returns a bundle whose tensors are empty (undefined stays undefined, defined ones are allocated
// on `device` with the right dtype and shape but not filled). Throws pipetrain::TransportFailure
// when the metadata is truncated or corrupt (it came over the wire).
Bundle decode_bundle_metadata(const std::vector<int64_t>& metadata, const torch::Device& device);

struct C10dTransportOptions {
  // Where received tensors are placed. Gloo carries CPU tensors; a CUDA stage over Gloo receives
  // on CPU and the transport copies to this device.
  torch::Device device = torch::kCPU;
  // How long a receive waits for its message before it fails; zero: the world's timeout. Never
  // longer than the world's timeout (the smaller of the two counts).
  std::chrono::milliseconds timeout{0};
};

// Transport over a c10d world group. Stage j runs on world rank stage_world_rank[j].
//
//   send(envelope, bundle): posts isend(header), isend(meta)?, isend(data) to the stage's rank and
//     returns; a reaper thread waits on the Work handles (keeping the tensors alive) until the
//     receiver has taken them, in the order they were posted. A failed send is reported by the
//     next send/recv call. Between begin_sends() and end_sends() a completed send's buffer is
//     kept until release_sends() covers it (transport.h, "Sent buffers").
//   expect(envelope): posts the header and data receives of that message now (see above).
//   recv(envelope): posts the receives (unless expect() did), blocks until the data arrived
//     (bounded by the world's timeout), abort() or the world's abort channel wakes it with the
//     reason.
//   abort(reason): publishes the abort to every rank and aborts every pending Work.
//   reset(): a no-op while healthy; after an abort the transport stays aborted (a c10d group may
//     hold half-delivered messages: restart the job).
class C10dTransport : public Transport {
 public:
  // REQUIRES: stage_world_rank.size() <= kC10dMaxStages; every entry is a world rank.
  C10dTransport(std::shared_ptr<C10dWorld> world, std::vector<int> stage_world_rank,
                C10dTransportOptions options = {});
  ~C10dTransport() override;
  C10dTransport(const C10dTransport&) = delete;
  C10dTransport& operator=(const C10dTransport&) = delete;

  void send(const Envelope& envelope, Bundle bundle) override;
  Bundle recv(const Envelope& envelope) override;
  void expect(const Envelope& envelope) override;
  void abort(const std::string& reason) override;
  void reset() override;
  bool keeps_sent_buffers() const override { return true; }
  void begin_sends() override;
  // Waits (bounded by the receive timeout) for the reaper to see those sends complete, then frees
  // their buffers. Throws pipetrain::Timeout naming the first pending send when they do not
  // complete in time (its receiver did not post the receive).
  void release_sends(int64_t n) override;
  void end_sends() noexcept override;

  // Blocks until every posted send has been taken by its receiver (bounded by the timeout).
  void flush();

  // Counters since construction, for tests and benchmarks.
  struct Stats {
    int64_t bundles_sent = 0;
    int64_t data_bytes_sent = 0;  // the bundles' tensor bytes (headers and metadata left out)
    int64_t resized_sent = 0;     // bundles whose data size differed from the channel's last
    int64_t bundles_received = 0;
    int64_t received_expected = 0;  // receives that expect() had posted ahead
    // Message buffers the transport holds now: receives posted and not yet handed to recv()'s
    // caller (a received bundle's tensors are views of its buffer, which then belongs to them),
    // and copies of sent messages: until their send completed (the reaper thread releases
    // them), or, between begin_sends() and end_sends(), until release_sends() covers them.
    // Peaks since construction or reset_peak_buffer_bytes().
    int64_t receive_buffer_bytes = 0;
    int64_t peak_receive_buffer_bytes = 0;
    int64_t send_buffer_bytes = 0;
    int64_t peak_send_buffer_bytes = 0;
  };
  Stats stats() const;
  // Restarts both peaks from the bytes held now (a step's peaks: call it first).
  void reset_peak_buffer_bytes();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipetrain
