// StepRunner: one training step, whatever runs it -- plain sequential training, the in-process
// Pipe (a worker thread per rank), or one rank of a multi-process DistributedPipe. The Trainer
// (train/trainer.h) talks only to this interface, so epochs, checkpoints, clipping, tracing and
// progress are written once for all three.
//
//   Trainer (every rank)                   StepRunner
//   --------------------                   ----------
//   zero grads, set lr                     step(batch)           -> loss of the whole mini-batch
//   clip                                   grad_norm_squared()   -> summed over every rank
//   optimizer.step()                       parameters()          (this rank's, each tensor once)
//   checkpoint / evaluate                  gather(part)          -> every rank's part, merged,
//                                                                   on the main rank
//
// Ownership: a runner keeps a handle to the model (and the Distributed of a multi-process run),
// which must outlive it. Thread-safety: used by the training loop's thread only.
//
// Example (2 stages in one process):
//   LossFn mse = [](const torch::Tensor& out, const torch::Tensor& target) {
//     return torch::mse_loss(out, target);
//   };
//   auto runner = make_pipe_runner(model, mse, PipeOptions().stages(2).chunks(4).schedule("1f1b"));
//   double loss = runner->step(x, y);
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include "pipetrain/data/batch.h"
#include "pipetrain/runtime/distributed.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/runtime/step.h"
#include "pipetrain/train/checkpoint.h"
#include "pipetrain/train/event_log.h"
#include "pipetrain/train/optimizer.h"
#include "pipetrain/train/sharded_checkpoint.h"
#include "pipetrain/train/sharded_optimizer.h"

namespace pipetrain::train {

// (first name, second name) of a parameter that two layers share (a tied embedding).
using TiedNames = std::vector<std::pair<std::string, std::string>>;

class StepRunner {
 public:
  virtual ~StepRunner() = default;

  // Forward + backward of one mini-batch (gradients accumulate into .grad()); returns its loss,
  // the same value on every rank. The batch's row weights and token layout (data/batch.h) say
  // what each row's loss counts and how its tokens divide into documents.
  virtual double step(const data::Batch& batch) = 0;
  // The same for a batch of plain rows.
  double step(const torch::Tensor& inputs, const torch::Tensor& targets) {
    return step(data::Batch(inputs, targets));
  }
  // Dynamic loss scaling (train/loss_scaler.h): the next steps differentiate the loss times
  // `scale`, so the gradients come out times `scale`; step() still returns the unscaled loss.
  void set_loss_scale(double scale) { loss_scale_ = scale; }
  double loss_scale() const { return loss_scale_; }
  // This rank's parameters, each tensor once (for the optimizer and clipping).
  virtual std::vector<torch::Tensor> parameters() = 0;
  // This rank's parameters and buffers under the full model's names.
  virtual NamedTensors named_parameters() = 0;
  virtual NamedTensors named_buffers() = 0;
  // Squared global L2 norm of every gradient of the model (each tensor counted once).
  virtual double grad_norm_squared() = 0;
  // The random streams this rank's stages draw from (dropout), by stage index; {} where the
  // model draws from torch's default generator (sequential training: capture_torch_rng has it).
  virtual std::map<int, torch::Tensor> stage_rng_states() { return {}; }
  // Puts back what stage_rng_states() returned (entries of stages not held here are ignored).
  virtual void restore_stage_rng_states(const std::map<int, torch::Tensor>& states) {
    (void)states;
  }
  // Events of the last step, relative to its start, and the rank to file them under (-1: keep).
  virtual std::vector<ActionEvent> last_events() = 0;
  virtual int event_rank() const { return -1; }
  // Pipeline ranks drawn in the trace (rows).
  virtual int trace_rows() const = 0;
  // One line saying what runs the steps ("2 stages on 2 ranks (balance 3 3), 4 micro-batches,
  // schedule 1f1b, checkpoint never").
  virtual std::string description() const = 0;
  // True on the rank that prints, evaluates and writes files.
  virtual bool is_main() const { return true; }
  // Every rank passes its part; the main rank gets them merged, other ranks nullopt.
  virtual std::optional<Checkpoint> gather(const Checkpoint& part) { return part; }
  // Sharded checkpoints (train/sharded_checkpoint.h): where this rank's tensors lie in the
  // global ones (its tensor-parallel place, its data-parallel replica).
  virtual ShardPlacement shard_placement() const { return {}; }
  // Every rank passes a text; the main rank gets every rank's in rank order, the others {}.
  virtual std::vector<std::string> gather_text(const std::string& mine) { return {mine}; }
  // Every rank waits until every rank is here.
  virtual void barrier() {}
  // Every rank passes its events; the main rank gets them merged.
  virtual EventLog gather_events(const EventLog& mine) { return mine; }
  // Tensor bytes this rank's transport has sent to other ranks so far (activations, gradients);
  // 0 where stages share a process.
  virtual int64_t transport_bytes_sent() const { return 0; }
  // The last step's data-parallel gradient sum: seconds this rank waited for it after its
  // schedule's last action (DistributedPipe::last_exposed_reduce_seconds); 0 without replicas.
  virtual double last_exposed_reduce_seconds() const { return 0; }
  // The last step's data-parallel collectives (runtime/collective_log.h), for the trace; {}
  // without replicas. Read after the optimizer's step, which adds its own.
  virtual std::vector<CollectiveEvent> last_collectives() const { return {}; }
  // Sum of `value` over every rank (a collective in a multi-process run).
  virtual double sum_over_ranks(double value) { return value; }
  // The same for each entry of `values` at once (one collective).
  virtual std::vector<double> sum_over_ranks(std::vector<double> values) { return values; }
  // The processes the run's ranks live in, and this one's index (a multi-process run: the world
  // size and the world rank; in one process: 1 and 0).
  virtual int processes() const { return 1; }
  virtual int process_index() const { return 0; }
  // Data-parallel replicas: what this rank's deferred batch norms tracked in the step, summed over
  // its replicas (DeferredBatchNormImpl::sum_tracked_over), so that the commit after it uses the
  // whole mini-batch. Collective over the replicas; a no-op without them.
  virtual void sum_batch_norm_statistics() {}

