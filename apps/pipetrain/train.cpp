// `pipetrain train`: pipelined training of an example model (mlp, cnn, gpt) on Fashion-MNIST, a
// text corpus or synthetic data, or of a TorchScript model on tensors saved from Python; in one
// process (a worker thread per pipeline rank) or in several (--nproc N, c10d/Gloo).
//
//   [1] flags + checks       TrainArgs              train_args.h: add_train_flags,
//                                                   resolve_auto_flags, check_args
//   [2] model + data         BuiltModel/BuiltData   train_setup.h (shared with `pipetrain eval`)
//       + the auto plan      partition::Plan        tune/auto_plan.h: its values replace the auto
//                                                   flags in TrainArgs before anything is built
//   [3] runner               train::StepRunner      sequential | Pipe | DistributedPipe (one rank)
//   [4] the loop             train::Trainer         lr schedule, step, clip, optimizer,
//                                                   checkpoints, trace (the library); progress
//                                                   and evaluation per epoch printed here
//
// Multi-process: `--nproc N` re-runs this command as N local ranks (runtime/launcher.h) after the
// parent has checked every flag and file (so bad input still exits 2, before any rank starts);
// each rank finds the torchrun environment and runs [2]..[4] for its stages. Under torchrun, Slurm
// or mpirun the environment is set by them and --nproc is not given.
//
// The auto plan is made once per run, never per rank (profiles are timings and differ between
// processes): in one process here; with several, by rank 0 with every rank taking part in what
// it measures on the processes (tune/auto_plan.h, plan_training_on_ranks), under --nproc as under
// an external launcher.
//
// Batches are a pure function of the global step k: Fashion-MNIST/synthetic use the seeded
// shuffled DataLoader (epoch k / B, batch k % B), text draws windows from (seed, k), tensors
// read rows (k*N .. k*N+N-1) mod R in order. So a checkpoint needs only k to resume exactly.
//
// Exit codes (commands.h): 0 done, 1 failure while training (a step threw, the loss is not
// finite: the message names the step), 2 bad usage or bad input.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "data_loader.h"
#include "model_registry.h"
#include "pipetrain/base/atomic_file.h"
#include "pipetrain/models/llama_export.h"
#include "pipetrain/partition/memory.h"
#include "pipetrain/runtime/distributed.h"
#include "pipetrain/runtime/launcher.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/runtime/run_layout.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/text_format.h"
#include "pipetrain/stage/batchnorm.h"
#include "pipetrain/stage/device.h"
#include "pipetrain/stage/microbatch.h"
#include "pipetrain/train/checkpoint.h"
#include "pipetrain/train/device_peak.h"
#include "pipetrain/train/document_batches.h"
#include "pipetrain/train/finite_loss.h"
#include "pipetrain/train/optimizer.h"
#include "pipetrain/train/progress.h"
#include "pipetrain/train/run_summary.h"
#include "pipetrain/train/sharded_checkpoint.h"
#include "pipetrain/train/step_runner.h"
#include "pipetrain/train/token_batches.h"
#include "pipetrain/train/trainer.h"
#include "pipetrain/tune/auto_plan.h"
#include "pipetrain/tune/calibration.h"
#include "pipetrain/tune/memory_check.h"
#include "pipetrain/tune/world_plan.h"
#include "train_args.h"
#include "train_setup.h"

namespace pipetrain::cli {
namespace {

using tune::AutoPlanError;
using tune::AutoPlanInput;
using tune::AutoRequest;

// ---- batches ------------------------------------------------------------------------------------

// The data flags with --pad-multiple 0 resolved: sequence parallelism cuts every row into --tp
// parts.
examples::ModelDataSpec with_pad_multiple(const TrainArgs& args) {
  examples::ModelDataSpec spec = args.data;
  if (spec.pad_multiple == 0) spec.pad_multiple = args.sequence_parallel ? args.pipeline.tp : 1;
  return spec;
}

// The data set's batch source (train/batch_source.h; the examples' loader and corpus), and the
// run's length.
class Batches {
 public:
  Batches(const TrainArgs& args, const BuiltModel& model, const BuiltData& data)
      : args_(args),
        source_(examples::make_batches(with_pad_multiple(args), model, data, args.batch_size)) {}

  const train::BatchSource& source() const { return *source_; }
  // Steps of the whole run.
  int64_t total_steps() const {
    return args_.steps > 0 ? args_.steps : source_->steps_in_epochs(args_.epochs);
  }
  int64_t epochs() const { return source_->epochs_begun(total_steps()); }

