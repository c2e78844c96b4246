// ShardedOptimizer: ZeRO stages 1, 2 and 3 (and ZeRO-Offload) over the data-parallel replicas of
// one pipeline rank.
//
// The R replicas of a pipeline rank hold the same parameters. Unsharded, each sums the gradients
// over the replicas (all-reduce) and steps the whole optimizer: R copies of its state. Sharded,
// this rank's parameters are laid end to end in a flat vector cut into segments (a segment is at
// most a bucket, --bucket-size, or one parameter larger than that; under ZeRO-3 by unit never
// more than one layer's parameters), each padded to a multiple of R; replica d owns the d-th
// contiguous piece of every segment, and its shard is its pieces one after the other:
//
//   [1] reduce_gradients(): each segment's gradients packed into a buffer of the segment's size
//       and reduce-scattered: replica d receives the sum over replicas of its piece only. Two
//       segments in flight at most, so the buffers are a bucket or two, never the rank's size.
//   [2] local_grad_norm_squared() / scale_gradients(f): on the shard, for global-norm clipping
//       (each element counted once over the replicas; `counted` leaves out tied copies).
//   [3] step(): the inner torch::optim optimizer (sgd, adam, adamw) steps the shard, whose state
//       is all this replica holds (1/R of the unsharded state); then each segment's pieces are
//       all-gathered into a buffer of the segment's size and copied into the parameters.
//
// Where the shard lives (what the paper counts, float32 Adam, per parameter: 4 + 4 + 8/R at
// stage 1, 4 + 12/R at stage 2, 16/R at stage 3):
//
//   stage 1  the shard is the parameters themselves: the inner optimizer steps slices of them
//            (aliases of their storage), and the reduced gradient is written into the same
//            slices of their .grad(). Nothing but the optimizer state is added.
//   stage 2  as 1, but the reduced gradient is a shard of its own (4/R): by default each
//            micro-batch's weight gradients are reduce-scattered into it as its backward makes
//            them (ZeroGradients::kStream), so no full .grad() accumulates over the step.
//   stage 3  the parameters are freed between uses and the shard (4/R) holds their values
//            (below); gradients as stage 2.
//   offload  the shard, its gradient and the optimizer state are copies in host memory.
//
// Streaming (stages 2 and 3, ZeroGradients::kStream; the pipe calls gradients() through
// StageParameterHooks, stage/parameter_hooks.h): a layer's weight gradients of one micro-batch
// are packed by segment and reduce-scattered at once, and the received piece is added to the
// shard's gradient; the pipeline's other work goes on meanwhile. The shard's gradient is then
// sum over micro-batches (sum over replicas), where kAccumulate (and stage 1) sum over the
// replicas once: another order of the same sums, equal to --zero 0 within rounding (about 1e-6
// relative in float32) instead of bit for bit. Parameters whose gradients are final only after
// the step (a weight tied across stages or ranks, a sequence-parallel norm: the pipe's group -1)
// and the persistent ones (below) accumulate into .grad() and are reduced in [1] as before.
//
// SGD (with momentum and weight decay), Adam and AdamW update each element from its own gradient
// and state alone, so the sharded step gives the unsharded weights (the sum over replicas is the
// same sum; with R > 2 its order may differ in the last bit).
//
// Stage 3 shards the parameters themselves. Between uses a parameter's storage is freed (its
// shape, dtype, version and autograd identity stay, so modules, autograd graphs and optimizers
// keep working with it) and the shard is where its values live. A segment is made whole by an
// all-gather of the shards into one buffer, and its parameters' storage then points into that
// buffer (no second copy); freeing them frees the buffer. What is whole when
// (ZeroOptions::unit):
//
//   kLayer (default)  one layer's parameters at a time, around each use the stage reports
//                     (StageParameterHooks: forward, recompute, and each segment of a backward),
//                     as schedule/unit_residency.h plans it from the step's action list:
//                     gathered ahead of use up to prefetch_bytes, kept when reused within
//                     max_reuse_distance bytes, at most max_live_bytes prefetched
//   kStage            a local stage's parameters (start_gather / wait_gathered / release,
//                     driven by the pipeline: schedule/residency.h), from before its first action
//                     of the step to after its last, or around each action
//                     (reshard_after_forward)
//
// Parameters smaller than persistence_threshold bytes, those several layers share, and the
// pipe's group -1 form a segment of their own, whole from a step's first use to its step().
// Reading the parameters outside a step (a checkpoint, an evaluation, the end of training) needs
// gather_all() first; whatever is written into them then (a restore) is taken into the shard by
// the next zero_grad(). Under bf16/fp16 the segments of parameters autocast only casts are
// gathered in the compute dtype (ZeroOptions::cast_gather) and widened into the buffer the
// parameters point into; gather_all() always gathers the parameters' dtype.
//
//   construction / gather_all()    parameters whole, and the truth
//   zero_grad() (or the step's     [0] the shard loaded from them, every segment freed
//   first gather)
//   the step's actions             whole around their uses (the unit's policy above)
//   reduce_gradients() ... step()  as stage 2; nothing gathered
//
// Offload (ZeroOptions::offload, ZeRO-Offload): the shard [3] steps, its gradient and the inner
// optimizer's state live in host memory (pinned when the parameters are on a GPU), and the step
// runs on the CPU (ATen's vectorised kernels over one flat tensor, on its intra-op threads). The
// reduced gradient shard is copied to the host after [1]; the stepped shard back to the
// parameters' device for the all-gather (stages 1 and 2: a temporary; stage 3: the device copy
// of the shard the gathers read, refreshed after each step without waiting for the copy). What
// stays on the device: the parameters, their gradients and, at stage 3, the device shard. The
// copies are kept apart even where the parameters are on the CPU (nothing moves then, but every
// value takes the offload's path).
//
// Devices: the parameters may be on the CPU or one CUDA device. The collectives run where the
// data-parallel group's backend wants them: on the parameters' device under NCCL, on the CPU
// under Gloo (a CUDA rank's buffers are copied to and from the host around them). With one
// replica there are none, and the buffers are built where the shard lives (the host, when
// offloaded: the device then holds no flat copy of the gradients or the parameters).
//
// Checkpoints: capture() gathers the shards into the per-parameter form of an unsharded
// checkpoint (train/checkpoint.h; replica 0 contributes it), and restore() takes its own slice of
// that form, so a checkpoint moves between zero stages and data-parallel sizes unchanged.
//
// Ownership: shares the parameter tensors; holds a pointer to the Distributed, which must outlive
// it (null: a one-process run, one replica and no collectives, for the offload in one process).
// Thread-safety: the training loop's thread only (the optimizer's own communication thread, which
// start_reduce feeds, is internal). Every method marked collective must be called by every
// replica of the pipeline rank together.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include "pipetrain/partition/memory.h"
#include "pipetrain/runtime/collective_log.h"
#include "pipetrain/runtime/communication_thread.h"
#include "pipetrain/runtime/distributed.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/runtime/step.h"
#include "pipetrain/schedule/unit_residency.h"
#include "pipetrain/stage/parameter_hooks.h"
#include "pipetrain/stage/precision.h"
#include "pipetrain/train/buffer_pool.h"
#include "pipetrain/train/checkpoint.h"
#include "pipetrain/train/nvme_options.h"
#include "pipetrain/train/optimizer.h"
#include "pipetrain/train/optimizer_state_file.h"
#include "pipetrain/train/sharded_checkpoint.h"

