// Trainer: the training loop of pipetrain -- learning-rate schedule, optimizer step, gradient
// clipping, a diverged loss stopped with the step named, periodic and final checkpoints, resume,
// the measured trace -- over any StepRunner (sequential, in-process Pipe, one rank of a
// DistributedPipe). `pipetrain train` is argument parsing and printing around one of these.
//
//   for k in [first_step, total_steps):              (every rank runs the same loop)
//     [1] x, y = batches.at(k); lr = schedule(k); zero grads
//     [2] loss = runner.step(x, y)                   (throws pipetrain::Error naming step k)
//     [3] finite loss? commit deferred batch norms; clip by the global norm; optimizer step
//     [4] on_step(report)                            (progress; the main rank prints)
//     [5] every save_every steps: checkpoint         (collective: every rank sends its part)
//     [6] last step of an epoch: on_epoch_end(e)     (collective: evaluate via gather_model())
//   final checkpoint, then the trace and timeline files (collective)
//
// A checkpoint holds the parameters, buffers, optimizer state, position, torch's generator and
// every stage's random stream, so a resumed run (resume()) continues exactly where the saved one
// stood: with the same stage layout the final weights equal an uninterrupted run's, dropout
// included.
//
// Ownership: keeps references to the runner and the batch source, which must outlive it.
// Thread-safety: one thread (the training loop's); in a multi-process run every rank calls fit()
// and the collective methods together.
//
// Example (examples/consumer/torchscript_stages.cpp runs one, with a BatchSource):
//   auto runner = make_pipe_runner(model, loss, PipeOptions().stages(2).chunks(4));  // LossFn loss
//   MyBatches batches(...);                              // a BatchSource
//   Trainer trainer(model, *runner, batches, TrainerOptions(100).optimizer("adam").lr(1e-3));
//   trainer.on_step = [](const StepReport& r) { std::cout << r.step << " " << r.loss << "\n"; };
//   TrainSummary done = trainer.fit();
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "pipetrain/train/batch_source.h"
#include "pipetrain/train/checkpoint.h"
#include "pipetrain/train/event_log.h"
#include "pipetrain/train/loss_scaler.h"
#include "pipetrain/train/memory_report.h"
#include "pipetrain/train/sharded_optimizer.h"
#include "pipetrain/train/step_runner.h"

