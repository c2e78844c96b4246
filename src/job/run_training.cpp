// run_training (job/run_job.h): a training job from its JobConfig to its summary.
//
//   [1] resolve + check      TrainingSetup        job/training_setup.h (BadInput before any work)
//   [2] model + data         Prepared             job/model_data.h; the auto plan
//                                                 (tune/auto_plan.h) fixes the pipeline flags it
//                                                 was asked for before anything is built on them
//   [3] runner               train::StepRunner    sequential | Pipe | DistributedPipe (one rank)
//   [4] the loop             train::Trainer       observed: start, steps, evaluations per epoch,
//                                                 checkpoints, the result (training_report.cpp)
//
// Multi-process: parallel.nproc > 1 makes this process the launching parent: it checks every
// setting and file (so bad input still fails here, before any rank starts) and the memory the
// ranks will need, then starts nproc copies of this program (runtime/launcher.h). Each rank finds
// the torchrun environment and runs [2]..[4] for its stages. Under torchrun, Slurm or mpirun the
// environment is theirs and nproc is 1.
//
// The auto plan is made once per run, never per rank (profiles are timings and differ between
// processes): in one process here; with several, by rank 0 with every rank taking part in what it
// measures on the processes (tune::plan_training_on_ranks).
//
// Batches are a pure function of the global step k: Fashion-MNIST/synthetic use the seeded
// shuffled DataLoader (epoch k / B, batch k % B), text draws windows from (seed, k), tensors read
// rows (k*N .. k*N+N-1) mod R in order. So a checkpoint needs only k to resume exactly.
#include <malloc.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <thread>

#include <torch/torch.h>

#include "job_internal.h"
#include "pipetrain/job/job_file.h"
#include "pipetrain/job/run_job.h"
#include "pipetrain/models/llama.h"
#include "pipetrain/models/llama_export.h"
#include "pipetrain/models/routing.h"
#include "pipetrain/parallel/all_to_all.h"
#include "pipetrain/parallel/ring_attention.h"
#include "pipetrain/partition/memory.h"
#include "pipetrain/runtime/distributed.h"
#include "pipetrain/runtime/launcher.h"
#include "pipetrain/stage/batchnorm.h"
#include "pipetrain/stage/device.h"
#include "pipetrain/stage/microbatch.h"
#include "pipetrain/train/device_peak.h"
#include "pipetrain/train/memory_report.h"
#include "pipetrain/train/nvme_options.h"
#include "pipetrain/train/optimizer.h"
#include "pipetrain/train/step_runner.h"
#include "pipetrain/tune/calibration.h"
#include "pipetrain/tune/memory_check.h"
#include "pipetrain/tune/world_plan.h"
#include "training_parts.h"