namespace pipetrain {
class DistributedPipe;
}

namespace pipetrain::train {

// How stages 2 and 3 sum the gradients of a step (the header comment, "Streaming").
enum class ZeroGradients {
  kStream,      // each micro-batch's, reduce-scattered into the shard as its backward makes them
  kAccumulate,  // full .grad() summed over the step's micro-batches, then reduce-scattered
};
// What ZeRO-3 gathers and frees as one (the header comment).
enum class ZeroUnit { kLayer, kStage };
// "stream", "accumulate"; "layer", "stage". The parsers throw BadInput naming the text.
const char* to_string(ZeroGradients gradients);
const char* to_string(ZeroUnit unit);
ZeroGradients parse_zero_gradients(const std::string& text);
ZeroUnit parse_zero_unit(const std::string& text);

// How a ShardedOptimizer shards (and make_pipe_sharded_optimizer drives it).
struct ZeroOptions {
  // 1: optimizer state; 2: and gradients; 3: and the parameters themselves.
  TORCH_ARG(int, stage) = 1;
  // Stage 3 by stage (whatever `unit` says): gather around every action instead of from a
  // stage's first action of the step to its last (schedule/residency.h).
  TORCH_ARG(bool, reshard_after_forward) = false;
  // The shard's fp32 values, its gradient and the optimizer state in host memory, stepped on the
  // CPU (ZeRO-Offload; see the header comment).
  TORCH_ARG(bool, offload) = false;
  // With offload (ZeRO-Infinity, --offload-optimizer nvme): the optimizer state in a file under
  // nvme().dir() instead of host memory, stepped one sub-group at a time through the bounded pool
  // (train/optimizer_state_file.h). The shard's values and gradient stay in host memory.
  TORCH_ARG(bool, offload_to_nvme) = false;
  TORCH_ARG(NvmeOptions, nvme) = {};
  // Stage 3 with offload_to_nvme (--offload-params nvme): the shard's values (the float32 master
  // of this replica's pieces) in the same file, not in memory: each gather reads its piece from
  // the file, the step reads, steps and writes them with the state, sub-group by sub-group.
  TORCH_ARG(bool, offload_params_to_nvme) = false;
  // Stage 3 under bf16 or fp16 (make_pipe_sharded_optimizer reads the pipe's precision): the
  // float32 parameters that reach the computation only through autocast's casts
  // (stage/autocast_parameters.h: the linears' and convolutions' weights) are all-gathered in
  // the compute dtype, half the bytes, and widened on arrival. The forward and the gradients see
  // the values they see at --zero 0 and the shard stays float32, so the step is as exact.
  // false: every parameter gathers in the shard's dtype.
  TORCH_ARG(bool, cast_gather) = true;
  // Stages 2 and 3 (make_pipe_sharded_optimizer; a one-process optimizer accumulates).
  TORCH_ARG(ZeroGradients, gradients) = ZeroGradients::kStream;
  // Stage 3: what is gathered as one, and by kLayer's plan (schedule/unit_residency.h): the bytes
  // gathered ahead of use (0: none; the next layer whatever its size, and the ones after while
  // they fit: a bucket's worth by default), the most bytes prefetched units may bring the whole
  // ones to (0: no bound), and how near (in bytes of other units used in between) a unit's next
  // use must be for it to stay whole (-1: freed after every use).
  TORCH_ARG(ZeroUnit, unit) = ZeroUnit::kLayer;
  TORCH_ARG(int64_t, prefetch_bytes) = int64_t{25} << 20;
  TORCH_ARG(int64_t, max_live_bytes) = 0;
  TORCH_ARG(int64_t, max_reuse_distance) = 0;
  // Stage 3: parameters smaller than this many bytes stay whole through the step (fewer, larger
  // gathers; DeepSpeed's stage3_param_persistence_threshold).
  TORCH_ARG(int64_t, persistence_threshold) = 0;
  // CPU parameters, glibc: after a layer's streamed gradients and (stage 3) after a layer's
  // parameters are freed, the heap's free pages go back to the kernel (malloc_trim), so that the
  // rank's resident memory follows what it holds. glibc otherwise keeps what a step freed in the
  // middle of its heap resident: measured on the bench Llama at pp2 x dp2, ZeRO-3 by layer held
  // 2.28 GB resident where it held 1.6 GB of tensors; with this 1.77 GB, for 14% more step time
  // (the pages are faulted in again when the heap grows back).
  TORCH_ARG(bool, return_freed_memory) = true;
  // Stage 3 on CPU parameters built without their values (job::BuiltModel::fill_values): before
  // the shard takes a parameter's values, initial_values(p) writes them (and may write the rest
  // of p's layer), and each segment's parameters are freed as soon as the shard holds them, so
  // the rank never holds more than a layer or two of whole parameters at construction. Null: the
  // parameters hold their values (the shard takes them all, then frees them).
  using InitialValues = std::function<void(const torch::Tensor&)>;
  TORCH_ARG(InitialValues, initial_values) = nullptr;
  // ZeRO++ (the header comment, "ZeRO++"). qwZ (stage 3): the gathers from the shards carry
  // block-quantized int8 values (one float32 scale per kQuantBlock elements) instead of the
  // gather dtype's.
  TORCH_ARG(bool, quantized_weights) = false;
  // hpZ (stage 3): > 1, groups of this many consecutive replicas (a host's) each keep a copy of
  // every segment they gathered in a step, 1/N of it per member, and the backward's gathers read
  // it within the group. 1: off. Must divide the replicas.
  TORCH_ARG(int, hpz_partition_size) = 1;
  // qgZ (stages 1-3): the gradients' reduce-scatter replaced by two all-to-alls of int8 blocks,
  // within each host, then between hosts (hosts: the world's RendezvousOptions::ranks_per_host).
  TORCH_ARG(bool, quantized_gradients) = false;
};

// What ZeRO's collectives are counted under (transport/c10d.h's TrafficLabel; `--report-comm`):
// stage 3's gathers for a forward, for a backward (recompute included), and the gradients'
// reductions. By stage, a segment's first gather of a step counts as a forward's and the later
// ones as a backward's.
inline constexpr const char* kZeroTrafficLabels[] = {"forward gathers", "backward gathers",
                                                     "gradients"};

// Throws pipetrain::BadInput naming the flag and value for a setting out of range: negative
// prefetch, live or persistence bytes, a reuse distance below -1, --reshard-after-forward below
// stage 3 (what the trainer and the CLI check).
void check_zero_options(const ZeroOptions& zero);
// ZeRO++ with `replicas` data-parallel replicas: throws BadInput naming the flag for qwZ or hpZ
// below stage 3 (also check_zero_options') and an hpZ size below 1 or not dividing the replicas.
void check_zero_plus_plus(const ZeroOptions& zero, int replicas);
// qgZ's hosts of a data-parallel group's `members` (world ranks, ascending): host -> its members,
// host = rank / ranks_per_host (0: one host). Throws BadInput naming `group` where hosts hold
// different numbers of them.
std::map<int, std::vector<int>> hosts_of_replicas(const std::vector<int>& members,
                                                  int ranks_per_host, const std::string& group);
// Stage 3 gathers by layer: unit kLayer, and not reshard_after_forward (a policy of the stage
// unit: freeing a stage's parameters after each action implies gathering them by stage).
bool gathers_by_layer(const ZeroOptions& zero);
// Stages 2 and 3 stream each micro-batch's gradients into the shard (ZeroGradients::kStream).
bool streams_gradients(const ZeroOptions& zero);
// What the memory model (partition/memory.h) reads of ZeRO's settings and of the pipe's overlap
// and bucket size.
partition::ZeroMemoryPolicy zero_memory_policy(const ZeroOptions& zero, const PipeOptions& pipe);

// Throws pipetrain::BadInput naming both when `reshard_after_forward` (ZeRO-3's policy) comes
// with a ZeRO stage other than 3: what the trainer, the sharded optimizer and the CLI check.
void check_reshard_after_forward(bool reshard_after_forward, int zero_stage);

// The parameters of `model` that ZeRO-3 all-gathers in the compute dtype of `precision`
// (ZeroOptions::cast_gather): narrowable_parameters (stage/autocast_parameters.h) where
// gathers_narrowed, else none. make_pipe_sharded_optimizer gathers these
// narrowed, and the memory model (train/memory_report.h) sizes their buffers so.
std::set<const void*> narrowed_gather_parameters(const torch::nn::Module& model,
                                                 const ZeroOptions& zero, Precision precision);
// Whether ZeRO-3 gathers some parameters in the compute dtype: stage 3 with cast_gather under
// bf16 or fp16. Which ones: narrowed_gather_parameters (here), or, per layer for the memory
// model, partition::LayerProfile::cast_parameter_bytes (MemoryModelOptions::cast_gathers).
bool gathers_narrowed(const ZeroOptions& zero, Precision precision);

class ShardedOptimizer : public StageParameters, public StageParameterHooks {
 public:
  // `parameters`: this rank's, each tensor once, all of one floating dtype and on one device (the
  // CPU or a CUDA device). `counted`: the subset whose gradients the global norm counts here (a
  // tied tensor counts on one holder only). `zero.stage()`: 1, 2 or 3. Throws BadInput for
  // another stage, mixed dtypes or devices, an unknown optimizer name, or at stage 3 a parameter
  // that does not own its storage alone (a view).
  // `segment_stages` (stage 3): the local stage of each segment (-1: a segment every stage uses,
  // whole from the first action of a step to its end), for StageParameters' stage indices.
  // `segments` (optional): the parameters in groups, laid out one group after the other, each
  // padded to a multiple of R and sharded on its own (the shard is the concatenation of this
  // replica's piece of each), so that a group's gradients can be reduce-scattered as soon as
  // they are final (start_reduce: --overlap-grad-reduce). Every parameter in exactly one group.
  // Empty: one group of all, the layout above.
  // `segment_gather_dtypes` (stage 3, optional): the floating dtype each segment's all-gathers
  // carry its values in (narrower than the parameters': rounded before sending, widened on
  // arrival; ZeroOptions::cast_gather says when that is exact). Empty: the parameters' dtype.
  // `segment_layers` (optional): the layer of its stage each segment belongs to (-1: none), for
  // the hooks' layers: with ZeroOptions::unit kLayer at stage 3 the segments of one (stage,
  // layer) are a unit, and at stages 2 and 3 under kStream the hooks' gradients() of that layer
  // are reduce-scattered by them. Empty: no segment belongs to a layer (nothing streams, and
  // stage 3 is gathered by stage).
  // `segment_accumulates` (optional): segments of a layer whose gradients are final only after
  // the step (a weight tied to another rank's, a tp-summed one): gathered with their layer but
  // accumulated into .grad() and reduced after the step, not streamed.
  // `segment_experts` (optional, expert parallelism): segments of a mixture's experts, sharded
  // over the replicas holding the same experts (Distributed::expert_data_parallel_group(); none
  // where no other replica holds them) instead of over every replica: their pieces, reductions,
  // gathers and checkpoint forms are that group's.
  ShardedOptimizer(Distributed* distributed, std::vector<torch::Tensor> parameters,
                   const std::vector<torch::Tensor>& counted, const std::string& optimizer,
                   const OptimizerOptions& options, const ZeroOptions& zero,
                   const std::vector<std::vector<torch::Tensor>>& segments = {},
                   std::vector<int> segment_stages = {},
                   const std::vector<torch::ScalarType>& segment_gather_dtypes = {},
                   std::vector<int> segment_layers = {},
                   const std::vector<char>& segment_accumulates = {},
                   const std::vector<char>& segment_experts = {});
  ~ShardedOptimizer() override;
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  // The parameters' gradients to zero (stage 2: released) and the shard's. Stage 3 [0]: takes
  // whole parameters (after construction or gather_all()) into the shard and frees them.
  // Reductions start_reduce started that no reduce_gradients() finished (a step the loss scaler
  // skipped) are waited for and dropped first. Collective where such reductions are left.
  void zero_grad();