 private:
  const TrainArgs& args_;
  std::unique_ptr<train::BatchSource> source_;
};

// ---- [4] the loop: train::Trainer, with progress and evaluation printed here -----------------

train::TrainerOptions trainer_options(const TrainArgs& args, const BuiltModel& model,
                                      int64_t total_steps) {
  return trainer_settings(args, total_steps)
      .metadata({{"model", model.name},
                 {"model_options", model.options},
                 {"data", args.data.data},
                 {"batch_size", args.batch_size},
                 {"seed", args.data.seed},
                 {"optimizer", args.optimizer},
                 {"lr", args.lr}});
}

// Collective: the whole model on the main rank, evaluated there with every core.
void evaluate_and_print(const std::string& when, train::Trainer& trainer, const BuiltModel& model,
                        const BuiltData& data) {
  if (!data.corpus && !data.test_inputs.defined()) return;
  if (!trainer.gather_model()) return;
  // The other ranks wait for the next step meanwhile: evaluate with every core.
  const int threads = at::get_num_threads();
  at::set_num_threads(
      std::max(threads, static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))));
  std::optional<Evaluation> e = evaluate(model, data);
  at::set_num_threads(threads);
  if (e) std::printf("%s: %s\n", when.c_str(), examples::describe_evaluation(*e, data).c_str());
  std::fflush(stdout);
}

// Runs the Trainer with a progress bar on stderr and per-epoch evaluation on stdout.
// The progress line's rates: tokens/s of token data, MFU with --peak-tflops.
train::ProgressOptions rate_options(const TrainArgs& args, const BuiltModel& model,
                                    const BuiltData& data) {
  const examples::SampleCost cost = examples::sample_cost(model, data);
  return train::ProgressOptions()
      .tokens_per_sample(cost.tokens)
      .flops_per_token(cost.flops_per_token)
      .peak_flops(args.peak.flops);
}

train::TrainSummary run_loop(const TrainArgs& args, BuiltModel& model, const BuiltData& data,
                             train::Trainer& trainer, const Batches& batches,
                             const std::vector<int64_t>& predicted_memory) {
  const bool print_steps = data.name == "tensors";
  // Made before the first step, so that its rate counts the first step's time too (made after
  // it, the first line showed the rows over microseconds).
  std::optional<train::ProgressReporter> progress;
  if (!print_steps) {
    progress.emplace(std::cerr, train::stderr_is_terminal(),
                     rate_options(args, model, data)
                         .total_steps(batches.total_steps())
                         .epochs(batches.epochs())
                         .first_step(trainer.first_step())
                         .log_every_steps(args.log_every));
  }
  bool stepped = false;
  trainer.on_step = [&](const train::StepReport& r) {
    if (!r.main) return;
    stepped = true;
    if (print_steps) {
      std::printf("step %lld loss %.6f\n", static_cast<long long>(r.step), r.loss);
      std::fflush(stdout);
      return;
    }
    if (!r.process_peak_bytes.empty()) {
      progress->set_note(train::peak_memory_text(r.process_peak_bytes, predicted_memory));
    }
    progress->update(r.step + 1, r.epoch, r.samples, r.loss, r.tokens, r.counted_targets);
  };
  trainer.on_epoch_end = [&](int64_t epoch) {
    if (progress && stepped) progress->finish();
    evaluate_and_print("epoch " + std::to_string(epoch + 1), trainer, model, data);
  };
  trainer.on_checkpoint = [&](const std::string& directory, const train::Trainer::SaveFigures& f) {
    if (!f.main) return;
    if (progress && stepped) progress->finish();
    std::string excess;
    if (f.peak_excess_bytes >= 0) {
      excess = ", peak +" + partition::format_bytes(f.peak_excess_bytes) + " (largest process)";
    }
    std::printf("checkpoint %s: %.1f MiB by %d processes in %.3f s (%.1f MiB/s)%s\n",
                directory.c_str(), static_cast<double>(f.bytes) / (1 << 20), f.processes, f.seconds,
                f.seconds > 0 ? static_cast<double>(f.bytes) / (1 << 20) / f.seconds : 0.0,
                excess.c_str());
    std::fflush(stdout);
  };
  train::TrainSummary summary = trainer.fit();
  if (progress && stepped) progress->finish();
  return summary;
}

// ---- the command --------------------------------------------------------------------------------

struct Prepared {
  BuiltData data;
  BuiltModel model;
  std::optional<train::Checkpoint> resume;
  std::optional<partition::Plan> auto_plan;  // when an auto flag was given
  std::vector<int64_t> predicted_memory;     // per process, by check_memory (or its parent)
};

// The launching parent hands its prediction of each process's memory to the ranks.
constexpr const char* kPredictedMemory = "PIPETRAIN_PREDICTED_MEMORY";

// ---- auto plan (tune/auto_plan.h) -----------------------------------------------------------

