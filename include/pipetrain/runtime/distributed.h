// Distributed: one process's place in a multi-process job (pipeline x data parallel), and the
// collective steps of a training step that cross processes.
//
// Rank layout, world = K pipeline ranks x R replicas (docs/DISTRIBUTED.md has the picture):
//
//   rank = replica * K + pipeline_rank         (stage-major within a replica)
//
//              pipeline rank 0   1   2   3
//   replica 0:         rank  0   1   2   3     <- one pipeline: C10dTransport between these
//   replica 1:         rank  4   5   6   7
//                            |
//                            data-parallel group of pipeline rank 1: {1, 5}
//
// Gradient semantics (so that the result equals sequential training on the whole mini-batch):
// each replica takes its share of every mini-batch, and the runtime weights every micro-batch loss
// by micro-batch size / WHOLE mini-batch size (all replicas). A replica's gradient is then its
// share of the full-batch gradient, and allreduce_gradients SUMS over the replicas. Tied weights:
// after the data-parallel sum every replica's copy j is equal; allreduce_tie then sums the copies
// held by different pipeline ranks of one replica, so every copy receives the tie's full gradient.
//
// Tensor parallelism (DistributedOptions::tensor_parallel T > 1; parallel/mesh.h has the picture):
// each pipeline rank is T processes, adjacent, rank = ((replica * K) + pipeline_rank) * T +
// tp_rank. They form the tensor-parallel group (tensor_parallel_group(), for the split layers of
// parallel/tensor_parallel.h); the pipeline of tp rank t joins the ranks of tp rank t of each
// stage; the data-parallel group and the tie groups join ranks of one tp rank; the loss counts
// once per replica (tp rank 0's).
//
// Expert parallelism (DistributedOptions::expert_parallel E > 1; parallel/expert_parallel.h has the
// picture): the R replicas of each (pipeline rank, tp rank) form R / E expert-parallel groups of E
// consecutive replicas (a mixture's experts split over each), and E expert-data-parallel groups
// of the replicas that hold the same experts (replica r with r + E, r + 2E, ...), over which the
// experts' gradients are summed instead of over all R.
//
// Context parallelism (DistributedOptions::context_parallel C > 1; parallel/ring_attention.h):
// the R replicas of each (pipeline rank, tp rank) form R / C context-parallel groups of C
// consecutive replicas (cp inside dp, as Megatron-LM places it). The members of a group take the
// same rows of the mini-batch, each its part of every sequence (context_parallel().positions);
// their attention runs over the group. A member's gradient is its tokens' share, so the sum over
// all R replicas (dp x cp) is the mini-batch's; ZeRO shards over all R.
//
// Ownership: Distributed owns the C10dWorld (store, world group) and the subgroups it creates.
// Thread-safety: collectives from one thread at a time, in the same order on every member.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/arg.h>
#include <torch/types.h>

#include "pipetrain/parallel/ring_attention.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain {

// The torchrun environment of this process.
struct DistributedEnvironment {
  std::string master_addr;
  int master_port = 0;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // Ranks on this process's host (PIPETRAIN_RANKS_PER_HOST where set, else LOCAL_WORLD_SIZE,
  // torchrun's and the local launcher's; 0 where unset): hosts hold consecutive ranks, so rank r
  // is on host r / local_world_size.
  int local_world_size = 0;
  // Attempts before this one (TORCHELASTIC_RESTART_COUNT, set by torchrun --max-restarts and by
  // launch_local's max_restarts): 0 on the first.
  int restart_count = 0;
  // Rank 0 under launch_local: a socket already listening on MASTER_PORT, which its store's
  // server takes over (PIPETRAIN_STORE_SOCKET, launcher.h); -1 when there is none, or the
  // variable names no socket listening on MASTER_PORT (then the store binds the port itself).
  int store_socket = -1;

  // Reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and LOCAL_RANK and
  // TORCHELASTIC_RESTART_COUNT (both optional, default 0), PIPETRAIN_RANKS_PER_HOST or
  // LOCAL_WORLD_SIZE (optional, default 0), and PIPETRAIN_STORE_SOCKET.
  // Throws pipetrain::BadInput naming every missing or invalid variable and how to set it.
  static DistributedEnvironment from_environment();
  // True when RANK or WORLD_SIZE is set: the process was started by a launcher.
  static bool present();
};

// Where a rank sits in the K x T x R grid (T = 1: the K x R grid above).
struct ParallelLayout {
  int pipeline_ranks = 1;    // K
  int replicas = 1;          // R
  int tensor_parallel = 1;   // T
  int expert_parallel = 1;   // E: divides R
  int context_parallel = 1;  // C: divides R (R / C data-parallel groups of rows)

  // REQUIRES: world_size % (pipeline_ranks * tensor_parallel) == 0 (checked: the error names the
  // numbers and the fix).
  static ParallelLayout for_world(int world_size, int pipeline_ranks, int tensor_parallel = 1);

  int world_size() const { return pipeline_ranks * replicas * tensor_parallel; }
  int rank_of(int replica, int pipeline_rank, int tp_rank = 0) const {
    return (replica * pipeline_ranks + pipeline_rank) * tensor_parallel + tp_rank;
  }
  int replica_of(int rank) const { return rank / (pipeline_ranks * tensor_parallel); }
  int pipeline_rank_of(int rank) const { return (rank / tensor_parallel) % pipeline_ranks; }
  int tp_rank_of(int rank) const { return rank % tensor_parallel; }
  // The R world ranks holding (pipeline rank p, tp rank t): its data-parallel group.
  std::vector<int> data_parallel_ranks(int pipeline_rank, int tp_rank = 0) const;
  // The K world ranks of replica d's pipeline of tp rank t.
  std::vector<int> pipeline_world_ranks(int replica, int tp_rank = 0) const;
  // The T world ranks of (replica d, pipeline rank p): its tensor-parallel group.
  std::vector<int> tensor_parallel_ranks(int replica, int pipeline_rank) const;
  // The E world ranks of replica d's expert-parallel group at (pipeline rank p, tp rank t), and
  // the R / E ranks holding the same experts as replica d there.
  std::vector<int> expert_parallel_ranks(int replica, int pipeline_rank, int tp_rank = 0) const;
  std::vector<int> expert_data_parallel_ranks(int replica, int pipeline_rank,
                                              int tp_rank = 0) const;
  // The C world ranks of replica d's context-parallel group at (pipeline rank p, tp rank t).
  std::vector<int> context_parallel_ranks(int replica, int pipeline_rank, int tp_rank = 0) const;
  // The `size` consecutive replicas holding replica d's group, as world ranks at (p, t).
  std::vector<int> consecutive_replica_ranks(int replica, int size, int pipeline_rank,
                                             int tp_rank) const;
};

struct DistributedOptions {
  /// Bound on rendezvous, every receive and collective, and dead-peer detection.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::seconds(120);
  /// "auto" (gloo for CPU, nccl for CUDA devices), "gloo", "nccl" or "mpi".
  TORCH_ARG(std::string, backend) = "auto";
  /// The device of this rank's stages (picks the backend under "auto"). Under NCCL the rendezvous
  /// checks that no two ranks share a GPU (cuda without an index counts as cuda:LOCAL_RANK).
  TORCH_ARG(torch::Device, device) = torch::kCPU;
  /// K, pipeline ranks per replica; 0 = the whole world is one pipeline (R = 1).
  TORCH_ARG(int, pipeline_ranks) = 0;
  /// T, tensor-parallel ranks per pipeline rank (adjacent world ranks).
  TORCH_ARG(int, tensor_parallel) = 1;
  /// E, expert-parallel replicas per group (parallel/expert_parallel.h); divides the replicas.
  TORCH_ARG(int, expert_parallel) = 1;
  /// With E > 1: a second group of the same members for compute lane 1 (parallel/lane.h), which
  /// the overlap of expert exchanges needs (PipeOptions::overlap_expert_exchanges).
  TORCH_ARG(bool, expert_parallel_second_lane) = false;
  /// C, context-parallel replicas per group (above); divides the replicas.
  TORCH_ARG(int, context_parallel) = 1;
  /// With C > 1: Ulysses' all-to-all between sequence and heads instead of ring attention.
  TORCH_ARG(bool, context_parallel_ulysses) = false;
  /// Ring: each pass beside the block's compute (parallel::ring_attention's overlap).
  TORCH_ARG(bool, context_parallel_overlap) = true;
};