namespace pipetrain::job {
namespace {

using detail::as_bad_input;
using detail::Batches;
using detail::Prepared;

void note(JobObserver& observer, const std::string& text, bool warning = false) {
  observer.on_note({warning ? Note::Kind::kWarning : Note::Kind::kInfo, text});
}

// The launching parent hands its prediction of each process's memory, and the peak MFU divides
// by, to the ranks.
constexpr const char* kPredictedMemory = "PIPETRAIN_PREDICTED_MEMORY";
constexpr const char* kPeakFlops = "PIPETRAIN_PEAK_FLOPS";

// ---- [2] model, data, auto plan -----------------------------------------------------------------

// The run as far as the user fixed it, for the planner.
tune::AutoPlanInput auto_plan_input(const TrainingSetup& s, const RunLayout& layout, int64_t layers,
                                    JobObserver& observer) {
  tune::AutoPlanInput input = tune::auto_plan_input(s.pipeline, layout, s.auto_request, layers);
  input.memory_limit_bytes = s.memory_limit_bytes;
  input.zero = static_cast<int>(s.job.zero.stage);
  input.reshard_after_forward = s.job.zero.reshard_after_forward;
  input.zero_policy = train::zero_memory_policy(
      s.zero_options, PipeOptions()
                          .overlap_gradient_reduction(s.pipeline.overlap_grad_reduce)
                          .bucket_bytes(bucket_bytes_of(s.pipeline.bucket_mb)));
  input.offload_optimizer = s.job.zero.offloads_optimizer();
  input.optimizer_state_multiple =
      tune::optimizer_state_multiple(s.job.optimizer.name, s.job.optimizer.momentum);
  // Planning's progress, and its warnings.
  input.diagnostics = [&observer](const tune::Diagnostic& d) {
    note(observer, d.text, d.kind == tune::Diagnostic::Kind::kWarning);
  };
  return input;
}

// What one replica's pipeline runs per step: the first mini-batch, or replica 0's share of it.
torch::Tensor auto_plan_sample(const TrainingSetup& s, const RunLayout& layout, const Prepared& p) {
  Batches batches(s, p.model, p.data);
  torch::Tensor x = batches.source().largest().first;
  // The members of a context-parallel group share their replica's rows (each cuts its columns).
  const int replicas = layout.replicas / layout.context_parallel;
  if (replicas > 1) x = x.narrow(0, 0, microbatch_sizes(x.size(0), replicas)[0]);
  return x;
}

// Where the plan comes from: this process's profile (default), or rank 0's made with every rank
// (a multi-process run).
using PlanSource = std::function<partition::Plan(Prepared& p, const tune::AutoPlanInput& input,
                                                 const torch::Tensor& sample)>;

// The entries of a Hugging Face model in a rank's own stages.
std::vector<int64_t> own_entries(const TrainingSetup& s, const RunLayout& layout,
                                 int pipeline_rank) {
  const int64_t layers = hf_config(s.data).entries();
  return rank_layers(pipe_options(s.pipeline, layout, layers), layers, pipeline_rank);
}

// The entries of a Hugging Face model this process gives memory to: all in one process (and with
// an auto plan or --report-memory, whose rank 0 profiles the whole model), none in the launching
// parent (pipeline_rank -1: it only checks), a rank's own stages' on a rank.
std::optional<std::vector<int64_t>> hf_entries(const TrainingSetup& s, const RunLayout& layout,
                                               int pipeline_rank) {
  if (!is_hf_model(s.data.model) || !layout.multi_process || s.auto_request.any()) {
    return std::nullopt;
  }
  if (pipeline_rank < 0) return std::vector<int64_t>{};
  if (pipeline_rank == 0 && s.job.memory.report) return std::nullopt;  // it profiles every entry
  return own_entries(s, layout, pipeline_rank);
}

// The entries of a Hugging Face model whose values a rank writes only when ZeRO-3 takes them
// into its shard, a layer at a time (ZeroOptions::initial_values): its own stages' on CPU stages,
// unless a checkpoint is resumed (it writes every value) or an auto plan profiles the model.
std::vector<int64_t> values_on_demand(const TrainingSetup& s, const RunLayout& layout,
                                      int pipeline_rank) {
  if (pipeline_rank < 0 || !is_hf_model(s.data.model) || !layout.multi_process ||
      s.auto_request.any() || s.job.zero.stage != 3 || !s.resume.empty() || on_cuda(s.pipeline)) {
    return {};
  }
  return own_entries(s, layout, pipeline_rank);
}

// [2]: data, model (seeded), checks, the auto plan (the setup then holds its values; not in the
// launcher's parent, whose ranks plan), deferred batch norm, resume. Every rank does the same.
Prepared prepare(TrainingSetup& s, const RunLayout& layout, JobObserver& observer,
                 const PlanSource& plan_source = {}, bool leave_plan_to_ranks = false,
                 int pipeline_rank = -1, const parallel::TensorParallel& tp = {},
                 const parallel::ExpertParallel& ep = {},
                 const parallel::ContextParallel& cp = {}) {
  Prepared p;
  p.data = build_data(s.data);
  torch::manual_seed(s.data.seed);
  p.model = build_model(s.data, p.data, hf_entries(s, layout, pipeline_rank), tp,
                        values_on_demand(s, layout, pipeline_rank), ep, cp);
  check_data_against_model(p.model, p.data);
  check_batch_size(p.data, s.job.training.batch_size);
  if (s.auto_request.any() && !leave_plan_to_ranks) {
    const int64_t layers = static_cast<int64_t>(p.model.sequential->size());
    const tune::AutoPlanInput input = auto_plan_input(s, layout, layers, observer);
    const torch::Tensor sample = auto_plan_sample(s, layout, p);
    p.auto_plan = plan_source ? plan_source(p, input, sample)
                              : plan_training(p.model.sequential, sample, s.auto_request, input);
    tune::apply_auto_plan(s.pipeline, s.auto_request, *p.auto_plan);
  }
  if (!is_sequential(s.pipeline, layout)) {
    // Batch norms would update running statistics per micro-batch and again on recompute;
    // deferred ones update once per mini-batch, as sequential training does. The mini-batch is
    // every replica's micro-batches; the trainer sums the replicas' statistics before the commit.
    p.model.sequential = convert_deferred_batch_norm(
        p.model.sequential, chunks_of(s.pipeline, layout) * layout.replicas);
  }
  const std::string& resume = s.resume;
  if (!resume.empty()) {
    p.resume = as_bad_input("--resume", [&] {
      // A rank restores its own tensors (its tensor-parallel slices): from a sharded checkpoint
      // it reads only those, and under ZeRO only its shard's ranges of their optimizer state.
      return train::resume_checkpoint(
          resume, *p.model.sequential, s.job.optimizer.name,
          train::TensorParallelSlice{p.model.tensor_parallel_split, tp.rank(), tp.size()},
          /*optimizer_state_by_range=*/s.job.zero.stage > 0);
    });
  }
  return p;
}

// ---- the memory check ---------------------------------------------------------------------------

// The memory model's input for this run (tune/memory_check.h).
tune::MemoryCheckInput memory_check_input(const TrainingSetup& s, const RunLayout& layout,
                                          const Prepared& p) {
  tune::MemoryCheckInput input;
  if (p.model.llama) {
    input.llama = p.model.llama.get();
    input.tensor_parallel = layout.tensor_parallel;
    input.sequence_parallel = s.job.parallel.sequence_parallel;
    input.expert_parallel = static_cast<int>(s.job.parallel.ep);
    input.routing_imbalance = s.job.parallel.routing_imbalance;
    input.context_parallel = layout.context_parallel;
    input.ulysses = s.pipeline.cp_ulysses;
  } else {
    input.model = p.model.sequential;
    input.loss = p.model.loss;
  }
  Batches batches(s, p.model, p.data);
  std::tie(input.inputs, input.targets) = modelled_batch(batches, layout);
  const int64_t layers = static_cast<int64_t>(p.model.sequential->size());
  input.pipe = pipe_options(s.pipeline, layout, layers);
  input.run = memory_run_options(s, layout);
  const int ranks = layout.pipeline_ranks;
  if (layout.multi_process) {
    for (int r = 0; r < layout.world; ++r) input.ranks_of_process.push_back({r % ranks});
  } else {
    input.ranks_of_process.emplace_back();
    for (int r = 0; r < ranks; ++r) input.ranks_of_process.back().push_back(r);
  }
  input.budget_per_rank = s.memory_limit_bytes;
  // Evaluated on the main process (rank 0, or the one process), the whole model gathered there.
  if (!p.model.llama) input.evaluation_inputs = evaluation_batch(p.model, p.data);
  return input;
}

// Before any rank builds its share of the model: the memory model's need of this run on this
// machine against what it has; a run that does not fit is refused (BadInput) naming both and the
// settings that fit. Not for sequential training, an auto plan (bounded by --memory-limit) or
// ranks started by another launcher.
void check_memory(const TrainingSetup& s, const RunLayout& layout, Prepared& p,
                  JobObserver& observer) {
  const bool sequential = is_sequential(s.pipeline, layout);
  if (s.memory_limit_bytes > 0 && !s.auto_request.any() && sequential) {
    throw BadInput(
        "--memory-limit checks a pipelined run against the memory model, or bounds --balance/"
        "--schedule auto; sequential training (one stage, one process) is not modelled: give "
        "--stages 2 or more, or drop --memory-limit");
  }
  if (s.job.memory.skip_check || s.auto_request.any() || sequential) return;
  // The batches drawn here and the profile draw from the random generator: the run must draw
  // what it would have drawn without the check.
  tune::RandomStateGuard random;
  const tune::MemoryCheckInput input = memory_check_input(s, layout, p);
  const train::MemoryFit fit = as_bad_input("", [&] { return tune::check_run_memory(input); });
  if (!fit.fits()) throw BadInput(train::memory_fit_text(fit));
  p.predicted_memory = train::process_needs(fit, input.ranks_of_process);
  std::string list;
  for (int64_t bytes : p.predicted_memory) {
    list += (list.empty() ? "" : ",") + std::to_string(bytes);
  }
  ::setenv(kPredictedMemory, list.c_str(), 1);  // the ranks this process starts read it
  note(observer, "memory: this run needs " + partition::format_bytes(fit.run.needed) + " of the " +
                     partition::format_bytes(fit.available.bytes) + " available (" +
                     fit.available.source + ")");
}

// --zero-ladder: DeepSpeed's ladder walked on this run's memory check before anything starts
// (tune/memory_check.h, walk_memory_ladder), the chosen rung's ZeRO stage and offloads written
// into `job`. The ranks this process starts take the same rung (kZeroLadderRung) rather than
// walking again. Under an auto plan the ladder predicts the run's pipeline as its defaults would
// make it; the auto plan then plans within the chosen rung.
constexpr const char* kZeroLadderRung = "PIPETRAIN_ZERO_LADDER_RUNG";

void apply_rung(JobConfig& job, const tune::ZeroRung& rung) {
  job.zero.stage = rung.zero;
  job.zero.offload_optimizer = rung.nvme ? "nvme" : rung.offload_optimizer ? "cpu" : "none";
  job.zero.offload_params = rung.nvme ? "nvme" : rung.offload_params ? "cpu" : "none";
  if (!rung.nvme) job.zero.offload_dir.clear();  // given for the NVMe rung, not needed below it
}

void choose_zero_rung(JobConfig& job, JobObserver& observer) {
  if (const char* chosen = std::getenv(kZeroLadderRung)) {  // a rank: the launcher's choice
    apply_rung(job, tune::zero_ladder().at(static_cast<std::size_t>(std::stoi(chosen))));
    return;
  }
  if (job.parallel.nproc < 2) {
    throw BadInput(
        "--zero-ladder climbs ZeRO's stages, which shard over processes: give --nproc with "
        "--dp 2 or more");
  }
  JobConfig predicted = job;                           // the run as its defaults would pipeline it
  apply_rung(predicted, tune::zero_ladder().front());  // each rung applied by the prediction
  if (predicted.pipeline.schedule == "auto") predicted.pipeline.schedule.clear();
  if (predicted.pipeline.chunks == "auto") predicted.pipeline.chunks.clear();
  if (predicted.pipeline.checkpoint == "auto") predicted.pipeline.checkpoint.clear();
  if (predicted.pipeline.balance == std::vector<std::string>{"auto"}) {
    predicted.pipeline.balance.clear();
  }
  TrainingSetup s = resolve_training(predicted);
  RunLayout layout = layout_of(s.pipeline, static_cast<int>(job.parallel.nproc));
  layout.multi_process = true;
  Prepared p = prepare(s, layout, observer, {}, /*leave_plan_to_ranks=*/true);
  tune::RandomStateGuard random;
  const tune::MemoryCheckInput input = memory_check_input(s, layout, p);
  const tune::ZeroLadder ladder = as_bad_input(
      "", [&] { return tune::walk_memory_ladder(input, !job.zero.offload_dir.empty()); });
  const std::string text = tune::zero_ladder_text(ladder, s.memory_limit_bytes);
  if (ladder.chosen < 0) throw BadInput(text);
  note(observer, text.substr(0, text.size() - 1));
  apply_rung(job, tune::zero_ladder()[static_cast<std::size_t>(ladder.chosen)]);
  ::setenv(kZeroLadderRung, std::to_string(ladder.chosen).c_str(), 1);
}

// The optimizer offload, before anything starts: where it moves nothing it says so (once); under
// nvme the directory must have room for the whole model's optimizer state (every process of this
// machine writes its shard there).
void check_offload(const TrainingSetup& s, const Prepared& p, JobObserver& observer) {
  if (s.job.zero.offload_params == "cpu") {
    note(observer,
         "--offload-params cpu: these stages run on the CPU, so the parameter shards are in host "
         "memory already; nothing moves. --offload-params nvme moves them to files");
  }
  const std::string& offload = s.job.zero.offload_optimizer;
  if (offload == "none") return;
  if (offload == "cpu" && !on_cuda(s.pipeline)) {
    note(observer,
         "--offload-optimizer cpu: these stages run on the CPU, so the optimizer state is in "
         "host memory already; the shard takes the offload's path (a copy apart from the "
         "parameters) and nothing moves. --offload-optimizer nvme moves the state to files");
    return;
  }
  if (offload != "nvme") return;
  int64_t elements = 0;
  for (const torch::Tensor& t : train::unique_parameters(p.model.sequential->parameters())) {
    elements += t.numel();
  }
  const int64_t fields = offload_file_fields(s);
  // Beyond the state's: the parameter shards' values, and on CPU stages their gradient too.
  const int64_t with_params = fields - static_cast<int64_t>(partition::optimizer_state_multiple(
                                           s.job.optimizer.name, s.job.optimizer.momentum));
  const int64_t bytes = elements * fields * 4;
  train::check_nvme_directory(s.zero_options.nvme(), bytes,
                              "--offload-optimizer nvme (the optimizer state of " +
                                  std::to_string(elements) + " parameters)");
  note(observer, std::string(with_params == 2   ? "parameter shards, their gradients and "
                             : with_params == 1 ? "parameter shards and "
                                                : "") +
                     "optimizer state: " + partition::format_bytes(bytes) + " in files under " +
                     s.zero_options.nvme().dir() + ", through " +
                     std::to_string(s.zero_options.nvme().buffer_count()) + " buffers of " +
                     partition::format_bytes(s.zero_options.nvme().buffer_bytes()) +
                     " a process (" + offload::to_string(s.zero_options.nvme().io()) + ")");
}

// ---- [4] the loop -------------------------------------------------------------------------------

// Collective: the whole model on the main rank, evaluated there with every core.
void evaluate_and_report(const std::string& when, train::Trainer& trainer, const BuiltModel& model,
                         const BuiltData& data, JobObserver& observer) {
  if (!data.corpus && !data.test_inputs.defined()) return;
  if (!trainer.gather_model()) return;
  // The other ranks wait for the next step meanwhile: evaluate with every core.
  const int threads = at::get_num_threads();
  at::set_num_threads(
      std::max(threads, static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))));
  std::optional<train::Evaluation> e = evaluate(model, data);
  at::set_num_threads(threads);
  if (e) observer.on_evaluation({when, *e, when + ": " + describe_evaluation(*e, data)});
}