// Planning's progress on stdout, its warnings on stderr.
void print_diagnostic(const tune::Diagnostic& d) {
  std::fprintf(d.kind == tune::Diagnostic::Kind::kWarning ? stderr : stdout, "%s\n",
               d.text.c_str());
  std::fflush(d.kind == tune::Diagnostic::Kind::kWarning ? stderr : stdout);
}

// The run as far as the user fixed it, for the planner.
AutoPlanInput auto_plan_input(const TrainArgs& args, const RunLayout& layout, int64_t layers) {
  AutoPlanInput input = tune::auto_plan_input(args.pipeline, layout, args.auto_request, layers);
  input.memory_limit_bytes = args.memory_limit_bytes;
  input.zero = args.zero;
  input.reshard_after_forward = args.reshard_after_forward;
  input.zero_policy = train::zero_memory_policy(
      args.zero_options, PipeOptions()
                             .overlap_gradient_reduction(args.pipeline.overlap_grad_reduce)
                             .bucket_bytes(bucket_bytes_of(args.pipeline.bucket_mb)));
  input.offload_optimizer = args.offload_optimizer;
  input.optimizer_state_multiple = tune::optimizer_state_multiple(args.optimizer, args.momentum);
  input.diagnostics = print_diagnostic;
  return input;
}

// What one replica's pipeline runs per step: the first mini-batch, or replica 0's share of it.
torch::Tensor auto_plan_sample(const TrainArgs& args, const RunLayout& layout, const Prepared& p) {
  Batches batches(args, p.model, p.data);
  torch::Tensor x = batches.source().largest().first;
  if (layout.replicas > 1) x = x.narrow(0, 0, microbatch_sizes(x.size(0), layout.replicas)[0]);
  return x;
}

// Where the plan comes from: this process's profile (default), or rank 0's made with every rank
// (a multi-process run).
using PlanSource = std::function<partition::Plan(Prepared& p, const AutoPlanInput& input,
                                                 const torch::Tensor& sample)>;

partition::Plan plan_here(const TrainArgs& args, Prepared& p, const AutoPlanInput& input,
                          const torch::Tensor& sample) {
  return plan_training(p.model.sequential, sample, args.auto_request, input);
}

// [2]: data, model (seeded), checks, the auto plan (args then hold its values; not in the
// launcher's parent, whose ranks plan), deferred batch norm, resume. Every rank does the same.
// The entries of a Hugging Face model this process gives memory to: all in one process (and with
// an auto plan or --report-memory, whose rank 0 profiles the whole model), none in the launching
// parent (pipeline_rank -1: it only checks), a rank's own stages' on a rank.
std::optional<std::vector<int64_t>> hf_entries(const TrainArgs& args, const RunLayout& layout,
                                               int pipeline_rank) {
  if (!examples::is_hf_model(args.data.model) || !layout.multi_process || args.auto_request.any()) {
    return std::nullopt;
  }
  if (pipeline_rank < 0) return std::vector<int64_t>{};
  if (pipeline_rank == 0 && args.report_memory) return std::nullopt;  // it profiles every entry
  const int64_t layers = examples::hf_config(args.data).entries();
  return rank_layers(pipe_options(args.pipeline, layout, layers), layers, pipeline_rank);
}

Prepared prepare(TrainArgs& args, const RunLayout& layout, const PlanSource& plan_source = {},
                 bool leave_plan_to_ranks = false, int pipeline_rank = -1,
                 const parallel::TensorParallel& tp = {}) {
  Prepared p;
  p.data = build_data(args.data);
  torch::manual_seed(args.data.seed);
  p.model = build_model(args.data, p.data, hf_entries(args, layout, pipeline_rank), tp);
  check_data_against_model(p.model, p.data);
  examples::check_batch_size(p.data, args.batch_size);
  if (args.auto_request.any() && !leave_plan_to_ranks) {
    const int64_t layers = static_cast<int64_t>(p.model.sequential->size());
    const AutoPlanInput input = auto_plan_input(args, layout, layers);
    const torch::Tensor sample = auto_plan_sample(args, layout, p);
    p.auto_plan = plan_source ? plan_source(p, input, sample) : plan_here(args, p, input, sample);
    tune::apply_auto_plan(args.pipeline, args.auto_request, *p.auto_plan);
  }
  if (!is_sequential(args.pipeline, layout)) {
    // Batch norms would update running statistics per micro-batch and again on recompute;
    // deferred ones update once per mini-batch, as sequential training does. The mini-batch is
    // every replica's micro-batches; the trainer sums the replicas' statistics before the commit.
    p.model.sequential = convert_deferred_batch_norm(
        p.model.sequential, chunks_of(args.pipeline, layout) * layout.replicas);
  }
  if (!args.resume.empty()) {
    p.resume = as_usage_error("--resume", [&] {
      // A rank restores its own tensors (its tensor-parallel slices): from a sharded checkpoint
      // it reads only those, and under ZeRO only its shard's ranges of their optimizer state.
      return train::resume_checkpoint(
          args.resume, *p.model.sequential, args.optimizer,
          train::TensorParallelSlice{p.model.tensor_parallel_split, tp.rank(), tp.size()},
          /*optimizer_state_by_range=*/args.zero > 0);
    });
  }
  return p;
}