  // Stage 3: a local stage's segment (and the segment every stage uses) made whole and freed
  // (StageParameters; no-ops at stages 1 and 2). Collective in order over the replicas.
  void start_gather(int stage) override;
  void wait_gathered(int stage) override;
  void release(int stage) override;
  // StageParameterHooks (stage/parameter_hooks.h), called by the pipe's stages. begin_step plans
  // the step's units (stage 3 by layer) and starts the first gathers; acquire waits until layer
  // l's unit is whole (and the persistent segment), release follows the plan after the use;
  // gradients takes the layer's streamed gradients (stages 2 and 3, kStream). Collective in
  // order, as the rest.
  void begin_step(const schedule::Schedule& s, int r, ::pipetrain::Checkpoint checkpoint) override;
  void acquire(int j, std::size_t l) override;
  void release(int j, std::size_t l) override;
  void gradients(int j, std::size_t l, const std::vector<torch::Tensor>& parameters,
                 std::vector<torch::Tensor>& grads) override;
  // gradients() takes exactly the streamed segments' gradients of layer l.
  bool takes_gradient(int j, std::size_t l, const torch::Tensor& parameter) const override;
  // Whether the hooks do anything: streaming, or stage 3 by layer (make_pipe_sharded_optimizer
  // installs them only then).
  bool uses_hooks() const { return streams_ || by_layer_; }
  // The last begin_step's plan (stage 3 by layer; empty otherwise).
  const schedule::UnitPlan& unit_plan() const { return plan_; }
  // Stage 3: every parameter whole, and the truth until the next zero_grad() (collective); and
  // every parameter freed (the shard holds their values).
  void gather_all();
  void release_all();
  // Bytes of parameters this replica holds now: their storage where it is allocated, plus at
  // stage 3 the shard; and the most bytes of whole parameters held at once since zero_grad().
  int64_t parameter_bytes() const;
  // By layer that peak counts the gathers in flight with them (a gathered buffer becomes the
  // parameters' storage).
  int64_t peak_whole_parameter_bytes() const { return peak_whole_bytes_; }
  // Stage 3 by stage: the most bytes of all-gather receive buffers in flight at once since
  // zero_grad(): each segment's padded buffer from its gather's start to its wait, and a narrowed
  // segment's copy of the piece it sends (by layer: 0, in the peak above).
  int64_t peak_gather_buffer_bytes() const { return peak_buffer_bytes_; }
  // Stage 3: the bytes this replica's all-gathers have sent since construction (its pieces, in
  // the dtype each segment gathers in), and the bytes they would have sent in the parameters'
  // dtype.
  int64_t gather_bytes_sent() const { return gather_bytes_sent_; }
  int64_t gather_bytes_uncast() const { return gather_bytes_uncast_; }
  // Where its collectives are recorded for traces (null: nowhere; it must outlive this).
  void set_collective_log(CollectiveLog* log) { log_ = log; }
  // [1] Collective. Waits for the segments start_reduce started and reduce-scatters the others.
  void reduce_gradients();
  // [1] for one segment, started now while the step goes on (its gradients are final): where
  // the collectives run on the CPU, packing the segment's gradients and starting its
  // reduce-scatter happen on the optimizer's communication thread (runtime/communication_thread.h)
  // and this returns at once; on a GPU both happen here (the copy is asynchronous on the
  // stream). The reduce-scatter runs on the group's threads; reduce_gradients waits for it. The
  // optimizer's other collectives on the group (gathers, reduce_gradients) first wait until the
  // thread has started what it was given, so that every replica issues them in one order.
  // Collective in order: every replica starts the same segments in the same order. Starting one
  // twice in a step is a no-op.
  void start_reduce(size_t segment);
  // Returns once every collective start_reduce gave the communication thread is posted to the
  // data-parallel group. A caller's own collective over that group (the batch norms' statistics)
  // must come after this: posted while the thread still packs, it could overtake the thread's
  // reduce-scatter on one replica and not on another, and the replicas' collectives would no
  // longer match (Gloo: "Received data size doesn't match expected size").
  void post_started_collectives();
  size_t segments() const { return segments_.size(); }
  // [2] This replica's shard of the squared gradient norm (sum it over every rank).
  double local_grad_norm_squared() const;
  // Whether this replica's shard of the gradient holds an inf or a NaN (after [1]; the loss
  // scaler's test, train/loss_scaler.h).
  bool has_non_finite_gradient() const;
  void scale_gradients(double factor);
  // [3] Collective.
  void step();

