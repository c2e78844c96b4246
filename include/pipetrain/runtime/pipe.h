// Pipe: in-process pipeline-parallel training of a torch::nn::Sequential (the torchgpipe shape).
//
// The Sequential is cut into S stages (`balance` layers each); stage j lives on the device of the
// rank that runs it. Each mini-batch is cut into micro-batches (stage/microbatch.h) and a schedule
// (gpipe, 1f1b, interleaved-1f1b, zb-h1, or a custom one) says which stage runs which forward or
// backward when. One long-lived worker thread per rank runs the shared Interpreter
// (runtime/interpreter.h) over a LocalTransport. docs/RUNTIME.md draws the whole picture.
//
// Parameters: the Sequential's layers are registered as this module's children under their own
// names, so pipe->named_parameters() has exactly the Sequential's names ("0.weight", ...),
// and parameters(), torch::save/load, zero_grad(), train()/eval() work as for any module. The
// Pipe shares the layers with the Sequential it was given (no copy); clone() deep-copies.
//
// Transparency: with the same initial weights and data, the gradients of train_step() equal
// those of sequential training on the whole mini-batch with a mean-reduced loss (within float
// rounding), for every schedule, balance, micro-batch count and checkpoint mode.
//
// Random numbers: each stage draws from its own CPU generator stream (stage/stage_rng.h),
// seeded at construction from the default generator's seed (torch::manual_seed before building
// the Pipe makes runs repeatable; manual_seed() reseeds). Training forwards of different stages
// take turns on the default generator, so results do not depend on thread timing.
//
// Thread-safety: one step at a time. forward()/train_step() must not be called concurrently on
// one Pipe; they block until every rank finished.
//
// Example (examples/consumer/two_stage_1f1b.cpp is this, checked against sequential training):
//   torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::ReLU(),
//                               torch::nn::Linear(8, 1));
//   Pipe pipe(model, PipeOptions().stages(2).chunks(4).schedule("1f1b"));
//   torch::optim::SGD sgd(pipe->parameters(), torch::optim::SGDOptions(0.1));
//   sgd.zero_grad();
//   torch::Tensor loss = pipe->train_step(x, y, [](const torch::Tensor& out,
//                                                  const torch::Tensor& target) {
//     return torch::mse_loss(out, target);
//   });
//   sgd.step();
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "pipetrain/data/batch.h"
#include "pipetrain/runtime/step.h"
#include "pipetrain/schedule/schedule.h"
#include "pipetrain/stage/precision.h"
#include "pipetrain/stage/stage.h"

namespace pipetrain {

struct PipeOptions {
  /// Layers per stage, in order; must sum to the number of layers. Empty (default): `stages`
  /// stages as even as possible (the first L % S stages get one layer more).
  TORCH_ARG(std::vector<int64_t>, balance) = {};

