// Private to src/transport/c10d*.cpp: the c10d types behind c10d.h's opaque handles.
//
// In LibTorch 2.x ProcessGroupGloo and ProcessGroupNCCL derive from c10d::Backend (ProcessGroup
// is a dispatching wrapper over backends). We hold the backend object directly: one backend per
// group, no dispatch, and its send/recv/allreduce/broadcast/barrier return c10d::Work.
#pragma once

#include <array>
#include <atomic>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pipetrain/transport/c10d.h"

namespace pipetrain::detail {

using C10dBackendBase = ::c10d::Backend;
using C10dWork = ::c10d::Work;

// Creates the process group of `backend` over `store` (already prefixed per group).
// Gloo lives in c10d_world.cpp; NCCL in c10d_nccl_cuda.cpp (CUDA builds) or c10d_nccl_nocuda.cpp.
c10::intrusive_ptr<C10dBackendBase> make_gloo_group(const c10::intrusive_ptr<::c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout,
                                                    const std::string& master_addr);
c10::intrusive_ptr<C10dBackendBase> make_nccl_group(const c10::intrusive_ptr<::c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout);
// "" when NCCL process groups can be made here, else why not.
std::string nccl_unavailable_reason();

// Waits for `work`; rethrows its error with `what` prepended. Returns false when it was aborted.
bool wait_work(const c10::intrusive_ptr<C10dWork>& work, const std::string& what);

}  // namespace pipetrain::detail

namespace pipetrain {

struct C10dGroup::Impl {
  std::string name;
  std::vector<int> ranks;  // world ranks
  int group_rank = 0;
  std::chrono::milliseconds timeout{0};
  c10::intrusive_ptr<detail::C10dBackendBase> backend;  // null for a mirror group
  // An NCCL group's CPU tensors (the control plane: losses, norms, gathered bytes, barriers) go
  // over a Gloo group of the same members, as torch's "cpu:gloo,cuda:nccl" does; null otherwise.
  c10::intrusive_ptr<detail::C10dBackendBase> cpu_backend;
  bool mirror = false;     // C10dGroup::mirror: every member holds what this process holds
  int ranks_per_host = 0;  // RendezvousOptions::ranks_per_host (0: one host)
  // C10dGroup::traffic, per TrafficKind: bytes sent within this host, between hosts; and the
  // same by the posting thread's TrafficLabel (C10dWorld::labelled_traffic). Shared with the
  // world, which sums them after the group is gone too (ZeRO++'s groups end with the optimizer,
  // before --report-comm reads them).
  struct Traffic {
    std::array<std::atomic<int64_t>, kTrafficKinds> within{};
    std::array<std::atomic<int64_t>, kTrafficKinds> between{};
    std::mutex labelled_mutex;
    std::map<std::string, CollectiveTraffic> labelled;  // GUARDED_BY labelled_mutex
  };
  std::shared_ptr<Traffic> sent = std::make_shared<Traffic>();
  // Adds what this member sends of a collective of `kind` on `tensor` (the flat of a
  // reduce-scatter, the shard of an all-gather, the input of an all-to-all) to the counts.
  void count_traffic(int kind, const at::Tensor& tensor, int root);
  // An all-to-all of its own slice sizes: `bytes[g]` to member g.
  void count_all_to_all(const std::vector<int64_t>& bytes);
  // Whether group member g is on this member's host; what a collective of `kind` sent added to
  // the counts (and to the posting thread's label's).
  bool same_host(std::size_t g) const;
  void add_sent(int kind, int64_t within, int64_t between);
  // TORCH_DISTRIBUTED_DEBUG=DETAIL (torch's switch for its own such check): a Gloo group of the
  // same members over which each collective's fingerprint is compared before it is posted
  // (check_collective); null otherwise, and for a mirror group or a group of one.
  c10::intrusive_ptr<detail::C10dBackendBase> check_backend;
  // Held from a collective's check until it is posted, so that where several threads post to
  // the group (ZeRO's communication thread and the training loop) the checks' order is the
  // posting order.
  std::mutex post_mutex;
  int64_t checked = 0;  // the collectives checked so far (GUARDED_BY post_mutex)
  // The first kTrafficKinds in TrafficKind's order.
  enum Kind {
    kAllReduce,
    kBroadcast,
    kReduceScatter,
    kAllGather,
    kAllToAll,
    kBarrier,
    kGatherBytes
  };
  static constexpr const char* kKinds[] = {"all-reduce",     "broadcast",  "reduce-scatter",
                                           "all-gather",     "all-to-all", "barrier",
                                           "gather of bytes"};
  // With check_backend: all-gathers the fingerprint of the collective about to be posted (its
  // kind, `tensor`'s dtype and elements, the root, how many the group checked before it) and
  // throws pipetrain::Error (Runtime) naming this member's collective and a member's that
  // differs; returns the lock to hold while posting it. Without: an empty lock, nothing checked.
  std::unique_lock<std::mutex> check_collective(Kind kind, const at::Tensor& tensor, int root = -1);
  // The backend for a collective on `tensor`: the CPU one for a CPU tensor where there is one.
  detail::C10dBackendBase& backend_for(const at::Tensor& tensor) const {
    return cpu_backend && tensor.device().is_cpu() ? *cpu_backend : *backend;
  }
  // Index of a world rank within the group, or -1.
  int group_rank_of(int world_rank) const;
};

}  // namespace pipetrain