  void set_learning_rate(double lr);
  double learning_rate() const;
  // The inner optimizer over this replica's shard (its state is the shard's).
  torch::optim::Optimizer& shard_optimizer() { return *inner_; }
  const std::string& optimizer_name() const { return name_; }
  int stage() const { return stage_; }
  bool offloaded() const { return offload_; }
  // offload_to_nvme: the file holding the optimizer state (its last step's figures, its pool);
  // null otherwise, and where the optimizer keeps no state (SGD without momentum).
  const OptimizerStateFile* state_file() const { return state_file_.get(); }

  // Collective: on replica 0, the whole state in checkpoint form (optimizer name and per-parameter
  // state under the names of `named`, which must name the constructor's parameters); the other
  // replicas add nothing.
  void capture(Checkpoint& part, const NamedTensors& named);
  // What this replica owns of each of its parameters (under every name `named` gives it): its
  // elements [offset, offset + values.numel()) of the parameter's flat elements, and the inner
  // optimizer's state over them ({} before the first step; "step" a scalar). Views, no copy: a
  // sharded checkpoint writes them where they are (train/sharded_checkpoint.h). The replicas'
  // slices of a parameter tile it; a parameter wholly in other replicas' pieces comes with no
  // elements. Not collective; valid until the next step.
  using OwnedSlice = OwnedElements;
  std::vector<OwnedSlice> owned_slices(const NamedTensors& named);
  // This replica's shard of the checkpoint's per-parameter state. Throws CheckpointError for
  // another optimizer, a wrong shape, or state for some of this rank's parameters but not all.
  void restore(const Checkpoint& checkpoint, const NamedTensors& named);

