// DistributedPipe: multi-process pipeline (x data) parallel training of a torch::nn::Sequential.
// The multi-process counterpart of Pipe (pipe.h): the same PipeOptions, the same Stage and the
// same Interpreter, with a C10dTransport between processes instead of worker threads.
//
// Every rank builds the same Sequential (same seed) and the same DistributedPipe; each keeps and
// runs only the stages its pipeline rank holds. The layers of other ranks' stages may hold their
// parameters on the meta device (shapes only: rank_layers in pipe.h says which layers a rank
// holds; models/llama.h builds only those): they are never moved or run here. One train_step, on
// every rank:
//
//   [1] take this replica's share of the mini-batch rows (replica d of R: the d-th of R nearly
//       equal contiguous parts), cut it into `chunks` micro-batches; each micro-batch loss is
//       weighted by its rows / the WHOLE mini-batch's rows
//   [2] run the Interpreter for this pipeline rank over the lowered schedule
//   [3] sum each tied weight's gradient over the pipeline ranks holding it (a parameter tensor
//       used by layers of stages on different ranks is a tie; found by identity), and the
//       gradients of set_tensor_parallel_summed's tensors over the tensor-parallel group
//   [4] sum gradients over the replicas (Distributed::allreduce_gradients); an expert-parallel
//       model's experts over the replicas that hold the same experts
//   [5] the mini-batch loss, summed over replicas, on every rank (broadcast_loss)
// so that after the optimizer step every rank's parameters equal sequential training's.
//
// Ownership: shares the layers with the Sequential; holds a reference to the Distributed, which
// must outlive it. Thread-safety: one step at a time, from one thread.
//
// Example (examples/consumer/two_processes.cpp is this, with launch_self starting the ranks and
// rank 0 checking the gathered weights against sequential training):
//   int main() {  // run under torchrun, or by launch_local / launch_self (runtime/launcher.h)
//     return run_distributed(DistributedOptions(), [](Distributed& distributed) {
//       torch::manual_seed(0);  // every rank builds the same model
//       torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::ReLU(),
//                                   torch::nn::Linear(32, 4));
//       DistributedPipe pipe(distributed, model, PipeOptions().stages(2).chunks(4));
//       torch::optim::SGD sgd(pipe.parameters(), torch::optim::SGDOptions(0.05));
//       sgd.zero_grad();
//       double loss = pipe.train_step(x, y, mse).item<double>();  // every rank: the same x, y
//       sgd.step();
//       auto all = pipe.gather_parameters();  // rank 0: every stage's parameters
//     });
//   }
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include "pipetrain/runtime/collective_log.h"
#include "pipetrain/runtime/distributed.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/runtime/step.h"
#include "pipetrain/schedule/schedule.h"
#include "pipetrain/stage/stage.h"

namespace pipetrain {

class DistributedPipe {
 public:
  // Takes the same PipeOptions as Pipe, read per rank: balance, stages, chunks, schedule (or
  // custom_schedule), virtual_stages and checkpoint as there; devices: one per pipeline rank, this
  // rank's stages on devices[pipeline_rank] (empty: on `device`); threads_per_stage: this rank's
  // intra-op threads during train_step and forward (0: the caller's); timeout_seconds: how long a
  // receive waits, never longer than DistributedOptions::timeout. Throws pipetrain::BadInput when
  // stages / virtual_stages differs from the job's pipeline ranks (naming both), when devices has
  // another length or disagrees with `device`, or for anything Pipe rejects.
  DistributedPipe(Distributed& distributed, torch::nn::Sequential model, PipeOptions options,
                  torch::Device device = torch::kCPU);
  ~DistributedPipe();
  DistributedPipe(const DistributedPipe&) = delete;
  DistributedPipe& operator=(const DistributedPipe&) = delete;

  // One training step ([1]..[5] above). `input` and `target` are the whole mini-batch (every rank
  // passes the same; only the ranks of the first and last stage read them). Gradients accumulate
  // into this rank's parameters' .grad(). Returns the mini-batch loss on every rank, as Pipe's
  // train_step does: a detached 0-dim tensor (float64, on the CPU here).
  torch::Tensor train_step(const torch::Tensor& input, const torch::Tensor& target,
                           const LossFn& loss_fn);
  // The same for a batch with row weights and a token layout (data/batch.h), as Pipe's: the
  // weights relative to the whole mini-batch's (the replicas' gradients are summed), each
  // micro-batch of this replica's rows cut to its own width.
  torch::Tensor train_step(const data::Batch& batch, const LossFn& loss_fn);