namespace pipetrain::train {

struct TrainerOptions {
  /// REQUIRES: total_steps >= 1.
  explicit TrainerOptions(int64_t total_steps) : total_steps_(total_steps) {}
  /// Optimizer steps of the whole run (a resumed run counts the steps before it too).
  TORCH_ARG(int64_t, total_steps);
  /// "sgd", "adam" or "adamw" (train/optimizer.h). Default "sgd".
  TORCH_ARG(std::string, optimizer) = "sgd";
  /// Peak learning rate. Default 0.01.
  TORCH_ARG(double, lr) = 0.01;
  /// SGD momentum. Default 0.9 (OptimizerOptions' default).
  TORCH_ARG(double, momentum) = 0.9;
  /// Decoupled (adamw) or L2 (sgd, adam) weight decay. Default 0.
  TORCH_ARG(double, weight_decay) = 0.0;
  /// Adam/AdamW moment decays and denominator epsilon. Defaults 0.9, 0.999, 1e-8 (torch's).
  TORCH_ARG(double, beta1) = 0.9;
  TORCH_ARG(double, beta2) = 0.999;
  TORCH_ARG(double, eps) = 1e-8;
  /// "constant", "cosine" (decays to min_lr at total_steps), or DeepSpeed's "warmup-lr",
  /// "warmup-decay-lr", "warmup-cosine-lr" (train/lr_schedule.h). Default "constant".
  TORCH_ARG(std::string, lr_schedule) = "constant";
  /// Warm-up over this many steps (linear from 0; DeepSpeed's: warmup_type). Default 0.
  TORCH_ARG(int64_t, warmup_steps) = 0;
  /// Floor of the cosine schedules. Default 0.
  TORCH_ARG(double, min_lr) = 0.0;
  /// DeepSpeed's schedules: "log" or "linear" warm-up. Default "log" (DeepSpeed's).
  TORCH_ARG(std::string, warmup_type) = "log";
  /// DeepSpeed's schedules: the rate the warm-up starts from. Default 0.
  TORCH_ARG(double, warmup_min_lr) = 0.0;
  /// The step at which a decaying schedule reaches its floor; 0 = total_steps. Default 0.
  TORCH_ARG(int64_t, lr_total_steps) = 0;
  /// Clip the global gradient L2 norm to this (over every rank); 0 = no clipping. Default 0.
  TORCH_ARG(double, clip_grad_norm) = 0.0;
  /// ZeRO stage: 0 (each replica holds the whole optimizer state), 1 (the optimizer state sharded
  /// over the data-parallel replicas), 2 (the gradients too: streamed into the shard during the
  /// step by default) or 3 (the parameters too: each layer gathered around its uses by default);
  /// stages 1 to 3 need a multi-process runner with replicas (train/sharded_optimizer.h).
  /// Default 0.
  TORCH_ARG(int, zero) = 0;
  /// ZeRO-3 by stage: free a stage's gathered parameters after every forward and backward and
  /// gather them again for the next, instead of keeping them from the stage's first action of a
  /// step to its last (ZeroOptions::reshard_after_forward). Default false.
  TORCH_ARG(bool, reshard_after_forward) = false;
  /// ZeRO-Offload (zero 1 to 3): the shard's float32 values, its gradient and the optimizer state
  /// in host memory, the optimizer stepped on the CPU (train/sharded_optimizer.h). Meant for CUDA
  /// stages; a multi-process runner with one replica accepts it too (the shard is everything).
  /// Default false.
  TORCH_ARG(bool, offload_optimizer) = false;
  /// ZeRO's other settings (train/sharded_optimizer.h: how stages 2 and 3 sum the gradients,
  /// what stage 3 gathers as one and its prefetch, live, reuse and persistence bounds); their
  /// stage, offload and resharding come from the three options above. Default: ZeroOptions'.
  TORCH_ARG(ZeroOptions, zero_options) = {};
  /// Dynamic loss scaling (train/loss_scaler.h): the loss is multiplied by a scale before
  /// backward, the gradients divided by it before clipping and the step, and a step whose
  /// gradients hold inf or NaN on any rank is skipped while the scale shrinks. fp16 training
  /// needs it; with powers of two it changes no float32 result. Default off.
  TORCH_ARG(bool, loss_scaling) = false;
  TORCH_ARG(LossScalerOptions, loss_scaler) = {};
  /// Every this many steps (and after the last), each process's peak resident memory so far is
  /// gathered to the main rank's StepReport (one collective); 0 = only at the end. Default 0.
  TORCH_ARG(int64_t, memory_every) = 0;
  /// Where checkpoints are written, at the end and every save_every steps; "" = none.
  TORCH_ARG(std::string, checkpoint_dir) = "";
  /// A checkpoint every this many steps (0 = only the final one). Default 0.
  TORCH_ARG(int64_t, save_every) = 0;
  /// "sharded" (the default): checkpoint_dir/step-N/ and checkpoint_dir/latest, every rank
  /// writing its own part (train/sharded_checkpoint.h); "file": checkpoint_dir/checkpoint.pt,
  /// gathered into one file by the main rank.
  TORCH_ARG(std::string, checkpoint_format) = "sharded";
  /// Sharded: keep the newest this many complete checkpoints (0 = all).
  TORCH_ARG(int, keep_checkpoints) = 0;
  /// Sharded: the step that saves copies the rank's part into host memory (pinned for a GPU's)
  /// and goes on; a thread writes it while training continues, and the checkpoint is committed
  /// after the first step at whose end every rank's writer is done. The next save and the end of
  /// training wait for it.
  TORCH_ARG(bool, async_checkpoint) = false;
  /// Stored in each checkpoint's metadata (model name, options, data, ...).
  TORCH_ARG(nlohmann::json, metadata) = nlohmann::json::object();
  /// Chrome trace of every step's actions, written by the main rank at the end; "" = none.
  TORCH_ARG(std::string, trace_path) = "";
  /// SVG timeline of the last measured step, written by the main rank at the end; "" = none.
  TORCH_ARG(std::string, timeline_path) = "";
  /// Measure what every rank holds after the last step (TrainSummary::memory; a collective at
  /// the end of fit(), train/memory_report.h). Default off.
  TORCH_ARG(bool, report_memory) = false;
};

// What on_step receives after each optimizer step.
struct StepReport {
  int64_t step = 0;     // global step just done, 0-based (k)
  int64_t epoch = 0;    // 0-based
  int64_t samples = 0;  // rows of the mini-batch
  // Token rows with a layout (data/batch.h): the tokens that are not padding, and the targets
  // counted in the loss (0 where the batch says neither: batch_tokens).
  int64_t tokens = 0;
  int64_t counted_targets = 0;
  double loss = 0;
  double lr = 0;
  bool main = true;       // true on the rank that prints
  bool skipped = false;   // loss scaling found a non-finite gradient: no optimizer step
  double loss_scale = 1;  // the scale this step's loss was multiplied by
  // At the steps TrainerOptions::memory_every names, on the main rank: each process's peak
  // resident memory so far (StepRunner::processes(), in order); empty otherwise.
  std::vector<int64_t> process_peak_bytes;
};

struct TrainSummary {
  int64_t steps = 0;  // steps run by this fit() (a resumed run: fewer than total_steps)
  double first_loss = 0;
  double last_loss = 0;
  double seconds = 0;
  // Each step's seconds on this rank: its forward, backward and optimizer step (what `seconds`
  // adds checkpoints, evaluations and the progress lines to).
  std::vector<double> step_seconds;
  int64_t samples = 0;
  int64_t tokens = 0;  // as StepReport's, summed over the steps
  int64_t counted_targets = 0;
  std::string checkpoint_path;  // the final checkpoint; "" when none was written
  int64_t trace_actions = 0;    // actions in the Chrome trace (main rank)
  int64_t timeline_step = -1;   // the step the SVG timeline draws (main rank)
  // Measured on this rank after the last step: bytes of optimizer state and of gradients held
  // (ZeRO: this replica's shards; stage 2 holds no full gradients then).
  int64_t optimizer_state_bytes = 0;
  int64_t gradient_bytes = 0;
  // Tensor bytes sent between ranks by this fit(), summed over every rank (activations and
  // gradients; 0 in one process).
  int64_t transport_bytes_sent = 0;
  // The data-parallel gradient sum's wait after each rank's last action, per step, the mean over
  // every rank and step (StepRunner::last_exposed_reduce_seconds); 0 without replicas.
  double exposed_reduce_seconds = 0;
  int64_t skipped_steps = 0;  // loss scaling: steps skipped for a non-finite gradient
  // With TrainerOptions::report_memory: what each rank held after the last step, every rank's on
  // the main rank (the others: their own); empty when no step ran.
  std::vector<MeasuredRankMemory> memory;
  // Each process's peak resident memory over the training steps (VmHWM, before what follows
  // them: the final checkpoint, the weights gathered for saving), on the main rank.
  std::vector<int64_t> process_peak_bytes;
};

class Trainer {
 public:
  // `model` is the whole model every rank built (the runner's model): the Trainer puts it in
  // training mode, commits its deferred batch norms after each step and gathers into it.
  // Builds the optimizer over runner.parameters(). Throws BadInput for bad options.
  Trainer(torch::nn::Sequential model, StepRunner& runner, const BatchSource& batches,
          TrainerOptions options);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Continues from `checkpoint`: optimizer state, torch's generator, the stages' random streams,
  // and the position (fit() starts at checkpoint.step). REQUIRES: the model's parameters were
  // restored (restore_model) before the runner was built. Throws CheckpointError when the
  // optimizer differs from the checkpoint's.
  void resume(const Checkpoint& checkpoint);