  /// Number of stages S when `balance` is empty. With V virtual stages per rank there are
  /// K = S / V ranks (worker threads, devices).
  TORCH_ARG(int64_t, stages) = 1;
  /// Micro-batches per mini-batch (a batch with fewer rows uses one per row).
  TORCH_ARG(int64_t, chunks) = 1;
  /// Any make_schedule() name (schedule::schedule_names(): gpipe, 1f1b, interleaved-1f1b, the
  /// zero-bubble family, looped-bfs, dualpipev) or "custom".
  TORCH_ARG(std::string, schedule) = "gpipe";
  /// With schedule "custom": the schedule to run (compute-only or lowered; it is validated).
  /// Its micro-batch count must equal `chunks`.
  TORCH_ARG(std::optional<schedule::Schedule>, custom_schedule) = std::nullopt;
  /// Stages (chunks) per rank: V > 1 for interleaved-1f1b, interleaved-zb and looped-bfs (stage
  /// j on rank j % K), exactly 2 for the V-shaped zb-v, v-half, v-min and dualpipev (rank r holds
  /// r and 2K-1-r); schedule::default_virtual_stages(name) gives each family's usual value.
  TORCH_ARG(int64_t, virtual_stages) = 1;
  /// Which micro-batches recompute their forward before backward instead of keeping activations.
  TORCH_ARG(Checkpoint, checkpoint) = Checkpoint::kExceptLast;
  /// One device per rank; empty: every rank on the CPU.
  TORCH_ARG(std::vector<torch::Device>, devices) = {};
  /// Intra-op threads of each worker (at::set_num_threads on the worker). 0: the worker uses
  /// the thread count of the thread that built the Pipe. With a single rank there is no worker:
  /// the calling thread runs it, with this thread count for the duration of the step.
  TORCH_ARG(int64_t, threads_per_stage) = 0;
  /// How long a receive waits for its message before failing (a hang is never silent).
  TORCH_ARG(double, timeout_seconds) = 300.0;
  /// Mixed precision of every stage (stage/precision.h): fp32, bf16 (autocast; activations and
  /// gradients cross stages in bfloat16; float32 weights, loss and reductions) or fp16 (CUDA
  /// stages only).
  TORCH_ARG(Precision, precision) = Precision::kFloat32;
  /// Activation offload: the inputs that checkpointed micro-batches keep until their backward
  /// wait in pinned host memory instead, copied on a copy stream and brought back one action
  /// ahead of the backward (stage/stage.h). Needs checkpointed micro-batches (checkpoint always,
  /// or except_last with 2+ chunks). On CPU stages nothing moves: the bytes are counted
  /// (StageAccounting::peak_offloaded_bytes) but stay in the stage's memory.
  TORCH_ARG(bool, offload_activations) = false;
  /// Data-parallel replicas (DistributedPipe with --dp 2 or more, ZeRO 0): start summing a
  /// stage's gradients over the replicas as soon as its last backward of the step ends, in
  /// buckets of bucket_bytes, while the rank's other stages and the pipeline's cool-down go on
  /// (runtime/gradient_reducer.h). Off: one blocking all-reduce after the last action.
  TORCH_ARG(bool, overlap_gradient_reduction) = false;
  /// The bucket size of overlap_gradient_reduction (DDP's default, 25 MiB).
  TORCH_ARG(int64_t, bucket_bytes) = int64_t{25} << 20;
  /// DistributedPipe: run a forward of one micro-batch beside a backward of another wherever the
  /// schedule allows (schedule/overlap.h: DualPipe's overlapped F&B, Megatron's combined 1F1B),
  /// the backward on a second thread (compute lane 1, parallel/lane.h), so that the expert
  /// all-to-alls one waits in are covered by the other's compute. The model's expert-parallel
  /// layers need their group's second copy (DistributedOptions::expert_parallel_second_lane).
  /// CPU stages, checkpoint never, no parameter hooks (ZeRO 2/3) and no tensor parallelism:
  /// DistributedPipe refuses the rest.
  TORCH_ARG(bool, overlap_expert_exchanges) = false;
};

/// Throws pipetrain::BadInput when options.offload_activations() has nothing to move: checkpoint
/// never, or except_last with a single chunk (no micro-batch is checkpointed).
void check_offload_options(const PipeOptions& options);

/// The range of PipeOptions::timeout_seconds: from a millisecond (the transports' resolution) to
/// 1e7 seconds (about 116 days; a longer wait would overflow the clocks it is added to).
inline constexpr double kMinTimeoutSeconds = 1e-3;
inline constexpr double kMaxTimeoutSeconds = 1e7;
/// options.timeout_seconds() as the transports' duration. Throws pipetrain::BadInput naming the
/// value unless it is a number in [kMinTimeoutSeconds, kMaxTimeoutSeconds] (not NaN, not inf).
std::chrono::milliseconds timeout_of(const PipeOptions& options);

/// Layers per stage for a Sequential of `layers` layers: options.balance() checked (every entry
/// >= 1, at most `layers` stages, summing to `layers`), or options.stages() stages as even as
/// possible. Both runtimes lay out their stages with it. Throws pipetrain::BadInput naming the
/// balance.
std::vector<int64_t> stage_balance(const PipeOptions& options, int64_t layers);

/// The layers (indices into the Sequential) of the stages pipeline rank `rank` runs under
/// `options` for a Sequential of `layers` layers, in order: what a rank of a multi-process run
/// must hold in memory (models/llama.h builds only those). Throws what stage_balance and
/// training_schedule_for throw.
std::vector<int64_t> rank_layers(const PipeOptions& options, int64_t layers, int rank);

/// The lowered, validated training schedule that `options` asks for on `ranks` ranks, `stages`
/// stages and `microbatches` micro-batches: the named family, or the custom schedule (which must
/// have those counts). Both runtimes (Pipe, DistributedPipe) build theirs with it. Throws
/// pipetrain::BadInput naming the schedule, the counts and what to change, and
/// pipetrain::ScheduleInvalid when the schedule does not validate.
schedule::Schedule training_schedule_for(const PipeOptions& options, int ranks, int stages,
                                         int microbatches);

class PipeImpl : public torch::nn::Cloneable<PipeImpl> {
 public:
  // Throws pipetrain::BadInput naming the bad value for: balance not summing to the layer count or
  // with a non-positive entry, more stages than layers, stages not divisible by virtual_stages,
  // devices list length != ranks, chunks < 1, virtual_stages < 1, an unknown schedule (listing
  // the valid ones), a custom schedule that does not fit; pipetrain::ScheduleInvalid for a
  // custom schedule that does not validate.
  PipeImpl(torch::nn::Sequential model, PipeOptions options);
  PipeImpl(
      const PipeImpl& other);  // deep copy of the layers (for clone()); no workers until reset()
  // Shares `other`'s layers and builds workers of its own (Cloneable::clone_ assigns a clone
  // this way when a Pipe is a child of the module being cloned).
  PipeImpl& operator=(const PipeImpl& other);
  ~PipeImpl() override;