  // Bytes this replica holds: the optimizer state (the shard's, wherever it lives), and the
  // gradients on the parameters' device (the shard's unless offloaded, plus the parameters'
  // .grad() where they are defined: between steps none at stage 2).
  int64_t state_bytes() const;
  int64_t gradient_bytes() const;
  // Offloaded: the host memory it holds (the shard's values and gradient, the optimizer state
  // or, under nvme, the state file's buffer pool); 0 otherwise.
  int64_t host_bytes() const;
  // offload_to_nvme: the bytes of the state file on disk; 0 otherwise.
  int64_t file_bytes() const;
  // The figures above for some of its parameters (one pipeline rank's, where one process runs
  // several): parameter_bytes, gradient_bytes, state_bytes and host_bytes, the shard's parts
  // counted for the shard elements that belong to `parameters` (the state in proportion: every
  // element has the same). For all of them, the figures above.
  // reduce_buffers: the last reduce_gradients()'s flat gradient buffers (every segment's, in
  // flight together), counted in `host` instead when offloaded without replicas (the flat is
  // then built in host memory); for some parameters, their elements' share.
  // step_gradients (stages 2 and 3): the full gradients the last reduce_gradients() dropped.
  struct Holdings {
    int64_t parameters = 0, gradients = 0, optimizer_state = 0, host = 0, reduce_buffers = 0,
            step_gradients = 0, file = 0;
  };
  Holdings holdings(const std::vector<torch::Tensor>& parameters) const;

  // Elements: all of this rank's parameters, and this replica's shard (the padded flat size / R).
  int64_t total_elements() const { return total_; }
  int64_t shard_elements() const { return shard_size_; }