  // Runs steps first_step .. total_steps-1 ([1]-[6] above). Throws pipetrain::Error naming the
  // step when a step fails (the cause's kind) or the loss is not finite (NonFiniteLossError).
  // Under ZeRO-3 the parameters are sharded when it returns: gather_weights(), evaluate() and a
  // checkpoint make them whole (ShardedOptimizer::gather_all).
  TrainSummary fit();

  // Called on every rank after each step (see StepReport::main).
  std::function<void(const StepReport&)> on_step;
  // Called on every rank after each step, before on_step: counts of the step by series (a
  // mixture's tokens per expert of each MoE layer: layer -> counts), which a trace (--trace)
  // files as counter tracks under this rank (EventLog::add_counts). Empty: none.
  std::function<std::map<int64_t, std::vector<int64_t>>()> step_counts;
  // What the last sharded save wrote: on the main rank every rank's bytes and the seconds until
  // the checkpoint was complete, on the others their own; the host buffer this rank needed.
  struct SaveFigures {
    uint64_t bytes = 0;
    int64_t buffer_bytes = 0;
    double seconds = 0;
    int64_t snapshot_bytes = 0;  // async: the host copy of this rank's part
    // The peak resident memory while saving over the resident memory when the save began (a
    // window of its own: reset_peak_resident), the largest process's on the main rank; with
    // async_checkpoint until the snapshot is taken (it is in it). -1 where not measured.
    int64_t peak_excess_bytes = -1;
    bool main = false;  // the main rank's figures
    int processes = 1;  // that wrote it
  };
  // Called on every rank after the last step of each epoch (and after the last step when it ends
  // an epoch early); collective calls such as gather_model() may be made from it.
  std::function<void(int64_t epoch)> on_epoch_end;
  // Called on every rank after each sharded checkpoint is complete, with its directory and
  // last_save() (on the main rank: every rank's bytes, and the seconds until the last finished).
  std::function<void(const std::string& directory, const SaveFigures& figures)> on_checkpoint;