train::TrainSummary run_loop(const TrainingSetup& s, Prepared& p, train::Trainer& trainer,
                             const Batches& batches, train::StepRunner& runner, int threads,
                             JobObserver& observer) {
  if (runner.is_main()) {
    TrainingStart start;
    start.text = detail::start_text(s, p, batches, runner, threads);
    start.progress = detail::rate_options(s, p.model, p.data)
                         .total_steps(batches.total_steps())
                         .epochs(batches.epochs())
                         .first_step(trainer.first_step())
                         .log_every_steps(s.job.training.log_every);
    start.step_lines = p.data.name == "tensors";
    start.predicted_memory = p.predicted_memory;
    observer.on_start(start);
  }
  // A mixture's routing, recorded for --report-routing and the trace's counter tracks.
  const bool routing =
      s.job.output.report_routing ||
      (!s.job.output.trace.empty() && p.model.llama && models::is_moe(p.model.llama->architecture));
  if (routing) {
    models::routing_recorder().clear();
    models::routing_recorder().set_enabled(true);
    trainer.step_counts = [] {
      models::routing_recorder().end_step();
      return models::routing_recorder().last_step();
    };
  }
  trainer.on_step = [&](const train::StepReport& r) {
    if (r.main) observer.on_step(r);
  };
  trainer.on_epoch_end = [&](int64_t epoch) {
    if (runner.is_main()) observer.on_epoch_end(epoch);
    evaluate_and_report("epoch " + std::to_string(epoch + 1), trainer, p.model, p.data, observer);
  };
  trainer.on_checkpoint = [&](const std::string& directory, const train::Trainer::SaveFigures& f) {
    if (f.main) observer.on_checkpoint({directory, f, detail::checkpoint_text(directory, f)});
  };
  return trainer.fit();
}