  // What one pipeline rank held in this process over the last step, for memory reports
  // (train/memory_report.h).
  struct RankHoldings {
    int rank = 0;                           // the world rank (in one process: the pipeline rank)
    std::vector<int> stages;                // the stages it runs
    std::vector<torch::Tensor> parameters;  // its parameters, each tensor once
    // The most bytes its stages stashed at once in the last step (RankStash).
    int64_t peak_activation_bytes = 0;
    // Peak message buffers of its transport in the last step, posted receives and sends in
    // flight (0 where stages share a process).
    int64_t peak_receive_buffer_bytes = 0;
    int64_t peak_send_buffer_bytes = 0;
    // Activation offload: the peak bytes of stashed inputs in host memory in the last step, summed
    // over its stages (an upper bound of the rank's own peak when it runs several).
    int64_t peak_offloaded_bytes = 0;
    // The data-parallel gradient sum's buffers in the last step (DistributedPipe::
    // last_reduce_buffer_bytes; a ZeRO optimizer reports its own).
    int64_t reduce_buffer_bytes = 0;
  };
  // The ranks this process runs (the Pipe: all of them; a DistributedPipe: its own; sequential
  // training: one rank of every parameter, its activations not measured).
  virtual std::vector<RankHoldings> rank_holdings() {
    return {RankHoldings{0, {0}, parameters(), 0, 0, 0, 0, 0}};
  }
  // Ranks of the whole job (the world size; in one process, the pipeline ranks).
  virtual int total_ranks() const { return 1; }
  // ZeRO: an optimizer sharded over this rank's data-parallel replicas (train/
  // sharded_optimizer.h), after which step() leaves the gradient reduction to it. Only a
  // multi-process runner has one, with replicas or with zero.offload(): the others throw
  // BadInput. Stage 3: the runner's steps gather each stage's parameters around its actions
  // (zero.reshard_after_forward(): around every action, else from its first to its last).
  virtual std::unique_ptr<ShardedOptimizer> make_sharded_optimizer(const std::string& optimizer,
                                                                   const OptimizerOptions& options,
                                                                   const ZeroOptions& zero);

 protected:
  // `loss` times the loss scale (for the runners' step()).
  LossFn scaled(const LossFn& loss) const {
    return [this, &loss](const torch::Tensor& out, const torch::Tensor& target) {
      torch::Tensor value = loss(out, target);
      return loss_scale_ == 1.0 ? value : value * loss_scale_;
    };
  }

 private:
  double loss_scale_ = 1.0;
};

// Sequential (no pipeline) training of `model`: forward, loss, backward on the whole batch. The
// reference a pipeline must reproduce. With bf16 the forward runs under autocast and the loss in
// float32, as in a pipeline's stages (stage/precision.h). The batch moves to the device of the
// model's parameters (move the model first to train it on a GPU).
std::unique_ptr<StepRunner> make_sequential_runner(torch::nn::Sequential model, LossFn loss,
                                                   Precision precision = Precision::kFloat32);

// The in-process Pipe over `model` (defer its batch norms first: stage/batchnorm.h).
std::unique_ptr<StepRunner> make_pipe_runner(torch::nn::Sequential model, LossFn loss,
                                             const PipeOptions& options);

// How a tensor-parallel model cuts parameter `name` across its group (the dimension, and how many
// ranks share a slice), or nullopt for a tensor every tp rank holds whole
// (models::tensor_parallel_split for the Llama model).
using TensorParallelSplit =
    std::function<std::optional<parallel::TensorSplit>(const std::string& name)>;

// How a model is split over the tensor-parallel group (parallel/tensor_parallel.h).
struct TensorParallelModel {
  TensorParallelSplit split;
  // Sequence parallelism: a whole tensor's gradient is then each rank's share of the sequence,
  // summed over the group after every step's schedule, before the replicas' sum
  // (DistributedPipe::set_tensor_parallel_summed).
  bool sequence_parallel = false;
  // Whole tensors whose backward sums their gradient over the group already (Qwen3's q_norm /
  // k_norm: models::tensor_parallel_summed_in_backward): left out of that sum. Empty: none.
  std::function<bool(const std::string& name)> summed_in_backward;
};

// One rank of a multi-process run over `model` (every rank builds the same model and calls this
// with the same arguments). `description` is what description() returns; `tied` names the tied
// parameters, so the gradient norm counts each once; `device`: where this rank's stages run
// (DistributedPipe's; e.g. cuda:LOCAL_RANK). With tensor parallelism (the Distributed's T > 1)
// `tensor_parallel` says how the model is cut: gather() then joins the slices (parameters and
// optimizer state) into whole tensors and the gradient norm counts replicated tensors once.
std::unique_ptr<StepRunner> make_distributed_runner(
    Distributed& distributed, torch::nn::Sequential model, LossFn loss, const PipeOptions& options,
    std::string description, const TiedNames& tied = {}, const torch::Device& device = torch::kCPU,
    TensorParallelModel tensor_parallel = {});

}  // namespace pipetrain::train