  // (Re)builds stages, workers and the transport; registers the layers.
  void reset() override;

  // Inference: each micro-batch runs through the stages, pipelined over the workers, under
  // NoGradGuard; nothing is stashed or checkpointed; train()/eval() is left as the user set it.
  // Returns the last stage's output, micro-batches concatenated along dim 0, on the last rank's
  // device.
  torch::Tensor forward(torch::Tensor input);
  std::vector<torch::Tensor> forward(std::vector<torch::Tensor> inputs);  // tuple in and out
  // The same for token rows laid out by `layout` (data/sequence_layout.h; null: none): each
  // micro-batch's rows of it are installed around its actions. REQUIRES the layout's rows and
  // width to be the input's [rows, width]; BadInput otherwise.
  torch::Tensor forward(torch::Tensor input, std::shared_ptr<const data::SequenceLayout> layout);
  std::vector<torch::Tensor> forward(std::vector<torch::Tensor> inputs,
                                     std::shared_ptr<const data::SequenceLayout> layout);

  // One training step: forward, loss (weighted by micro-batch rows / batch rows) and backward of
  // every micro-batch by the schedule. Gradients accumulate into the parameters' .grad(); the
  // caller zeroes them and runs the optimizer. Returns the mini-batch loss (the mean of the
  // per-row losses), detached, on the last rank's device.
  // Throws pipetrain::BadInput for inputs it cannot split (no dim 0, target rows != input rows),
  // and StepError (runtime/interpreter.h, a pipetrain::Error) naming stage, micro-batch, rank and
  // the cause when any action fails; its kind() is the cause's (Timeout when a rank waited
  // longer than timeout_seconds, BadInput for a misused skip, Runtime for a layer's own
  // exception). The Pipe is then ready for the next step.
  // REQUIRES: target has as many rows (dim 0) as the input.
  torch::Tensor train_step(torch::Tensor input, torch::Tensor target, const LossFn& loss_fn);
  torch::Tensor train_step(std::vector<torch::Tensor> inputs, torch::Tensor target,
                           const LossFn& loss_fn);
  // The same for a batch with row weights and a token layout (data/batch.h): micro-batch i's loss
  // weighs weight(i) / weight(batch), and with a layout each micro-batch is cut to its own width.
  torch::Tensor train_step(const data::Batch& batch, const LossFn& loss_fn);

  // The lowered training schedule of the last step (before any step: the one for `chunks`).
  const schedule::Schedule& schedule() const;
  const PipeOptions& options() const { return options_; }
  torch::nn::Sequential sequential() const { return model_; }
  int64_t num_stages() const;
  int64_t num_ranks() const;
  // Layers per stage as built.
  const std::vector<int64_t>& balance() const { return balance_; }
  // Device of stage j.
  torch::Device stage_device(int64_t j) const;

  // Per stage j, for the last step: peak stashed micro-batches and bytes, forwards run.
  std::vector<StageAccounting> stage_accounting() const;
  // Per rank r, for the last step: the most bytes its stages stashed at once (RankStash).
  std::vector<int64_t> rank_peak_stashed_bytes() const;
  // Every action the last step ran: (rank, action, start, end) in microseconds from its start.
  const std::vector<ActionEvent>& last_events() const;

  // Restarts every stage's random stream from `seed` (stage j gets a seed derived from seed, j).
  void manual_seed(uint64_t seed);
  // Every stage's random stream (StageRng::state()), by stage index; restore_stage_rng_states puts
  // them back (stages not in `states` keep theirs). A checkpoint keeps them (train/checkpoint.h).
  std::map<int, torch::Tensor> stage_rng_states() const;
  void restore_stage_rng_states(const std::map<int, torch::Tensor>& states);

 private:
  struct Runtime;
  const schedule::Schedule& training_schedule(int microbatches);
  const schedule::Schedule& inference_schedule(int microbatches);
  std::vector<RankResult> run_step(const schedule::Schedule& schedule, const StepData& data);
  Runtime& runtime() const;

  torch::nn::Sequential model_;
  PipeOptions options_;
  std::vector<int64_t> balance_;
  std::unique_ptr<Runtime> runtime_;
};

TORCH_MODULE(Pipe);

}  // namespace pipetrain