// Runs on every rank (or the single process) once the runner exists. `pipe`: the pipeline's
// options (null for sequential training).
train::TrainSummary train_with(const TrainingSetup& s, Prepared& p, train::StepRunner& runner,
                               int threads, const PipeOptions* pipe, const RunLayout& layout,
                               JobObserver& observer) {
  Batches batches(s, p.model, p.data);
  train::TrainerOptions options = trainer_settings(s, batches.total_steps())
                                      .metadata({{"model", p.model.name},
                                                 {"model_options", p.model.options},
                                                 {"data", s.data.data},
                                                 {"batch_size", s.job.training.batch_size},
                                                 {"seed", s.data.seed},
                                                 {"optimizer", s.job.optimizer.name},
                                                 {"lr", s.job.optimizer.lr}});
  train::Trainer trainer(p.model.sequential, runner, batches.source(), options);
  if (p.resume) {
    try {
      trainer.resume(*p.resume);
    } catch (const train::CheckpointError& error) {
      throw BadInput("--resume " + s.resume + ": " + std::string(error.what()));
    }
  }
  const bool main = runner.is_main();
  if (main && !s.job.checkpoint.dir.empty()) {
    as_bad_input("--checkpoint-dir", [&] { write_job_file(s.job.checkpoint.dir, s.job); });
  }
  const train::TrainSummary result = run_loop(s, p, trainer, batches, runner, threads, observer);
  if (p.data.corpus) evaluate_and_report("final", trainer, p.model, p.data, observer);
  TrainingDone done;
  done.summary = result;
  // The report profiles this rank's modules: under ZeRO-3 they are gathered for it (every rank).
  if (pipe && s.job.memory.report) trainer.gather_parameters();
  if (main && pipe) done.text += detail::memory_report_text(s, p, batches, result, *pipe, layout);
  if (main && pipe && pipe->offload_activations()) {
    done.text += train::offload_report_text(runner.rank_holdings(), true);
  }
  if (main) done.text += detail::result_text(s, p, batches, runner, result, done.rate);
  const std::string& save_params = s.job.output.save_params;
  if (!save_params.empty()) {
    const std::optional<train::Checkpoint> whole = trainer.gather_weights();  // on the main rank
    if (whole) {
      const size_t saved = train::save_parameters(save_params, *whole, *p.model.sequential);
      done.text += "saved " + std::to_string(saved) + " parameters to " + save_params + "\n";
    }
  }
  const std::string& save_hf = s.job.output.save_hf;
  if (!save_hf.empty()) {  // every process writes its share; nothing is gathered
    const auto start = std::chrono::steady_clock::now();
    const auto files = models::save_llama_hf(trainer, save_hf, *p.model.llama);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    char line[64];
    std::snprintf(line, sizeof line, "%.2f", seconds);
    done.text += "saved " + std::string(models::to_string(p.model.llama->architecture)) + " to " +
                 save_hf + " (" + std::to_string(files.size()) + " files by " +
                 std::to_string(runner.processes()) + " processes in " + line + " s)\n";
  }
  if (main) observer.on_done(done);
  return result;
}