 private:
  // The padded flat vector: segment after segment, each padded to a multiple of its group's
  // members (R; an expert segment: the replicas holding its experts); member d's piece of a
  // segment is its d-th, and the shard is the pieces one after the other.
  struct Segment {
    C10dGroup* group = nullptr;  // whose members share it (null: this replica alone)
    int members = 1;
    int member = 0;
    std::vector<size_t> parameters;                  // indices into parameters_
    int64_t start = 0;                               // in the padded flat vector
    int64_t padded = 0;                              // its elements, padding included (piece x R)
    int64_t piece = 0;                               // elements of each replica's piece
    int64_t shard_offset = 0;                        // where this replica's piece sits in the shard
    torch::ScalarType gather_dtype = torch::kFloat;  // stage 3: what its all-gathers carry
    int stage = -1;                                  // the local stage computing with it (-1: any)
    int layer = -1;                                  // the layer of that stage (-1: none)
    size_t first_slice = 0, end_slice = 0;           // its slices_, [first, end)
    bool streamed = false;                           // its gradients stream (gradients())
  };
  // A parameter's elements inside this replica's piece of its segment: where they sit in the
  // parameter and in the shard. The shard is these slices (and padding), in shard order.
  struct Slice {
    size_t parameter = 0;
    int64_t parameter_offset = 0;
    int64_t shard_offset = 0;
    int64_t length = 0;
    bool counted = true;  // the global norm counts it (`counted`)
  };
  // A reduce-scatter or all-gather in flight, with its buffers.
  struct InFlight {
    size_t segment = 0;
    torch::Tensor flat;   // the segment's padded buffer (packed gradients, or gathered values)
    torch::Tensor piece;  // this replica's piece (received, or sent)
    std::function<void()> wait;
    double start_us = 0;
    bool add = false;         // a reduction: add the piece to the shard's gradient, not copy
    bool own_piece = false;   // `piece` is a buffer of its own (not the shard gradient's)
    bool pooled_flat = true;  // `flat` came from the pool (not a gradient reduced in place)
    int64_t bytes = 0;  // its buffers (`flat`, and `piece` where it is not the gradient's own)
  };

  // The data-parallel group (nullptr with one replica).
  C10dGroup* group() const;
  // Options of the collectives' buffers (the shard's dtype on comm_device_).
  torch::TensorOptions comm_options() const;
  // Where [1] reduces into: shard_grad_, or (staged_) comm_grad_, allocated on first use.
  torch::Tensor& reduced_gradient();
  // A parameter's elements as a flat view (its storage: whole, or at stage 3 gathered).
  torch::Tensor flat_parameter(size_t q) const;
  // Segment k's padded buffer of the parameters' gradients (`grad(q)`; zeros where undefined).
  // A segment of one parameter that needs no padding is reduced from its gradient itself
  // (`*pooled` false): no copy of a parameter-sized gradient (an embedding's) is made.
  torch::Tensor pack_gradients(size_t k, const std::function<torch::Tensor(size_t q)>& grad,
                               bool* pooled) const;
  // This replica's piece of segment k's values, where the collectives run: from the shard, or
  // (aliased_) packed from the parameters' slices.
  torch::Tensor piece_values(size_t k) const;
  // [1] A segment's reduce-scatter, started: into `out` (its piece of the reduced gradient), or
  // into a piece of its own (aliased_ stage 1, or added to the shard's gradient: `add`).
  InFlight start_reduce_scatter(size_t k, torch::Tensor flat, bool add, bool pooled_flat);
  // Waits for one, then puts its piece where it belongs (the shard's gradient, or at stage 1 the
  // parameters' .grad() slices), and logs it.
  void finish_reduce_scatter(InFlight& reduction);
  // Streaming: waits for every streamed reduction of the step and forgets them.
  void finish_streams();
  // ZeroOptions::return_freed_memory: the host heap's free pages back to the kernel.
  void return_freed_memory() const;
  // shard_ = this replica's slices of the parameters (not aliased_; with the shard in the file,
  // written there).
  void load_shard();
  // Calls f(slice, lo, hi) for each slice overlapping shard elements [first, end), with the
  // overlap [lo, hi).
  void for_each_slice_in(int64_t first, int64_t end,
                         const std::function<void(size_t, int64_t, int64_t)>& f) const;
  // The inner optimizer's state made before its first step, as slices of one buffer per field;
  // and a checkpoint's shard form written into those slices (false: the state is not laid out
  // so, or the form holds other fields: nothing written).
  // Returns the buffers (one per field, in state_fields() order; none where the optimizer keeps
  // no state).
  std::vector<torch::Tensor> place_state(const torch::TensorOptions& options);
  // The inner optimizer's state fields ("exp_avg", "exp_avg_sq"; "momentum_buffer"; none).
  std::vector<std::string> state_fields() const;
  // offload_to_nvme: [3] stepped from the file sub-group by sub-group; the file's state placed
  // into the inner optimizer (a checkpoint's view of it) and dropped again; the inner
  // optimizer's state written into the file (after a restore) and dropped.
  void step_from_file();
  void load_file_state();
  void drop_file_state();
  void store_file_state();
  bool restore_in_place(const Checkpoint& form);
  // What the gathers send at stage 3: shard_ itself, or (staged_) its copy where the collectives
  // run (device_shard_, kept in step).
  torch::Tensor gather_source() const;
  // Calls f(gradient of slice s, slice s) for every slice of the shard (aliased_ stage 1: the
  // slices of the parameters' .grad(); else the shard's gradient).
  void for_each_slice_gradient(
      const std::function<void(const torch::Tensor&, const Slice&)>& f) const;

  // Stage 3: segment k's parameters whole: started (the all-gather in flight into `gathered`) and
  // finished (their storage pointing into the gathered buffer).
  // `exact`: in the parameters' dtype whatever the segment's gather_dtype (gather_all).
  void start_gather_segment(size_t k, bool exact = false);
  void wait_segment(size_t k);
  void release_segment(size_t k);
  // peak_whole_bytes_ and peak_buffer_bytes_ after a change (by layer: one peak of both).
  void note_gather_peaks();
  // [0] Stage 3, while the parameters are the truth (after construction or gather_all()): their
  // values into the shard, and every segment freed. Called by zero_grad() and by the
  // StageParameters calls, so that a step run without zero_grad() first starts from them too.
  void take_parameters();
  // The segments of local stage j (and the shared one): StageParameters' stage -> segments.
  std::vector<size_t> segments_of_stage(int stage) const;
  // Stage 3 by layer: the unit of layer l of stage j (-1: none), and the persistent segments
  // (whole from a step's first use to its step()).
  int unit_of(int j, std::size_t l) const;
  void start_unit(int u);
  void release_unit(int u);
  void make_persistent_whole();