  // Collective: the whole model's parameters and buffers copied into `model` on the main rank
  // (returns true there); other ranks return false. REQUIRES every entry of `model` to be
  // materialized on the main rank (no meta placeholders: models/llama.h).
  bool gather_model();
  // Collective over every rank: under ZeRO-3 each rank's own parameters whole (their storage
  // back, until the next step frees them), for code that reads this rank's modules; a no-op
  // otherwise.
  void gather_parameters();
  // Collective: every rank's parameters and buffers merged into one Checkpoint (its parameters
  // and buffers only) on the main rank; nullopt on the others. Works whatever the main rank
  // holds itself (a rank that materialized only its own stages).
  std::optional<Checkpoint> gather_weights();
  // Collective: every rank's part captured and merged on the main rank, which writes it
  // atomically to `path` (other ranks write nothing).
  void save_checkpoint(const std::string& path, int64_t steps_done);
  // Collective: every rank writes what it owns into `directory`/step-N (no gather:
  // train/sharded_checkpoint.h), keeping the newest `keep` (0: all); returns the step directory.
  std::string save_sharded_checkpoint(const std::string& directory, int64_t steps_done,
                                      int keep = 0);

  const SaveFigures& last_save() const { return last_save_; }

  // Collective: the model's parameters written as a safetensors checkpoint of `tensors` (names
  // and shapes as Hugging Face's, sources "param/<name>": train/sharded_checkpoint.h) in
  // `directory`, by every process in parallel and with nothing gathered: each rank first writes
  // its own parameters' pieces into `directory`/.pipetrain-parameters (a sharded checkpoint of
  // the parameters alone), then each process writes its share of the output's shard files from
  // it, one tensor at a time; the main process writes the index, and the pieces are removed.
  // `extra_files` (name -> content: config.json) are written by the main process last, before
  // any rank returns. Returns every file written (relative to `directory`), on every rank.
  std::vector<std::string> save_safetensors(
      const std::string& directory, const std::vector<ExportedTensor>& tensors,
      SafetensorsExportOptions options,
      const std::vector<std::pair<std::string, std::string>>& extra_files = {});