class Distributed {
 public:
  // Rendezvous (C10dWorld::connect), then the data-parallel group of this rank's pipeline rank.
  Distributed(const DistributedEnvironment& environment, const DistributedOptions& options);
  ~Distributed();
  Distributed(const Distributed&) = delete;
  Distributed& operator=(const Distributed&) = delete;

  int rank() const;
  int world_size() const;
  int local_rank() const { return local_rank_; }
  int replica() const { return layout_.replica_of(rank()); }
  int pipeline_rank() const { return layout_.pipeline_rank_of(rank()); }
  int tp_rank() const { return layout_.tp_rank_of(rank()); }
  const ParallelLayout& layout() const { return layout_; }
  const std::shared_ptr<C10dWorld>& world() const { return world_; }

  // The transport of this replica's pipeline. stage_pipeline_rank[j] is the pipeline rank that
  // runs stage j (Schedule::stage_rank). A receive waits at most `receive_timeout` (zero: the
  // job's timeout; never longer than it).
  std::unique_ptr<C10dTransport> make_transport(
      const std::vector<int>& stage_pipeline_rank, torch::Device device = torch::kCPU,
      std::chrono::milliseconds receive_timeout = std::chrono::milliseconds(0));

  // The data-parallel group of this rank's pipeline rank (its replicas, in replica order: group
  // rank = replica()); nullptr with one replica.
  const std::shared_ptr<C10dGroup>& data_parallel_group() const { return data_parallel_; }
  // The tensor-parallel group of this rank (its pipeline rank's T processes, group rank =
  // tp_rank()); nullptr with T = 1.
  const std::shared_ptr<C10dGroup>& tensor_parallel_group() const { return tensor_parallel_; }
  // Expert parallelism (E > 1): this rank's expert-parallel group (group rank = replica() % E),
  // and the ranks holding the same experts (nullptr where E = R); both nullptr with E = 1.
  const std::shared_ptr<C10dGroup>& expert_parallel_group() const { return expert_parallel_; }
  // Its copy for compute lane 1 (DistributedOptions::expert_parallel_second_lane); nullptr
  // without one.
  const std::shared_ptr<C10dGroup>& expert_parallel_second_group() const {
    return expert_parallel_second_;
  }
  const std::shared_ptr<C10dGroup>& expert_data_parallel_group() const {
    return expert_data_parallel_;
  }
  // Context parallelism: this rank's group (group rank = replica() % C) and method; size 1 (no
  // group) with C = 1. What the model's attention and the pipe's cut of the batch take.
  const parallel::ContextParallel& context_parallel() const { return context_parallel_; }
  // The data-parallel group of rows this rank's replica takes its share of (replica() / C).
  int data_replica() const { return replica() / layout_.context_parallel; }