  // Forward-only evaluation, as Pipe::forward: no stash, no gradient (set the model's eval mode
  // first if it has dropout or batch norm). Every rank passes the same mini-batch and each replica
  // runs its share of the rows. Returns that share's output on the ranks that hold the last
  // stage, an undefined tensor on the others. Collective: every rank calls it.
  // With a layout (data/sequence_layout.h), its rows are installed around each micro-batch's
  // actions.
  torch::Tensor forward(const torch::Tensor& input,
                        std::shared_ptr<const data::SequenceLayout> layout = nullptr);

  // Whether train_step sums the gradients over the replicas ([4]; on by default). A ZeRO
  // optimizer (train/sharded_optimizer.h) turns it off and reduce-scatters them itself; tied
  // weights ([3]) are still summed over their holders.
  void set_allreduce_gradients(bool on) { allreduce_gradients_ = on; }

  // This rank's parameters (each tensor once) grouped by the one local stage whose backwards make
  // their gradients, {stage, tensors} by stage; last, under stage -1, the tensors whose gradients
  // are final only after the step: those several local stages share (a tie within the rank), those
  // tied to other ranks' and those summed over the tensor-parallel group ([3]). What a ZeRO
  // optimizer segments its layout by.
  std::vector<std::pair<int, std::vector<torch::Tensor>>> gradient_groups() const;
  // With PipeOptions::overlap_gradient_reduction and set_allreduce_gradients(false) (ZeRO):
  // called during train_step with stage j after this rank's last B or W of j in the step, so that
  // the caller starts reducing j's gradients (ShardedOptimizer::start_reduce). Empty: none.
  void set_stage_gradients_hook(std::function<void(int stage)> hook) {
    stage_gradients_hook_ = std::move(hook);
  }

  // Sequence parallelism: tensors every tp rank holds whole whose gradient each rank has only a
  // share of; [3] sums their gradients over the tensor-parallel group, before the replicas' sum
  // (and before any overlapped reduction of them starts).
  void set_tensor_parallel_summed(std::vector<torch::Tensor> tensors) {
    tensor_parallel_summed_ = std::move(tensors);
  }

  // Expert parallelism (parallel/expert_parallel.h): the experts this rank holds, whose
  // gradients [4] sums over the expert-data-parallel group (Distributed::
  // allreduce_expert_gradients) instead of over every replica.
  void set_expert_parameters(std::vector<torch::Tensor> tensors);
  const std::vector<torch::Tensor>& expert_parameters() const { return expert_parameters_; }

  // ZeRO-3 (train/sharded_optimizer.h): from the next train_step on, `parameters` makes each
  // local stage's parameters whole around the actions that compute with them and frees them after,
  // as schedule::parameter_residency plans it (`reshard_after_forward`: after every action, else
  // after the stage's last of the step). `parameters` must outlive the steps; null: off. forward()
  // does not gather: whole parameters are the caller's business there (ShardedOptimizer::
  // gather_all).
  void set_stage_parameters(StageParameters* parameters, bool reshard_after_forward) {
    stage_parameters_ = parameters;
    reshard_after_forward_ = reshard_after_forward;
    residency_.clear();
  }

  // ZeRO by layer (train/sharded_optimizer.h): from the next train_step on, every local stage
  // reports its layers' uses and hands over their weight gradients through `hooks`
  // (stage/parameter_hooks.h), whose begin_step the pipe calls before each step's schedule runs.
  // `hooks` must outlive the steps; null: off.
  void set_parameter_hooks(StageParameterHooks* hooks);
  // The parameters of each layer of local stage j (the stage's layer order; a layer's own
  // parameters() order). REQUIRES: j is local (BadInput otherwise).
  std::vector<std::vector<torch::Tensor>> stage_layer_parameters(int j) const;

  // The Sequential every rank builds (its layers on other ranks unused here), and the options.
  const torch::nn::Sequential& model() const { return model_; }
  const PipeOptions& options() const { return options_; }

  // This rank's parameters (each tensor once), for its optimizer.
  std::vector<torch::Tensor> parameters() const;
  // This rank's parameters under the Sequential's names ("0.weight", ...); a tied tensor appears
  // under each of its names held here.
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() const;
  // Every stage's parameters on rank 0 (the Sequential's names); {} on other ranks.
  std::map<std::string, torch::Tensor> gather_parameters();