  enum class Residency { kFreed, kGathering, kWhole };
  struct Gather {
    Residency state = Residency::kWhole;
    torch::Tensor piece;     // this replica's piece, sent
    torch::Tensor gathered;  // every replica's pieces, the segment's padded flat values
    // qwZ: `piece` and `gathered` hold int8 blocks and their scales (uint8), dequantized into
    // the gather dtype on arrival.
    bool quantized = false;
    torch::ScalarType values_dtype = torch::kFloat;  // quantized: what they dequantize to
    bool from_secondary = false;  // hpZ: gathered within the partition from secondary_
    std::function<void()> wait;
    double start_us = 0;
    bool narrowed = false;     // gathered (or gathering) in a dtype narrower than the parameters'
    bool keep = true;          // its buffer goes back to the pool's spares (not gather_all's)
    bool own_piece = false;    // `piece` came from the pool (narrowed, or read from the file)
    int64_t buffer_bytes = 0;  // while gathering: `gathered`, and `piece` where it is a copy
  };
  // ---- ZeRO++ (sharded_optimizer_zeropp.cpp) ----
  // The groups of hpZ's partition and of qgZ's two hops, made collectively (every replica of the
  // rank's data-parallel group at construction).
  void make_zero_plus_plus_groups();
  // qwZ: g.gathered's blocks dequantized into a pooled buffer of g.values_dtype, which replaces it.
  void dequantize_gathered(size_t k, Gather& g);
  // hpZ: whether gather of segment k may read the partition's copy (it holds one, and the gather
  // is for a backward), and that gather started.
  bool reads_secondary(size_t k) const;
  void start_secondary_gather(size_t k, Gather& g);
  // hpZ: this member's part of a segment gathered from the shards, kept until the step.
  void keep_secondary(size_t k, const torch::Tensor& gathered);
  void drop_secondaries();
  // qgZ: `piece` = this replica's piece of the sum over replicas of `flat`, through the two
  // quantized all-to-alls (blocking).
  void quantized_reduce_scatter(const torch::Tensor& flat, torch::Tensor& piece);
  torch::Tensor quantized_exchange_sum(const torch::Tensor& parts, C10dGroup& group);

  std::shared_ptr<C10dGroup> hpz_group_;    // hpZ's partition (null: off)
  std::shared_ptr<C10dGroup> host_group_;   // qgZ: this host's replicas (null: off)
  std::shared_ptr<C10dGroup> cross_group_;  // qgZ: the replicas of this local index on each host
  std::vector<torch::Tensor> secondary_;    // hpZ, by segment (undefined: none this step)
  int64_t secondary_bytes_ = 0;
  // Whether the gathers being started serve a backward (a recompute included): stage 3 by layer,
  // from the plan's use; by stage, a segment gathered before in the step.
  bool gather_for_backward_ = false;
  std::vector<char> gathered_this_step_;  // by segment (by stage's rule above)
  std::vector<char> plan_backward_;       // by layer: per use of plan_, in a backward
  std::map<std::tuple<const schedule::Schedule*, int, ::pipetrain::Checkpoint>, std::vector<char>>
      plans_backward_;
  // Which use of the plan a unit's next gather serves (the first use of u from `from` on).
  bool use_is_backward(int u, size_t from) const;

  // Waits for the reductions start_reduce started (rethrowing a failure) and forgets them.
  void finish_started_reductions();
  // The stage a segment's collectives are logged under (-1: several).
  int stage_of_segment(size_t k) const { return segments_[k].stage; }