// ---- the three ways to run ----------------------------------------------------------------------

// A restarted rank (torchrun --max-restarts, or parallel.max_restarts here) continues from the
// last checkpoint of checkpoint.dir; every rank takes the same file, as with --resume.
void resume_after_restart(TrainingSetup& s, int restart_count, JobObserver& observer) {
  if (restart_count == 0) return;
  if (auto file = train::checkpoint_after_restart(s.job.checkpoint.dir, restart_count)) {
    note(observer, "restart " + std::to_string(restart_count) + ": resuming from " + *file);
    s.resume = *file;
  } else {
    note(observer, "restart " + std::to_string(restart_count) + ": no checkpoint in " +
                       "--checkpoint-dir '" + s.job.checkpoint.dir + "' yet; starting over");
  }
}

// The peak MFU divides by (train/device_peak.h): --peak-tflops per device, else a known GPU's,
// else the CPU's measured once -- by the process that launches the ranks, which hand it down.
void resolve_peak(TrainingSetup& s, bool launched, int processes) {
  if (!is_hf_model(s.data.model)) return;  // FLOPs per token: the Llama family's
  if (const char* handed = std::getenv(kPeakFlops); launched && handed != nullptr) {
    const std::string text = handed;
    const size_t cut = text.find(';');
    s.peak = {std::atof(text.substr(0, cut).c_str()),
              cut == std::string::npos ? "" : text.substr(cut + 1)};
    return;
  }
  const bool cuda = on_cuda(s.pipeline);
  s.peak = train::run_peak(s.job.training.peak_tflops,
                           cuda ? device_name(torch::Device(torch::kCUDA, 0)) : "",
                           s.pipeline.precision != Precision::kFloat32, cuda ? processes : 1,
                           static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  ::setenv(kPeakFlops, (std::to_string(s.peak.flops) + ";" + s.peak.source).c_str(), 1);
}

// The parent of --nproc N: checks everything a rank would reject (BadInput here, not exit 1 in a
// rank), then starts the ranks. An auto plan is made by the ranks, once, on rank 0 (it measures
// the processes themselves); the parent checks what it can without it.
JobResult launch_ranks(TrainingSetup& s, JobObserver& observer) {
  const int nproc = static_cast<int>(s.job.parallel.nproc);
  RunLayout layout = layout_of(s.pipeline, nproc);
  layout.multi_process = true;  // a world of one too (ZeRO-3 at one replica): this parent holds
                                // no entries of the model, its rank all of them
  const bool auto_plan = s.auto_request.any();
  Prepared p = prepare(s, layout, observer, {}, /*leave_plan_to_ranks=*/auto_plan);
  if (!auto_plan)
    pipe_options(s.pipeline, layout, static_cast<int64_t>(p.model.sequential->size()));
  if (layout.tensor_parallel > 1) {  // check_tensor_parallel: a Hugging Face model
    as_bad_input(
        "", [&] { models::check_llama_tensor_parallel(*p.model.llama, layout.tensor_parallel); });
  }
  check_memory(s, layout, p, observer);
  check_offload(s, p, observer);
  const std::string tensor = layout.tensor_parallel > 1
                                 ? std::to_string(layout.tensor_parallel) + " tensor-parallel x "
                                 : "";
  const int context = layout.context_parallel;
  note(observer, "launching " + std::to_string(layout.world) +
                     (layout.world == 1 ? " process (" : " processes (") +
                     std::to_string(layout.pipeline_ranks) + " pipeline x " + tensor +
                     std::to_string(layout.replicas / context) + " data-parallel" +
                     (context > 1 ? " x " + std::to_string(context) + " context-parallel)" : ")") +
                     (auto_plan ? "; rank 0 makes the auto plan" : ""));
  // The check's profile is done: what it freed goes back to the system before this process
  // waits out the run beside its ranks (their machine's memory).
  malloc_trim(0);
  if (s.job.parallel.ranks_per_host > 0) {  // the ranks' hosts (DistributedEnvironment)
    ::setenv("PIPETRAIN_RANKS_PER_HOST", std::to_string(s.job.parallel.ranks_per_host).c_str(), 1);
  }
  JobResult result;
  result.exit_code = launch_self(nproc, self_arguments(), std::chrono::milliseconds(10'000),
                                 static_cast<int>(s.job.parallel.max_restarts));
  return result;
}

// Every rank got the auto flags: rank 0 plans, with every rank taking part in what it measures on
// the processes; all take its plan (or its error).
PlanSource plan_on_ranks(const TrainingSetup& s, const RunLayout& layout, Distributed& distributed,
                         JobObserver& observer) {
  return [&s, layout, &distributed, &observer](Prepared& p, const tune::AutoPlanInput& input,
                                               const torch::Tensor& sample) {
    // Tensor parallelism: rank 0 profiles a mirror copy; the timed steps run every rank. Its
    // profile has no collective: the group's, from an all-reduce measured on the ranks, are added
    // to it (tune::add_tensor_parallel_collectives).
    std::optional<BuiltModel> mirrored;
    tune::AutoPlanInput planned = input;
    const bool sequence_parallel = s.job.parallel.sequence_parallel;
    // Expert parallelism likewise: a mirror's experts get the tokens of identical members (the
    // all-to-all's time is not in the profile).
    // Context parallelism likewise, on one cp rank's columns of the rows (the steps cut theirs).
    const int cp = layout.context_parallel;
    if (layout.tensor_parallel > 1 || s.job.parallel.ep > 1 || cp > 1) {
      mirrored = build_mirror_model(s.data, p.data, layout.tensor_parallel, sequence_parallel,
                                    static_cast<int>(s.job.parallel.ep), cp, s.pipeline.cp_ulysses);
    }
    const torch::Tensor profiled_sample =
        cp > 1 ? sample.narrow(1, 0, sample.size(1) / cp) : torch::Tensor();
    if (layout.tensor_parallel > 1) {
      planned.tensor_parallel_collectives = tune::llama_tensor_parallel_collectives(
          *p.model.llama, sample.size(1) / cp, sequence_parallel, input.precision);
    }
    partition::Plan plan =
        plan_training_on_ranks(distributed, p.model.sequential, sample, s.auto_request, planned,
                               mirrored ? &mirrored->sequential : nullptr, profiled_sample);
    if (distributed.rank() == 0) note(observer, tune::describe_auto_plan(plan));
    return plan;
  };
}

// Sums a blob of int64 counts over every rank on rank 0 (empty elsewhere).
std::vector<int64_t> sum_over_ranks(Distributed& distributed, const std::vector<int64_t>& mine) {
  std::vector<char> bytes(mine.size() * sizeof(int64_t));
  std::memcpy(bytes.data(), mine.data(), bytes.size());
  const std::vector<std::vector<char>> all =
      distributed.world()->world_group()->gather_bytes(bytes);
  if (distributed.rank() != 0) return {};
  std::vector<int64_t> sum(mine.size(), 0);
  for (const std::vector<char>& blob : all) {
    std::vector<int64_t> theirs(mine.size(), 0);
    std::memcpy(theirs.data(), blob.data(), std::min(blob.size(), bytes.size()));
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += theirs[i];
  }
  return sum;
}

// --report-routing: the tokens each expert of each MoE layer received, step by step, summed over
// every rank (pipeline ranks hold other layers, replicas other tokens) on rank 0.
void report_routing(Distributed* distributed, const TrainingSetup& s, JobObserver& observer) {
  std::vector<models::RoutingRecorder::Counts> steps = models::routing_recorder().steps();
  // Tensor parallelism without sequence parallelism: every tp rank routed the same tokens.
  if (distributed && distributed->tp_rank() != 0 && !s.job.parallel.sequence_parallel) {
    steps.clear();
  }
  if (distributed) {
    const std::vector<int64_t> flat = models::flatten_routing(steps);
    std::vector<char> bytes(flat.size() * sizeof(int64_t));
    std::memcpy(bytes.data(), flat.data(), bytes.size());
    const std::vector<std::vector<char>> all =
        distributed->world()->world_group()->gather_bytes(bytes);
    if (distributed->rank() != 0) return;
    steps.clear();
    for (const std::vector<char>& blob : all) {
      std::vector<int64_t> theirs(blob.size() / sizeof(int64_t));
      std::memcpy(theirs.data(), blob.data(), theirs.size() * sizeof(int64_t));
      models::merge_routing(steps, models::unflatten_routing(theirs));
    }
  }
  std::string text = models::routing_report(steps, s.job.training.log_every);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  note(observer, text);
}

// --report-comm: every rank's collective traffic (C10dWorld::traffic) summed on rank 0, per step,
// by kind and by what ZeRO sent it for (its TrafficLabels, train::kZeroTrafficLabels).
void report_comm(Distributed& distributed, int64_t steps, JobObserver& observer) {
  std::vector<int64_t> mine;
  for (int k = 0; k < kTrafficKinds; ++k) {
    const CollectiveTraffic t = distributed.world()->traffic(static_cast<TrafficKind>(k));
    mine.push_back(t.within_host);
    mine.push_back(t.between_hosts);
  }
  const std::map<std::string, CollectiveTraffic> labelled = distributed.world()->labelled_traffic();
  for (const char* label : train::kZeroTrafficLabels) {
    const auto found = labelled.find(label);
    mine.push_back(found == labelled.end() ? 0 : found->second.within_host);
    mine.push_back(found == labelled.end() ? 0 : found->second.between_hosts);
  }
  const std::vector<int64_t> sum = sum_over_ranks(distributed, mine);
  if (distributed.rank() != 0) return;
  const int64_t per = std::max<int64_t>(1, steps);
  const auto pair = [&](std::size_t i) {
    return partition::format_bytes(sum[i] / per) + " / " +
           partition::format_bytes(sum[i + 1] / per);
  };
  std::string text =
      "comm: per step, every rank's collectives (as a ring sends them), within "
      "hosts / between hosts:";
  int64_t within = 0, between = 0;
  for (int k = 0; k < kTrafficKinds; ++k) {
    within += sum[2 * k];
    between += sum[2 * k + 1];
    text += std::string(k ? "," : "") + " " + to_string(static_cast<TrafficKind>(k)) + " " +
            pair(2 * static_cast<std::size_t>(k));
  }
  text += "; in all " + partition::format_bytes(within / per) + " / " +
          partition::format_bytes(between / per);
  note(observer, text);
  std::string zero = "comm: per step, ZeRO's:";
  bool any = false;
  for (std::size_t i = 0; i < std::size(train::kZeroTrafficLabels); ++i) {
    const std::size_t at = 2 * kTrafficKinds + 2 * i;
    any = any || sum[at] || sum[at + 1];
    zero += std::string(i ? "," : "") + " " + train::kZeroTrafficLabels[i] + " " + pair(at);
  }
  // Exact byte counts for the bench to compare (the figures above are rounded).
  zero += " (bytes:";
  for (std::size_t i = 0; i < std::size(train::kZeroTrafficLabels); ++i) {
    const std::size_t at = 2 * kTrafficKinds + 2 * i;
    zero += " " + std::to_string(sum[at] / per) + " " + std::to_string(sum[at + 1] / per);
  }
  zero += ")";
  if (any) note(observer, zero);
}

// --ep: the dispatch and combine all-to-alls (parallel::all_to_all_rows_stats), per step: the
// time a rank spent inside them and the part of it no compute covered (means over ranks), and
// what every rank sent.
void report_expert_exchange(Distributed& distributed, int64_t steps, JobObserver& observer) {
  const parallel::AllToAllRowsStats mine = parallel::all_to_all_rows_stats();
  const std::vector<int64_t> sums = sum_over_ranks(
      distributed, {mine.calls, static_cast<int64_t>(mine.seconds * 1e9), mine.bytes_sent,
                    static_cast<int64_t>(mine.exposed_seconds * 1e9)});
  if (distributed.rank() != 0 || steps <= 0) return;
  const double per = static_cast<double>(steps);
  const double ranks = distributed.world_size();
  note(observer,
       format_text("expert all-to-all: %.3f ms per step per rank inside the dispatch and combine, "
                   "%.3f ms of it exposed (no compute beside it; means over ranks), %.0f exchanges "
                   "per step per rank, %s sent per step (every rank)",
                   static_cast<double>(sums[1]) / 1e6 / per / ranks,
                   static_cast<double>(sums[3]) / 1e6 / per / ranks,
                   static_cast<double>(sums[0]) / per / ranks,
                   partition::format_bytes(static_cast<int64_t>(sums[2] / per)).c_str()));
}

// --cp ring: the passes of every ring attention (parallel::ring_stats), per step.
void report_ring(Distributed& distributed, int64_t steps, bool overlap, JobObserver& observer) {
  const parallel::RingStats mine = parallel::ring_stats();
  const std::vector<int64_t> sums = sum_over_ranks(
      distributed, {mine.passes, mine.bytes_sent, static_cast<int64_t>(mine.wait_seconds * 1e9)});
  if (distributed.rank() != 0 || steps <= 0) return;
  const double per = static_cast<double>(steps);
  const double ranks = distributed.world_size();
  note(observer,
       format_text("ring attention: %.3f ms per step per rank waiting for the ring's passes (%s; "
                   "means over ranks), %.0f passes per step per rank, %s sent per step (every "
                   "rank)",
                   static_cast<double>(sums[2]) / 1e6 / per / ranks,
                   overlap ? "each beside its block's compute" : "each waited for at once",
                   static_cast<double>(sums[0]) / per / ranks,
                   partition::format_bytes(static_cast<int64_t>(sums[1] / per)).c_str()));
}

// One rank of a multi-process run (the torchrun environment).
JobResult run_rank(TrainingSetup& s, JobObserver& observer) {
  DistributedEnvironment environment = DistributedEnvironment::from_environment();
  resume_after_restart(s, environment.restart_count, observer);
  std::vector<int64_t> predicted_memory;  // the parent's check_memory
  if (const char* list = std::getenv(kPredictedMemory)) {
    std::stringstream items(list);
    for (std::string item; std::getline(items, item, ',');) {
      predicted_memory.push_back(std::atoll(item.c_str()));
    }
  }
  RunLayout layout = layout_of(s.pipeline, environment.world_size);
  layout.multi_process = true;  // a rank, in a world of one too
  layout.expert_parallel = static_cast<int>(s.job.parallel.ep);
  const int threads = threads_per_rank(s.pipeline, layout);
  at::set_num_threads(threads);
  // This process's stages: cuda:LOCAL_RANK under --device cuda, or its entry of --devices. It
  // picks the backend under auto (nccl on a GPU) and the GPU NCCL binds.
  const torch::Device device =
      as_bad_input("", [&] { return process_device(s.pipeline, environment.local_rank); });
  DistributedOptions options;
  // The world's waits and the transport's (pipe_options below) from one conversion.
  options.timeout(timeout_of(PipeOptions().timeout_seconds(s.pipeline.timeout)))
      .pipeline_ranks(layout.pipeline_ranks)
      .tensor_parallel(layout.tensor_parallel)
      .expert_parallel(static_cast<int>(s.job.parallel.ep))
      .expert_parallel_second_lane(s.job.parallel.ep_overlap)
      .context_parallel(layout.context_parallel)
      .context_parallel_ulysses(s.pipeline.cp_ulysses)
      .context_parallel_overlap(!s.job.parallel.cp_serial_passes)
      .backend(s.job.parallel.backend)
      .device(device);
  std::string bad_input;  // the auto plan failed on rank 0: every rank stops with exit 2
  JobResult result;
  result.exit_code = run_distributed(options, [&](Distributed& distributed) {
    std::optional<Prepared> p;
    try {
      p.emplace(prepare(s, layout, observer, plan_on_ranks(s, layout, distributed, observer), false,
                        distributed.pipeline_rank(),
                        parallel::TensorParallel{distributed.tensor_parallel_group(),
                                                 s.job.parallel.sequence_parallel},
                        parallel::ExpertParallel{distributed.expert_parallel_group(),
                                                 distributed.expert_parallel_second_group()},
                        distributed.context_parallel()));
    } catch (const tune::AutoPlanError& error) {
      bad_input = error.what();  // every rank is here: stop cleanly, BadInput below
      return;
    }
    p->predicted_memory = predicted_memory;
    // ZeRO-3 writes the values it waits for as it takes them into the shard.
    if (p->model.fill_values) s.zero_options.initial_values(p->model.fill_values);
    PipeOptions pipe =
        pipe_options(s.pipeline, layout, static_cast<int64_t>(p->model.sequential->size()));
    const std::string text = describe_pipeline(pipe, pipe.balance(), layout);
    as_bad_input("--device", [&] { check_device_usable(device); });
    auto runner = train::make_distributed_runner(
        distributed, p->model.sequential, p->model.loss, pipe, text, p->model.tied_parameters,
        device,
        train::TensorParallelModel{p->model.tensor_parallel_split, s.job.parallel.sequence_parallel,
                                   p->model.llama ? std::function<bool(const std::string&)>(
                                                        models::tensor_parallel_summed_in_backward)
                                                  : nullptr});
    if (distributed.rank() == 0 && distributed.world()->checks_collectives()) {
      note(observer,
           "TORCH_DISTRIBUTED_DEBUG=DETAIL: each collective is compared with its group's before "
           "it is posted (one more small collective each; docs/DISTRIBUTED.md)");
    }
    result.summary = train_with(s, *p, *runner, threads, &pipe, layout, observer);
    if (s.job.output.report_comm) {
      report_comm(distributed, result.summary ? result.summary->steps : 0, observer);
    }
    if (s.job.output.report_routing) report_routing(&distributed, s, observer);
    if (s.job.parallel.ep > 1) {
      report_expert_exchange(distributed, result.summary ? result.summary->steps : 0, observer);
    }
    if (layout.context_parallel > 1 && !s.pipeline.cp_ulysses) {
      report_ring(distributed, result.summary ? result.summary->steps : 0,
                  !s.job.parallel.cp_serial_passes, observer);
    }
  });
  if (result.exit_code == 0 && !bad_input.empty()) throw BadInput(bad_input);
  return result;
}

// One process: a worker thread per pipeline rank, or plain sequential training.
JobResult run_in_process(TrainingSetup& s, JobObserver& observer) {
  RunLayout layout = layout_of(s.pipeline, 1);
  const int threads = threads_per_rank(s.pipeline, layout);
  Prepared p = prepare(s, layout, observer);
  if (p.auto_plan) note(observer, tune::describe_auto_plan(*p.auto_plan));
  check_memory(s, layout, p, observer);
  check_offload(s, p, observer);
  std::unique_ptr<train::StepRunner> runner;
  std::optional<PipeOptions> pipe;
  if (is_sequential(s.pipeline, layout)) {
    if (s.job.memory.report) {
      throw BadInput(
          "--report-memory reports the ranks of a pipeline, and this run is sequential training; "
          "give --stages 2 or more (or --chunks 2 or more)");
    }
    if (s.pipeline.offload_activations) {
      throw BadInput(
          "--offload-activations moves what micro-batches keep while they wait for their "
          "backward, and sequential training has none waiting; give --stages 2 or more (or "
          "--chunks 2 or more)");
    }
    at::set_num_threads(threads);
    const std::vector<torch::Device> device = as_bad_input(
        "--device", [&] { return rank_devices(s.pipeline.device, s.pipeline.devices, 1); });
    p.model.sequential->to(device[0]);
    runner = train::make_sequential_runner(p.model.sequential, p.model.loss, s.pipeline.precision);
  } else {
    pipe = pipe_options(s.pipeline, layout, static_cast<int64_t>(p.model.sequential->size()));
    runner = as_bad_input(
        "", [&] { return train::make_pipe_runner(p.model.sequential, p.model.loss, *pipe); });
  }
  JobResult result;
  result.summary = train_with(s, p, *runner, threads, pipe ? &*pipe : nullptr, layout, observer);
  if (s.job.output.report_routing) report_routing(nullptr, s, observer);
  return result;
}

}  // namespace

JobResult run_training(const JobConfig& given, JobObserver& observer) {
  JobConfig job = given;
  if (job.zero.ladder) choose_zero_rung(job, observer);
  TrainingSetup s = resolve_training(job);
  const bool launched = DistributedEnvironment::present();
  resolve_peak(s, launched,
               launched ? DistributedEnvironment::from_environment().world_size
                        : static_cast<int>(job.parallel.nproc));
  // ZeRO-3 at one replica (DeepSpeed's stage 3 on one device): one rank process, a world of one;
  // the in-process pipe gathers no parameters.
  const bool one_rank = job.parallel.nproc == 1 && job.zero.stage == 3 && s.pipeline.stages == 1 &&
                        s.pipeline.balance.empty();
  if ((job.parallel.nproc > 1 || one_rank) && !launched) return launch_ranks(s, observer);
  if (launched) return run_rank(s, observer);
  return run_in_process(s, observer);
}

}  // namespace pipetrain::job
