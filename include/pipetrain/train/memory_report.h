// Memory report: what each rank of a training run holds, predicted by the memory model
// (partition/memory.h) and measured on the run, category by category (`pipetrain train
// --report-memory`; docs/MEMORY.md).
//
//   predicted  predict_training_memory(): the model's activation bytes profiled at the run's
//              micro-batch size (partition/profiler.h, one chained pass under the allocation
//              counter), the loss's saved tensors measured the same way, then predict_memory()
//              for the run's balance, schedule, checkpoint mode, optimizer, ZeRO stage, data-
//              parallel size and process layout.
//   measured   measure_memory() after a step, on the ranks this process runs:
//                parameters       bytes of the rank's parameters (each tensor once)
//                gradients        bytes of their .grad() (ZeRO: ShardedOptimizer::gradient_bytes)
//                optimizer state  bytes of the optimizer's state tensors for them (ZeRO: the
//                                 shard's)
//                activations      the most bytes the rank's stages stashed at once in the last
//                                 step (RankStash, stage/stage.h: what the forwards and recomputes
//                                 kept, counted by the allocation counter)
//                receive buffers  the peak bytes of receives its c10d transport had posted in the
//                                 last step, not yet handed over
//                send buffers     the peak bytes of its sent messages not yet completed
//                offloaded to host  activation offload: per stage the most bytes of inputs
//                                 waiting in host memory in the last step, summed over the
//                                 rank's stages (StageAccounting::peak_offloaded_bytes)
//                gathered params  ZeRO-3: the most bytes of whole parameters at once in the
//                                 last step (ShardedOptimizer::peak_whole_parameter_bytes);
//                                 the parameters category is then the bytes allocated between
//                                 steps, the shard
//                reduce buffers   the last step's data-parallel gradient sum buffers: the
//                                 all-reduce's flat copy or the overlap's buckets
//                                 (DistributedPipe::last_reduce_buffer_bytes), ZeRO's reduce-
//                                 scatter input (ShardedOptimizer::Holdings::reduce_buffers)
//                step gradients   ZeRO 2/3: the full .grad() the last reduce-scatter dropped
//                                 (ShardedOptimizer::Holdings::step_gradients)
//              gather_memory() brings every rank's figures to the main rank.
//
// Not covered: fp16, CUDA stages' activations (their stash is estimated from the tensors they
// hold, not counted by the allocator), and transient buffers inside one action (a backward's
// gradient temporaries, an optimizer step's).
//
// Thread-safety: the training loop's thread; gather_memory() is collective.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include "pipetrain/partition/memory.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/train/step_runner.h"