int64_t token_ids(const BuiltData& data) {
  int64_t ids = data.tokens ? data.tokens->tokens() : 0;
  for (const train::DocumentSource& source : data.document_sources) ids += source.dataset->tokens();
  return ids;
}

void print_start(const TrainArgs& args, const Prepared& p, const Batches& batches,
                 train::StepRunner& runner, int threads) {
  if (!runner.is_main()) return;
  std::string rows =
      p.data.corpus ? std::to_string(p.data.corpus->text().size()) + " characters"
      : p.data.documents > 0
          ? std::to_string(p.data.documents) + " documents, " + std::to_string(token_ids(p.data)) +
                " token ids" +
                (p.data.document_sources.size() < 2
                     ? ""
                     : " in a blend of " + std::to_string(p.data.document_sources.size()))
      : p.data.tokens ? std::to_string(p.data.tokens->tokens()) + " token ids"
                      : std::to_string(p.data.train_inputs.size(0)) + " rows";
  std::printf(
      "training %s (%zu layers, %lld parameters) on %s: %s, batch %lld, %s, %s lr %g, "
      "%d threads per rank\n",
      p.model.name.c_str(), p.model.sequential->size(),
      static_cast<long long>(examples::count_parameters(*p.model.sequential)), p.data.name.c_str(),
      rows.c_str(), static_cast<long long>(args.batch_size), runner.description().c_str(),
      args.optimizer.c_str(), args.lr, threads);
  if (p.model.llama && args.peak.flops > 0) {
    std::printf(
        "MFU: model FLOPs (6N + attention per token, recomputation not counted) over a "
        "peak of %s\n",
        train::describe_peak(args.peak).c_str());
  }
  if (const auto* documents = dynamic_cast<const train::DocumentBatches*>(&batches.source())) {
    std::printf("documents: %s\n", documents->describe().c_str());
  }
  if (p.data.corpus) {
    std::printf(
        "corpus %s: vocabulary %lld, unigram entropy %.4f nats\n", p.data.corpus->source().c_str(),
        static_cast<long long>(p.data.corpus->vocab_size()), p.data.corpus->unigram_entropy());
  }
  if (p.resume) {
    std::printf("resumed from %s at step %lld\n", args.resume.c_str(),
                static_cast<long long>(p.resume->step));
  }
  std::fflush(stdout);
}

// Runs on every rank (or the single process) once the runner exists.
void print_files(const TrainArgs& args, const train::TrainSummary& summary, int64_t total_steps,
                 int trace_rows) {
  if (!summary.checkpoint_path.empty()) {
    std::printf("checkpoint: %s (step %lld)\n", summary.checkpoint_path.c_str(),
                static_cast<long long>(total_steps));
  }
  if (!args.trace.empty()) {
    std::printf(
        "trace: %s (%lld actions of %d ranks; open in chrome://tracing or ui.perfetto.dev)\n",
        args.trace.c_str(), static_cast<long long>(summary.trace_actions), trace_rows);
  }
  if (!args.timeline.empty()) {
    std::printf("timeline: %s (measured step %lld)\n", args.timeline.c_str(),
                static_cast<long long>(summary.timeline_step));
  }
  std::printf(
      "memory: optimizer state %lld bytes, gradients %lld bytes held after the last step "
      "(rank 0%s)\n",
      static_cast<long long>(summary.optimizer_state_bytes),
      static_cast<long long>(summary.gradient_bytes),
      args.zero > 0 ? (", ZeRO stage " + std::to_string(args.zero) +
                       (args.offload_optimizer ? ", the optimizer state in host memory" : ""))
                          .c_str()
                    : "");
  if (summary.exposed_reduce_seconds > 0) {
    std::printf(
        "data-parallel gradient sum: %.2f ms per step left after the schedule's last action "
        "(mean over ranks; %s)\n",
        summary.exposed_reduce_seconds * 1e3,
        args.pipeline.overlap_grad_reduce ? "overlapped with the pipeline in buckets"
                                          : "one blocking all-reduce");
  }
  if (summary.transport_bytes_sent > 0) {
    std::printf(
        "transport: %lld tensor bytes sent between ranks over %lld steps (every rank, %s)\n",
        static_cast<long long>(summary.transport_bytes_sent), static_cast<long long>(summary.steps),
        to_string(args.pipeline.precision));
  }
}