  // The optimizer that steps this rank's parameters; with ZeRO the inner optimizer of this
  // replica's shard.
  torch::optim::Optimizer& optimizer();
  int64_t first_step() const { return first_step_; }
  const TrainerOptions& options() const { return options_; }

 private:
  // save_sharded_checkpoint's work; `parameters_only`: the parameters' pieces alone (no buffers,
  // optimizer state or random streams), for save_safetensors.
  std::string save_sharded(const std::string& directory, int64_t steps_done, int keep,
                           bool parameters_only, bool async);
  double learning_rate(int64_t k) const;
  double run_step(int64_t k, const data::Batch& batch);
  // [3]'s loss-scale check, clip and optimizer step, unsharded or sharded. Returns false when
  // the step was skipped (a non-finite gradient under loss scaling).
  bool update_parameters();
  void set_learning_rate(double lr);
  void zero_grad();
  // Collective: each process's peak resident memory so far, on the main rank (others: empty).
  std::vector<int64_t> gather_peak_resident();
  void write_trace(TrainSummary& summary);

  torch::nn::Sequential model_;
  int64_t peak_snapshot_ = 0;  // the largest async save snapshot so far (--report-memory)
  StepRunner& runner_;
  const BatchSource& batches_;
  TrainerOptions options_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;  // zero == 0
  std::unique_ptr<ShardedOptimizer> sharded_;           // zero 1 to 3
  std::optional<DynamicLossScaler> scaler_;             // loss_scaling
  bool last_step_skipped_ = false;
  std::vector<torch::Tensor> parameters_;  // runner_.parameters(), for clipping
  int64_t first_step_ = 0;
  EventLog events_;
  SaveFigures last_save_;
  struct PendingSave;
  std::shared_ptr<PendingSave> pending_save_;  // a sharded save not committed yet
  // Collective: commits the pending sharded save once every rank's file is written (wait: after
  // waiting for this rank's; else only if every rank's is done already). True when none is left.
  bool finish_sharded_save(bool wait);
  // The checkpoint of `steps_done` in the run's format; returns its path.
  std::string write_checkpoint(int64_t steps_done);
};

// The file a Trainer writes its checkpoints to in `directory`: "<directory>/checkpoint.pt".
std::string checkpoint_path(const std::string& directory);

// The restart settings of a run launched with `nproc` local ranks: restarts (--max-restarts) are
// the launching parent's (not a rank's under another launcher: torchrun has its own), need ranks to
// restart (nproc >= 2) and a checkpoint directory to resume from. Throws BadInput naming the
// flags.
void check_restart_options(int max_restarts, int nproc, const std::string& checkpoint_dir);

// The settings of `options` a user picks by hand: the optimizer and lr schedule names, lr,
// momentum, weight decay, min_lr (0..lr), clipping, warm-up, save_every, Adam's betas ([0, 1)) and
// eps, zero (0..3) with the offload and resharding it allows. Throws BadInput naming the setting by
// its `pipetrain train` flag (--lr, --adam-betas, ...) and the value; the Trainer's constructor
// and the CLI check the same.
void check_trainer_settings(const TrainerOptions& options);

// --offload-optimizer moves ZeRO's shard to host memory: with `offload`, `zero` must be 1, 2 or 3.
// Throws BadInput naming both flags (Trainer, train and plan --model check the same).
void check_offload_optimizer(bool offload, int zero);

// Where a restarted job continues (torchrun --max-restarts, launch_local's max_restarts): on a
// restart (restart_count > 0, DistributedEnvironment::restart_count) the checkpoint in
// `directory` when one was written (DIR/checkpoint.pt, or DIR itself when a sharded checkpoint
// named by DIR/latest is there), which Trainer::resume takes; nullopt on a first attempt, and
// on a restart that came before the first checkpoint (the job starts over, which is exact too:
// the same seeds give the same run).
std::optional<std::string> checkpoint_after_restart(const std::string& directory,
                                                    int restart_count);

}  // namespace pipetrain::train