namespace pipetrain::train {

// What one rank was measured to hold.
struct MeasuredRankMemory {
  int rank = 0;         // world rank
  int first_stage = 0;  // the first stage it runs (its pipeline rank follows from it)
  partition::RankMemory bytes;
};

// The ranks this process runs, measured now (after a step). `optimizer` steps every parameter
// of the runner unless `sharded` is given (ZeRO), whose figures are this rank's then.
std::vector<MeasuredRankMemory> measure_memory(StepRunner& runner,
                                               const torch::optim::Optimizer* optimizer,
                                               const ShardedOptimizer* sharded);

// Collective: every rank's measurement on the main rank, by rank (the others get theirs back).
std::vector<MeasuredRankMemory> gather_memory(StepRunner& runner,
                                              const std::vector<MeasuredRankMemory>& mine);

struct MemoryPrediction {
  std::vector<partition::RankMemory> ranks;  // per pipeline rank
  std::vector<int> stage_rank;               // pipeline rank of each stage
  std::int64_t microbatch_size = 0;          // rows per micro-batch (the largest one)
  std::int64_t loss_bytes = 0;               // what the loss keeps per micro-batch
};

struct MemoryRunOptions {
  std::string optimizer = "sgd";  // sgd | adam | adamw
  double momentum = 0.9;          // sgd's (0: no state)
  int zero = 0;
  bool reshard_after_forward = false;  // ZeRO 3's policy
  // ZeRO's other settings (the stage, resharding and offload above win over theirs); the
  // overlap and bucket size come from the PipeOptions.
  ZeroOptions zero_options;
  bool offload_optimizer = false;  // ZeRO-Offload
  bool async_checkpoint = false;   // --async-checkpoint: the snapshot of each save
  bool cast_gather = true;         // ZeRO 3 under bf16/fp16: ZeroOptions::cast_gather
  int data_parallel = 1;
  int expert_parallel = 1;  // --ep
  // Applied to the measured profile before the prediction: a mixture's planned routing
  // imbalance (models::apply_routing_imbalance). Null: the profile as measured.
  std::function<void(partition::ModelProfile&)> adjust_profile;
  bool processes = false;  // one process per pipeline rank (the c10d transport)
  // Where to profile: the model is moved there first where any of its parameters is elsewhere
  // (after training: the entries the main rank of --nproc builds only to profile, a
  // tensor-parallel mirror, stages of one process on several GPUs). None: where they all are.
  std::optional<torch::Device> device;
};

// Profiles `model` on the first rows of `inputs` (the mini-batch a replica runs is split into
// pipe.chunks() micro-batches) and predicts every pipeline rank's memory. The model is run in
// the mode it is in (training: dropout masks count) with autograd; its gradients are left as
// they were. The profile runs where the model's parameters are, so `inputs` and `targets` may be on
// the host for a model on one GPU (the activations are then the GPU's caching allocator's bytes).
// Throws pipetrain::BadInput for options the memory model does not cover and, without
// run.device, for a model whose parameters are on more than one device.
MemoryPrediction predict_training_memory(torch::nn::Sequential model, const torch::Tensor& inputs,
                                         const torch::Tensor& targets, const LossFn& loss,
                                         const PipeOptions& pipe, const MemoryRunOptions& run);

// The bytes `loss` keeps of `output` (what the last stage's micro-batch holds for its backward
// besides the layers'): the loss run once under the allocation counter, in float32 as the runtime
// runs it (a bf16 output's float32 copy counts only where the loss saves it).
std::int64_t loss_saved_bytes(const torch::Tensor& output, const torch::Tensor& targets,
                              const LossFn& loss, Precision precision);

// predict_training_memory in two parts: what it measures of the model (the profile at the run's
// micro-batch size, the loss's saved bytes), and the prediction from that, which may be asked
// again under other options that keep the micro-batch size and the stage count (ZeRO stage,
// checkpoint mode, offload: what `train` weighs when a run does not fit). A profile from
// elsewhere (models::profile_llama) serves as well.
struct TrainingMemoryProfile {
  partition::ModelProfile profile;
  int microbatches = 1;              // per replica and step
  std::int64_t microbatch_size = 0;  // rows of the largest
  std::int64_t loss_bytes = 0;       // what the loss keeps per micro-batch
};
TrainingMemoryProfile profile_training_memory(torch::nn::Sequential model,
                                              const torch::Tensor& inputs,
                                              const torch::Tensor& targets, const LossFn& loss,
                                              const PipeOptions& pipe, const MemoryRunOptions& run);
MemoryPrediction predict_from_profile(const TrainingMemoryProfile& measured,
                                      const PipeOptions& pipe, const MemoryRunOptions& run);

// One line per rank and category: predicted, measured, measured / predicted (replicas of a
// pipeline rank are compared with its prediction).
std::string memory_report_text(const MemoryPrediction& predicted,
                               const std::vector<MeasuredRankMemory>& measured);

// Activation offload after a step (PipeOptions::offload_activations): one line per rank of what
// waited in host memory at most (StepRunner::RankHoldings::peak_offloaded_bytes), and, for CPU
// stages, that nothing was freed by it. `cpu_stages`: the stages run on the CPU.
std::string offload_report_text(const std::vector<StepRunner::RankHoldings>& ranks,
                                bool cpu_stages);

}  // namespace pipetrain::train