// What the memory model needs of the flags.
train::MemoryRunOptions memory_run_options(const TrainArgs& args, const RunLayout& layout) {
  train::MemoryRunOptions run;
  run.optimizer = args.optimizer;
  run.momentum = args.momentum;
  run.zero = args.zero;
  run.reshard_after_forward = args.reshard_after_forward;
  run.zero_options = args.zero_options;
  run.offload_optimizer = args.offload_optimizer;
  run.async_checkpoint =
      args.async_checkpoint && !args.checkpoint_dir.empty() && args.save_every > 0;
  run.data_parallel = layout.replicas;
  run.processes = layout.multi_process;
  return run;
}

// --report-memory, on the main rank after training: the memory model's prediction for this run
// (profiled on the first mini-batch) beside what every rank measured.
void print_memory_report(const TrainArgs& args, Prepared& p, const Batches& batches,
                         const train::TrainSummary& summary, const PipeOptions& pipe,
                         const RunLayout& layout) {
  if (summary.memory.empty()) return;
  auto [inputs, targets] = batches.source().largest();
  train::MemoryRunOptions run = memory_run_options(args, layout);
  examples::BuiltModel mirrored;
  const examples::BuiltModel* profiled = &p.model;
  if (layout.tensor_parallel > 1) {
    mirrored = examples::build_mirror_model(args.data, p.data, layout.tensor_parallel,
                                            args.sequence_parallel);
    profiled = &mirrored;
  }
  // Profiled on the device this rank's first stage trained on.
  const std::vector<torch::Tensor> trained = p.model.sequential->parameters();
  if (!trained.empty()) run.device = trained.front().device();
  const train::MemoryPrediction predicted = as_usage_error("--report-memory", [&] {
    return train::predict_training_memory(profiled->sequential, inputs, targets, profiled->loss,
                                          pipe, run);
  });
  std::printf(
      "memory per rank after the last step (micro-batch %lld; activations and transport: "
      "peaks during that step):\n%s",
      static_cast<long long>(predicted.microbatch_size),
      train::memory_report_text(predicted, summary.memory).c_str());
  std::fflush(stdout);
}

// Runs on every rank (or the single process) once the runner exists. `pipe`: the pipeline's
// options (null for sequential training).
int train_with(const TrainArgs& args, Prepared& p, train::StepRunner& runner, int threads,
               const PipeOptions* pipe, const RunLayout& layout) {
  Batches batches(args, p.model, p.data);
  train::Trainer trainer(p.model.sequential, runner, batches.source(),
                         trainer_options(args, p.model, batches.total_steps()));
  if (p.resume) {
    try {
      trainer.resume(*p.resume);
    } catch (const train::CheckpointError& error) {
      throw UsageError("--resume " + args.resume + ": " + std::string(error.what()));
    }
  }
  print_start(args, p, batches, runner, threads);
  const train::TrainSummary result =
      run_loop(args, p.model, p.data, trainer, batches, p.predicted_memory);
  if (p.data.corpus) evaluate_and_print("final", trainer, p.model, p.data);
  const bool main = runner.is_main();
  if (main && pipe) print_memory_report(args, p, batches, result, *pipe, layout);
  if (main && pipe && pipe->offload_activations()) {
    std::printf("%s", train::offload_report_text(runner.rank_holdings(), true).c_str());
  }
  if (main) {
    print_files(args, result, batches.total_steps(), runner.trace_rows());
    std::printf("memory: %s; every process:",
                train::peak_memory_text(result.process_peak_bytes, p.predicted_memory).c_str());
    for (int64_t peak : result.process_peak_bytes) {
      std::printf(" %s", partition::format_bytes(peak).c_str());
    }
    std::printf("\n");
    const train::ProgressOptions costs = rate_options(args, p.model, p.data);
    const train::TrainingRate rate = train::training_rate(
        {result.seconds, result.samples, result.tokens, result.counted_targets}, costs);
    const double samples_per_second = rate.samples_per_second;
    std::string rates;
    if (costs.tokens_per_sample() > 0 || result.tokens > 0) {
      rates += ", " + std::to_string(std::llround(rate.tokens_per_second)) + " tokens/s";
    }
    if (result.counted_targets > 0) {
      rates += ", " + std::to_string(std::llround(rate.targets_per_second)) + " targets/s";
    }
    if (rate.mfu > 0) {
      char mfu[48];
      std::snprintf(mfu, sizeof mfu, ", MFU %.1f%%", 100.0 * rate.mfu);
      rates += mfu;
    }
    if (!args.summary_json.empty()) {  // written atomically
      const std::string json = train::run_summary_json(result, rate, args.peak).dump(2) + "\n";
      as_usage_error("--summary-json", [&] { write_file_atomically(args.summary_json, json); });
    }
    std::printf("done: %lld steps in %.3f s (%.1f steps/s, %.1f samples/s%s), loss %.6f -> %.6f\n",
                static_cast<long long>(result.steps), result.seconds,
                result.seconds > 0 ? result.steps / result.seconds : 0.0, samples_per_second,
                rates.c_str(), result.first_loss, result.last_loss);
    if (p.auto_plan && result.steps > 0) {
      // Measured over every step (the first one warms up): compare with the prediction.
      std::printf("auto plan: measured %.3g s/step, predicted %.3g s/step\n",
                  result.seconds / static_cast<double>(result.steps),
                  p.auto_plan->predicted_step_seconds);
    }
  }
  if (!args.save_params.empty()) {
    const std::optional<train::Checkpoint> whole = trainer.gather_weights();  // on the main rank
    if (whole) {
      const size_t saved = train::save_parameters(args.save_params, *whole, *p.model.sequential);
      std::printf("saved %zu parameters to %s\n", saved, args.save_params.c_str());
    }
  }
  if (!args.save_hf.empty()) {  // every process writes its share; nothing is gathered
    const auto start = std::chrono::steady_clock::now();
    const auto files = models::save_llama_hf(trainer, args.save_hf, *p.model.llama);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (main) {
      std::printf("saved %s to %s (%zu files by %d processes in %.2f s)\n",
                  models::to_string(p.model.llama->architecture), args.save_hf.c_str(),
                  files.size(), runner.processes(), seconds);
    }
  }
  std::fflush(stdout);
  return 0;
}