  Distributed* distributed_;  // null: one process, one replica
  int rank_ = 0;
  CollectiveLog* log_ = nullptr;
  std::vector<torch::Tensor> parameters_;
  std::vector<Gather> gathers_;       // stage 3: by segment
  bool parameters_are_truth_ = true;  // stage 3: since construction or gather_all()
  bool values_on_demand_ = false;     // ZeroOptions::initial_values, until the first load_shard
  int64_t whole_bytes_ = 0;           // stage 3: of the whole segments now
  int64_t peak_whole_bytes_ = 0;
  int64_t buffer_bytes_ = 0;  // stage 3: of the gathers in flight now
  int64_t peak_buffer_bytes_ = 0;
  // The gradient reductions' buffers in flight now (streamed, and at the step's end), and their
  // most since zero_grad().
  int64_t reduce_buffer_bytes_now_ = 0;
  int64_t reduce_buffer_bytes_ = 0;
  // Stages 2, 3: the full gradients reduce_gradients() dropped, plus the most bytes of one
  // layer's streamed gradients handed over at once.
  int64_t step_gradient_bytes_ = 0;
  int64_t streamed_gradient_peak_ = 0;
  int64_t gather_bytes_sent_ = 0;    // stage 3, since construction
  int64_t gather_bytes_uncast_ = 0;  // the same in the parameters' dtype
  std::vector<int64_t> offsets_;     // of each parameter in the padded flat vector
  std::vector<Segment> segments_;
  std::vector<Slice> slices_;  // in shard order
  int64_t total_ = 0;          // the parameters' elements
  int64_t flat_size_ = 0;      // the padded flat vector's
  int64_t shard_size_ = 0;
  // Segments started this step (start_reduce): whether (set by the caller), and their
  // reductions (written by the communication thread's jobs, read after its drain()).
  std::vector<char> reduce_started_;
  std::vector<InFlight> started_;
  std::deque<InFlight> streams_in_flight_;  // streamed reductions, oldest first
  int replicas_ = 1;
  int replica_ = 0;
  std::string name_;
  int stage_ = 1;
  bool offload_ = false;
  // Stages 1 and 2 without offload: the inner optimizer steps slices of the parameters.
  bool aliased_ = false;
  bool streams_ = false;   // stages 2, 3 under kStream with segments of layers
  bool by_layer_ = false;  // stage 3 by layer with segments of layers
  ZeroOptions zero_;
  torch::Device comm_device_ = torch::kCPU;  // where the collectives' buffers live
  // The shard and its gradient live apart from where the collectives run (offload, or a CUDA
  // rank under Gloo): reduce into comm_grad_ and copy, gather from a copy of the shard.
  bool staged_ = false;
  torch::Tensor shard_;         // not aliased_: this replica's parameters (the inner optimizer's)
  torch::Tensor shard_grad_;    // this replica's summed gradient (undefined: aliased_ stage 1)
  torch::Tensor device_shard_;  // stage 3, staged_: shard_'s copy on comm_device_
  torch::Tensor comm_grad_;     // staged_, during a reduction: shard_grad_'s values as reduced
  // What the inner optimizer steps, one alias per slice in shard order: of the parameters
  // (aliased_) or of shard_.
  std::vector<torch::Tensor> parts_;
  std::unique_ptr<torch::optim::Optimizer> inner_;
  // offload_to_nvme: the inner optimizer's state in a file (inner_ then holds none, except a
  // checkpoint's copy between capture or owned_slices and the next step), and each slice's step
  // count (Adam's) in memory.
  std::unique_ptr<OptimizerStateFile> state_file_;
  std::vector<int64_t> file_steps_;
  // offload_params_to_nvme: shard_ is not held (undefined, parts_ are meta tensors); its values
  // are the file's field values_field_ (after the state fields).
  bool params_in_file_ = false;
  size_t values_field_ = 0;
  // With the values in the file on CPU stages (not staged_): the shard's gradient is the file's
  // field grads_field_ too (shard_grad_ undefined). Each segment's reduced piece is added to its
  // range as it lands (the first of a step onto zeros: grad_written_), the step reads it with the
  // state, and scale_gradients' factors wait in grad_factors_, applied in order wherever the
  // gradient is read, as the in-memory shard would have had them applied.
  bool grads_in_file_ = false;
  size_t grads_field_ = 0;
  std::vector<char> grad_written_;
  std::vector<double> grad_factors_;
  // grads_in_file_: adds segment k's reduced piece to its range of the file's gradient;
  // `overwrite`: the piece is the segment's whole gradient (reduced once, at the step's end).
  void add_to_file_gradient(size_t k, const torch::Tensor& piece, bool overwrite);
  // grads_in_file_: f(values, slice, at) for each slice's gradient, a million elements at a time
  // (`at`: the chunk's offset from the slice's start), the factors applied.
  void for_each_file_gradient_chunk(
      const std::function<void(const torch::Tensor&, const Slice&, int64_t at)>& f) const;
  torch::TensorOptions state_options_;
  // Stage 3 by layer: its units (the segments of one layer), the layers', the persistent
  // segments, the plans by (schedule, rank, checkpoint), and the step's progress through one.
  struct Unit {
    int stage = -1;
    int layer = -1;
    std::vector<size_t> segments;
    int64_t bytes = 0;  // whole, in the parameters' dtype (padding included)
  };
  std::vector<Unit> units_;
  std::map<std::pair<int, int>, int> unit_of_layer_;
  std::map<std::pair<int, int>, std::vector<size_t>> streamed_of_layer_;
  std::vector<size_t> persistent_;
  std::map<std::tuple<const schedule::Schedule*, int, ::pipetrain::Checkpoint>, schedule::UnitPlan>
      plans_;
  schedule::UnitPlan plan_;
  size_t next_use_ = 0;
  std::vector<size_t> use_of_unit_;  // the use each unit was last acquired for
  // The reductions', gathers' and gathered segments' buffers, reused (train/buffer_pool.h).
  std::shared_ptr<BufferPool> pool_ = std::make_shared<BufferPool>();
  // Packs and starts the overlapped reduce-scatters on the CPU. Drained before the optimizer
  // issues any other collective on the group; last, so that it and its jobs end first.
  mutable CommunicationThread reduce_thread_;
};

// A ShardedOptimizer over `pipe`'s parameters, wired into it as the trainer runs it: the pipe's
// own replica sum turned off; with `overlap` (PipeOptions::overlap_gradient_reduction) or at
// stage 3 one segment per local stage (DistributedPipe::gradient_groups), each reduce-scattered
// as soon as that stage's last backward ends (overlap); at stage 3 the pipe gathers and frees
// the stages' parameters through it (DistributedPipe::set_stage_parameters, with
// `zero.reshard_after_forward()`). `counted`: as the constructor's. The pipe keeps a pointer to
// the optimizer: it must outlive the pipe's steps, and the pipe must outlive it. Throws BadInput
// for what the constructor refuses and for reshard_after_forward below stage 3.
std::unique_ptr<ShardedOptimizer> make_pipe_sharded_optimizer(
    Distributed& distributed, DistributedPipe& pipe, const std::vector<torch::Tensor>& counted,
    const std::string& optimizer, const OptimizerOptions& options, const ZeroOptions& zero,
    bool overlap);

// Bytes of an unsharded optimizer's per-parameter state (the figure ShardedOptimizer::state_bytes
// compares with).
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);
// The same for the state of `parameters` only (the optimizer's other parameters left out).
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer,
                              const std::vector<torch::Tensor>& parameters);
// Bytes of the defined .grad() of `parameters` (each tensor once).
int64_t gradient_bytes(const std::vector<torch::Tensor>& parameters);

}  // namespace pipetrain::train