  // The lowered schedule of the last step, and this rank's stages.
  const schedule::Schedule& schedule() const;
  std::vector<int> local_stages() const;
  // Events of this rank's last step (for traces and the cost model).
  const std::vector<ActionEvent>& last_events() const { return events_; }
  // The last step's data-parallel gradient sum ([4]): the seconds from the schedule's last action
  // (and the tie sums, [3]) until the sums were in the gradients (all of the blocking all-reduce
  // with its packing and
  // unpacking; with PipeOptions::overlap_gradient_reduction the wait for what was still in flight
  // and the unpacking), and the buckets it used (0: the blocking all-reduce, or no replicas).
  double last_exposed_reduce_seconds() const { return exposed_reduce_seconds_; }
  // The data-parallel collectives of the last step (cleared when a step starts; a ZeRO optimizer
  // wired to this pipe adds its own to it: train/sharded_optimizer.h).
  CollectiveLog& collective_log() { return collectives_; }
  const CollectiveLog& collective_log() const { return collectives_; }
  int last_reduce_buckets() const { return reduce_buckets_; }
  // The bytes of the last step's data-parallel gradient sum buffers (the all-reduce's flat copy,
  // or the overlap's buckets, in flight together); 0 without replicas or with
  // set_allreduce_gradients(false) (a ZeRO optimizer's reduce-scatter: its own figure).
  std::int64_t last_reduce_buffer_bytes() const { return reduce_buffer_bytes_; }
  // The transport's counters since this pipe was built (bundles and tensor bytes sent).
  C10dTransport::Stats transport_stats() const;
  // The transport's counters as they stood at the end of the last training step's schedule; its
  // peak buffer bytes are that step's (C10dTransport::Stats).
  const C10dTransport::Stats& step_transport_stats() const { return step_transport_stats_; }
  // Per stage j held by this rank, for the last step: peak stashed micro-batches and bytes,
  // forwards run (the same figures as Pipe::stage_accounting()[j] for the same model and step).
  std::map<int, StageAccounting> stage_accounting() const;
  // For the last step: the most bytes this rank's stages stashed at once (RankStash).
  int64_t rank_peak_stashed_bytes() const { return rank_stash_->peak; }
  // The random streams of this rank's stages, by stage index (Pipe::stage_rng_states()), and
  // putting them back (entries for stages held elsewhere are ignored).
  std::map<int, torch::Tensor> stage_rng_states() const;
  void restore_stage_rng_states(const std::map<int, torch::Tensor>& states);

 private:
  const schedule::Schedule& schedule_for(int microbatches);
  // This replica's rows (first, count) of a mini-batch of `rows` every rank passed whole.
  std::pair<int64_t, int64_t> replica_rows(int64_t rows) const;
  // Context parallelism: the columns of a micro-batch's rows this rank holds (the group's split).
  torch::Tensor context_parallel_columns(const torch::Tensor& tokens) const;
  // This rank's stages, emptied for a new step.
  std::map<int, Stage*> fresh_stages();

  Distributed& distributed_;
  torch::nn::Sequential model_;
  PipeOptions options_;
  torch::Device device_;
  int num_stages_ = 0;
  int num_ranks_ = 0;
  std::vector<int> stage_rank_;
  std::map<int, std::unique_ptr<Stage>> stages_;  // this rank's, by stage index
  std::shared_ptr<RankStash> rank_stash_ = std::make_shared<RankStash>();
  std::unique_ptr<C10dTransport> transport_;
  std::map<int, schedule::Schedule> schedules_;  // lowered, by M
  std::map<int, schedule::Schedule> inference_;  // lowered forward-only, by M
  // overlap_expert_exchanges: each training schedule's forward/backward pairs, per rank.
  std::map<const schedule::Schedule*, std::vector<std::vector<char>>> pairs_;
  // schedule::released_sends of each schedule above (by address: map nodes do not move).
  std::map<const schedule::Schedule*, std::vector<std::vector<int>>> released_;
  const std::vector<std::vector<int>>* released_for(const schedule::Schedule& s);
  const schedule::Schedule* last_ = nullptr;
  bool allreduce_gradients_ = true;
  std::vector<std::pair<std::string, torch::Tensor>> named_;
  std::vector<torch::Tensor> unique_;
  // Per unique tensor (by identity): the stages of this rank that use it.
  std::map<const void*, std::set<int>> local_holders_;
  double exposed_reduce_seconds_ = 0;
  std::function<void(int)> stage_gradients_hook_;
  StageParameters* stage_parameters_ = nullptr;
  StageParameterHooks* parameter_hooks_ = nullptr;
  CollectiveLog collectives_;
  bool reshard_after_forward_ = false;
  std::map<const schedule::Schedule*, schedule::ResidencyPlan> residency_;  // by schedule
  int reduce_buckets_ = 0;
  std::int64_t reduce_buffer_bytes_ = 0;
  std::vector<std::pair<std::string, torch::Tensor>> ties_;  // (declare_tie key, tensor) held here
  std::vector<torch::Tensor> tensor_parallel_summed_;        // [3]
  std::vector<torch::Tensor> expert_parameters_;             // [4], over their own group
  std::vector<torch::Tensor> dense_;                         // unique_ less expert_parameters_
  // The tensors whose gradients are final only after [3] (ties across ranks, tp-summed ones).
  std::set<const void*> summed_after_schedule() const;
  std::vector<ActionEvent> events_;
  C10dTransport::Stats step_transport_stats_;
};

}  // namespace pipetrain