// Before any rank builds its share of the model: the memory model's need of this run on this
// machine against what it has (tune/memory_check.h); a run that does not fit is refused (exit 2)
// naming both and the settings that fit. Not for sequential training, an auto plan (bounded by
// --memory-limit) or ranks started by another launcher.
void check_memory(const TrainArgs& args, const RunLayout& layout, Prepared& p) {
  if (args.memory_limit_bytes > 0 && !args.auto_request.any() &&
      is_sequential(args.pipeline, layout)) {
    throw UsageError(
        "--memory-limit checks a pipelined run against the memory model, or bounds --balance/"
        "--schedule auto; sequential training (one stage, one process) is not modelled: give "
        "--stages 2 or more, or drop --memory-limit");
  }
  if (args.skip_memory_check || args.auto_request.any() || is_sequential(args.pipeline, layout)) {
    return;
  }
  // The batches drawn here and the profile draw from the random generator: the run must draw
  // what it would have drawn without the check.
  tune::RandomStateGuard random;
  tune::MemoryCheckInput input;
  if (p.model.llama) {
    input.llama = p.model.llama.get();
    input.tensor_parallel = layout.tensor_parallel;
    input.sequence_parallel = args.sequence_parallel;
  } else {
    input.model = p.model.sequential;
    input.loss = p.model.loss;
  }
  Batches batches(args, p.model, p.data);
  std::tie(input.inputs, input.targets) = batches.source().largest();
  const int64_t layers = static_cast<int64_t>(p.model.sequential->size());
  input.pipe = pipe_options(args.pipeline, layout, layers);
  input.run = memory_run_options(args, layout);
  const int ranks = layout.pipeline_ranks;
  if (layout.multi_process) {
    for (int r = 0; r < layout.world; ++r) input.ranks_of_process.push_back({r % ranks});
  } else {
    input.ranks_of_process.emplace_back();
    for (int r = 0; r < ranks; ++r) input.ranks_of_process.back().push_back(r);
  }
  input.budget_per_rank = args.memory_limit_bytes;
  const train::MemoryFit fit = as_usage_error("", [&] { return tune::check_run_memory(input); });
  if (!fit.fits()) throw UsageError(train::memory_fit_text(fit));
  p.predicted_memory = train::process_needs(fit, input.ranks_of_process);
  std::string list;
  for (int64_t bytes : p.predicted_memory)
    list += (list.empty() ? "" : ",") + std::to_string(bytes);
  ::setenv(kPredictedMemory, list.c_str(), 1);  // the ranks this process starts read it
  std::printf("memory: this run needs %s of the %s available (%s)\n",
              partition::format_bytes(fit.run.needed).c_str(),
              partition::format_bytes(fit.available.bytes).c_str(), fit.available.source.c_str());
  std::fflush(stdout);
}

void print_auto_plan(const partition::Plan& plan) {
  std::printf("%s\n", tune::describe_auto_plan(plan).c_str());
  std::fflush(stdout);
}

// A restarted rank (torchrun --max-restarts, or --max-restarts here) continues from the last
// checkpoint of --checkpoint-dir; every rank takes the same file, as with --resume.
void resume_after_restart(TrainArgs& args, int restart_count) {
  if (restart_count == 0) return;
  if (auto file = train::checkpoint_after_restart(args.checkpoint_dir, restart_count)) {
    std::printf("restart %d: resuming from %s\n", restart_count, file->c_str());
    args.resume = *file;
  } else {
    std::printf("restart %d: no checkpoint in --checkpoint-dir '%s' yet; starting over\n",
                restart_count, args.checkpoint_dir.c_str());
  }
  std::fflush(stdout);
}