  // Sums every parameter's .grad() over the replicas of this pipeline rank, flattened into one
  // buffer per dtype. A parameter without a gradient counts as zero and receives the sum.
  // No-op with one replica. Returns the bytes of the largest flat buffer (0 for a no-op).
  std::int64_t allreduce_gradients(const std::vector<torch::Tensor>& parameters);
  // The same over the tensor-parallel group: for the tensors every tp rank holds whole whose
  // gradient each rank has only a share of (sequence parallelism). No-op with T = 1.
  void allreduce_tensor_parallel_gradients(const std::vector<torch::Tensor>& parameters);
  // The same over the expert-data-parallel group: the experts' gradients (each already the sum
  // over its expert-parallel group's tokens). No-op where no other rank holds the same experts.
  // Returns the bytes of the largest flat buffer (0 for a no-op).
  std::int64_t allreduce_expert_gradients(const std::vector<torch::Tensor>& parameters);

  // Declares the tied weight `name`, held by the pipeline ranks `holders` of every replica, and
  // returns its key, "name@h1@h2..." (holders sorted), to pass to allreduce_tie. Every holder
  // calls it before allreduce_tie, with the same arguments; declaring it again with the same
  // holders (a second pipe over the same job) reuses its group; with other holders (a pipe that
  // places its stages otherwise, e.g. a V-shaped schedule) it makes a group of its own.
  std::string declare_tie(const std::string& name, std::vector<int> holders);
  // Sums the gradients of this rank's copies of tie `name` and of the other holders' copies in
  // this replica; every copy's .grad() receives the sum.
  // `name` is the key declare_tie returned. REQUIRES: this rank is a holder.
  void allreduce_tie(const std::string& name, const std::vector<torch::Tensor>& local_copies);

  // The mini-batch loss on every rank: the sum over replicas of the replica losses. The ranks that
  // hold their replica's last stage pass the replica's loss (the same on each of its tp ranks:
  // tp rank 0's counts); every other rank passes nullopt.
  double broadcast_loss(std::optional<double> replica_loss);

  // Every rank of replica 0 (tp rank 0 of each pipeline rank: gather a tensor-parallel model's
  // slices first) sends its named tensors to rank 0, which returns them merged into one map (a
  // name held by several ranks, a tied weight, keeps one copy); other ranks get {}.
  std::map<std::string, torch::Tensor> gather_named_parameters(
      const std::vector<std::pair<std::string, torch::Tensor>>& mine);

  // Every rank returns world rank `root`'s text (the value other ranks pass is ignored): how a
  // decision made once, such as the auto plan of `pipetrain train`, reaches every rank.
  std::string broadcast_text(const std::string& text, int root = 0);

  void barrier();
  // Publishes an abort to every rank (first reason wins).
  void abort(const std::string& reason);
  // Clean shutdown (C10dWorld::finalize).
  void finalize();

 private:
  std::shared_ptr<C10dWorld> world_;
  ParallelLayout layout_;
  int local_rank_ = 0;
  std::shared_ptr<C10dGroup> data_parallel_;
  std::shared_ptr<C10dGroup> tensor_parallel_;
  std::shared_ptr<C10dGroup> expert_parallel_;
  std::shared_ptr<C10dGroup> expert_parallel_second_;
  std::shared_ptr<C10dGroup> expert_data_parallel_;
  parallel::ContextParallel context_parallel_;
  // By declare_tie key; null: only this rank holds it.
  std::map<std::string, std::shared_ptr<C10dGroup>> ties_;
};

// Runs `body` as this process's main under the torchrun environment and returns its exit code:
//   - rendezvous from the environment (errors name the variables), then body(distributed);
//   - an exception from body is printed ("rank r: error: ...") and published as an abort; the
//     process exits with 1 (std::_Exit after flushing: destructors of a c10d group with a dead
//     peer could block);
//   - an abort published by another rank, a dead peer or a lost store wakes this rank's receives;
//     if body has not ended `abort_grace` later (stuck in a collective), the process exits with 1
//     after printing the reason;
//   - on success, finalize() and 0.
int run_distributed(const DistributedOptions& options,
                    const std::function<void(Distributed&)>& body,
                    std::chrono::milliseconds abort_grace = std::chrono::seconds(5));

}  // namespace pipetrain