// The peak MFU divides by (train/device_peak.h): --peak-tflops per device, else a known GPU's, else
// the CPU's measured once -- by the process that launches the ranks, which hand it down.
constexpr const char* kPeakFlops = "PIPETRAIN_PEAK_FLOPS";

void resolve_peak(TrainArgs& args, bool launched, int processes) {
  if (!examples::is_hf_model(args.data.model)) return;  // FLOPs per token: the Llama family's
  if (const char* handed = std::getenv(kPeakFlops); launched && handed != nullptr) {
    const std::string text = handed;
    const size_t cut = text.find(';');
    args.peak = {std::atof(text.substr(0, cut).c_str()),
                 cut == std::string::npos ? "" : text.substr(cut + 1)};
    return;
  }
  const bool cuda = on_cuda(args.pipeline);
  args.peak =
      train::run_peak(args.peak_tflops, cuda ? device_name(torch::Device(torch::kCUDA, 0)) : "",
                      args.pipeline.precision != Precision::kFloat32, cuda ? processes : 1,
                      static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  ::setenv(kPeakFlops, (std::to_string(args.peak.flops) + ";" + args.peak.source).c_str(), 1);
}

int run_train(const TrainArgs& given) {
  TrainArgs args = given;
  resolve_auto_flags(args);
  check_args(args);
  const bool launched = DistributedEnvironment::present();
  resolve_peak(args, launched,
               launched ? DistributedEnvironment::from_environment().world_size : args.nproc);
  if (args.nproc > 1 && !launched) {
    // The parent: check everything a rank would reject (exit 2 here, not 1 in a rank), then
    // start the ranks. An auto plan is made by the ranks, once, on rank 0 (it measures the
    // processes themselves); the parent checks the flags it can without it.
    RunLayout layout = layout_of(args.pipeline, args.nproc);
    const bool auto_plan = args.auto_request.any();
    Prepared p = prepare(args, layout, {}, /*leave_plan_to_ranks=*/auto_plan);
    if (!auto_plan)
      pipe_options(args.pipeline, layout, static_cast<int64_t>(p.model.sequential->size()));
    if (layout.tensor_parallel > 1) {  // check_tensor_parallel: a Hugging Face model
      as_usage_error(
          "", [&] { models::check_llama_tensor_parallel(*p.model.llama, layout.tensor_parallel); });
    }
    check_memory(args, layout, p);
    const std::string tensor = layout.tensor_parallel > 1
                                   ? std::to_string(layout.tensor_parallel) + " tensor-parallel x "
                                   : "";
    std::printf("launching %d processes (%d pipeline x %s%d data-parallel)%s\n", layout.world,
                layout.pipeline_ranks, tensor.c_str(), layout.replicas,
                auto_plan ? "; rank 0 makes the auto plan" : "");
    std::fflush(stdout);
    return launch_self(args.nproc, self_arguments(),
                       std::chrono::milliseconds(static_cast<int64_t>(10'000)), args.max_restarts);
  }
  if (launched) {
    DistributedEnvironment environment = DistributedEnvironment::from_environment();
    resume_after_restart(args, environment.restart_count);
    std::vector<int64_t> predicted_memory;  // the parent's check_memory
    if (const char* list = std::getenv(kPredictedMemory)) {
      std::stringstream items(list);
      for (std::string item; std::getline(items, item, ',');) {
        predicted_memory.push_back(std::atoll(item.c_str()));
      }
    }
    RunLayout layout = layout_of(args.pipeline, environment.world_size);
    const int threads = threads_per_rank(args.pipeline, layout);
    at::set_num_threads(threads);
    // This process's stages: cuda:LOCAL_RANK under --device cuda, or its entry of --devices. It
    // picks the backend under auto (nccl on a GPU) and the GPU NCCL binds.
    const torch::Device device =
        as_usage_error("", [&] { return process_device(args.pipeline, environment.local_rank); });
    DistributedOptions options;
    // The world's waits and the transport's (pipe_options below) from one conversion.
    options.timeout(timeout_of(PipeOptions().timeout_seconds(args.pipeline.timeout)))
        .pipeline_ranks(layout.pipeline_ranks)
        .tensor_parallel(layout.tensor_parallel)
        .backend(args.backend)
        .device(device);
    std::string usage_error;  // the auto plan failed on rank 0: every rank stops with exit 2
    const int code = run_distributed(options, [&](Distributed& distributed) {
      // Every rank got the auto flags: rank 0 plans, with every rank taking part in what it
      // measures on the processes; all take its plan (or its error).
      PlanSource on_ranks = [&](Prepared& p, const AutoPlanInput& input,
                                const torch::Tensor& sample) {
        // Tensor parallelism: rank 0 profiles a mirror copy; the timed steps run every rank.
        // Its profile has no collective: the group's, from an all-reduce measured on the ranks,
        // are added to it (tune::add_tensor_parallel_collectives).
        std::optional<examples::BuiltModel> mirrored;
        AutoPlanInput planned = input;
        if (layout.tensor_parallel > 1) {
          mirrored = examples::build_mirror_model(args.data, p.data, layout.tensor_parallel,
                                                  args.sequence_parallel);
          planned.tensor_parallel_collectives = tune::llama_tensor_parallel_collectives(
              *p.model.llama, sample.size(1), args.sequence_parallel, input.precision);
        }
        partition::Plan plan =
            plan_training_on_ranks(distributed, p.model.sequential, sample, args.auto_request,
                                   planned, mirrored ? &mirrored->sequential : nullptr);
        if (distributed.rank() == 0) print_auto_plan(plan);
        return plan;
      };
      std::optional<Prepared> p;
      try {
        p.emplace(prepare(
            args, layout, on_ranks, false, distributed.pipeline_rank(),
            parallel::TensorParallel{distributed.tensor_parallel_group(), args.sequence_parallel}));
      } catch (const AutoPlanError& error) {
        usage_error = error.what();  // every rank is here: stop cleanly, exit 2 below
        return;
      }
      p->predicted_memory = predicted_memory;
      PipeOptions pipe =
          pipe_options(args.pipeline, layout, static_cast<int64_t>(p->model.sequential->size()));
      const std::string text = describe_pipeline(pipe, pipe.balance(), layout);
      as_usage_error("--device", [&] { check_device_usable(device); });
      auto runner = train::make_distributed_runner(
          distributed, p->model.sequential, p->model.loss, pipe, text, p->model.tied_parameters,
          device,
          train::TensorParallelModel{p->model.tensor_parallel_split, args.sequence_parallel});
      if (distributed.rank() == 0 && distributed.world()->checks_collectives()) {
        std::printf(
            "TORCH_DISTRIBUTED_DEBUG=DETAIL: each collective is compared with its group's before "
            "it is posted (one more small collective each; docs/DISTRIBUTED.md)\n");
      }
      train_with(args, *p, *runner, threads, &pipe, layout);
    });
    if (code == 0 && !usage_error.empty()) throw UsageError(usage_error);
    return code;
  }
  RunLayout layout = layout_of(args.pipeline, 1);
  const int threads = threads_per_rank(args.pipeline, layout);
  Prepared p = prepare(args, layout);
  if (p.auto_plan) print_auto_plan(*p.auto_plan);
  check_memory(args, layout, p);
  std::unique_ptr<train::StepRunner> runner;
  std::optional<PipeOptions> pipe;
  if (is_sequential(args.pipeline, layout)) {
    if (args.report_memory) {
      throw UsageError(
          "--report-memory reports the ranks of a pipeline, and this run is sequential "
          "training; give --stages 2 or more (or --chunks 2 or more)");
    }
    if (args.pipeline.offload_activations) {
      throw UsageError(
          "--offload-activations moves what micro-batches keep while they wait for their "
          "backward, and sequential training has none waiting; give --stages 2 or more (or "
          "--chunks 2 or more)");
    }
    at::set_num_threads(threads);
    const std::vector<torch::Device> device = as_usage_error(
        "--device", [&] { return rank_devices(args.pipeline.device, args.pipeline.devices, 1); });
    p.model.sequential->to(device[0]);
    runner =
        train::make_sequential_runner(p.model.sequential, p.model.loss, args.pipeline.precision);
  } else {
    pipe = pipe_options(args.pipeline, layout, static_cast<int64_t>(p.model.sequential->size()));
    runner = as_usage_error(
        "", [&] { return train::make_pipe_runner(p.model.sequential, p.model.loss, *pipe); });
  }
  try {
    return train_with(args, p, *runner, threads, pipe ? &*pipe : nullptr, layout);
  } catch (const train::NonFiniteLossError& error) {
    std::cerr << "pipetrain train: " << error.what() << "\n";
    return 1;
  }
}

}  // namespace

void add_train_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<TrainArgs>();
  auto* command = app.add_subcommand(
      "train",
      "train a model, pipelined: example models on Fashion-MNIST or text, or a TorchScript model "
      "on saved tensors (docs/QUICKSTART.md, docs/TRAIN_CLI.md)");
  add_train_flags(*command, *args);
  command->callback([args, &exit_code] { exit_code = run_train(*args); });
}

}  // namespace pipetrain::cli
