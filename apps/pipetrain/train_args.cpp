// `pipetrain train`'s flags and their checks (train_args.h).
#include "train_args.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "commands.h"
#include "model_data.h"
#include "pipetrain/base/atomic_file.h"
#include "pipetrain/partition/memory.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/stage/precision.h"
#include "pipetrain/train/lr_schedule.h"
#include "pipetrain/train/optimizer.h"
#include "pipetrain/train/trainer.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain::cli {
namespace {

using tune::AutoRequest;

const std::vector<std::string> kCheckpoints = {"always", "except_last", "never"};

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The run's length and the pipeline: steps, batches, stages, balance, schedule, checkpointing.
void add_pipeline_flags(CLI::App& command, TrainArgs& args) {
  command.add_option("--epochs", args.epochs, "passes over the training data")
      ->capture_default_str();
  command.add_option("--steps", args.steps,
                     "optimizer steps; overrides --epochs (required for --data text). "
                     "Default: epochs x batches per epoch");
  command.add_option("--batch-size", args.batch_size, "rows per mini-batch N")
      ->capture_default_str();
  command.add_option("--chunks", args.chunks_text,
                     "micro-batches per mini-batch M, or auto (the planner's). Default: 1 without "
                     "a pipeline, else 2 x pipeline ranks; auto with --schedule auto");
  command
      .add_option("--stages", args.pipeline.stages,
                  "pipeline ranks K in one process (worker threads); layers split as evenly as "
                  "possible. 1 with --chunks 1 is plain sequential training")
      ->capture_default_str()
      ->each([&args](const std::string&) { args.pipeline.stages_given = true; });
  command
      .add_option("--balance", args.balance_text,
                  "layers per stage, comma-separated (K*V entries summing to the layer count), "
                  "instead of --stages; or auto: profile the model and split it over the K "
                  "ranks for the fastest step (docs/TRAIN_CLI.md, \"Auto plan\")")
      ->delimiter(',');
  command
      .add_option("--nproc", args.nproc,
                  "processes on this machine (pipeline ranks x data-parallel replicas); > 1 "
                  "starts them with the local launcher")
      ->capture_default_str();
  command.add_option("--max-restarts", args.max_restarts,
                     "when a rank fails, stop all and start them again up to this many times, "
                     "resuming from --checkpoint-dir (torchrun's --max-restarts)");
  command.add_option("--pp", args.pipeline.pp,
                     "pipeline ranks per replica in a multi-process run. Default: processes / "
                     "--dp");
  command.add_option("--dp", args.pipeline.dp, "data-parallel replicas in a multi-process run")
      ->capture_default_str();
  command
      .add_option("--tp", args.pipeline.tp,
                  "tensor-parallel processes per pipeline rank (Megatron's split of a Llama "
                  "model's heads, MLP and vocabulary; --nproc = pp x tp x dp)")
      ->capture_default_str();
  command.add_flag("--sequence-parallel", args.sequence_parallel,
                   "with --tp: norms and residuals on 1/tp of the sequence, and 1/tp of each "
                   "activation sent between stages (--seq-len divisible by --tp)");
  command
      .add_option(
          "--schedule", args.pipeline.schedule,
          "schedule: " + join_names(schedule::schedule_names()) +
              " (custom with --schedule-file), or auto: the planner picks the schedule and, "
              "unless given, chunks, checkpoint, virtual stages and balance")
      ->capture_default_str()
      ->each([&args](const std::string&) { args.schedule_given = true; });
  command.add_option("--schedule-file", args.pipeline.schedule_file,
                     "custom schedule: the text form (one line of actions per rank) or, for a "
                     "*.csv file, torch.distributed.pipelining's compute-only CSV");
  command
      .add_option("--virtual", args.pipeline.virtual_stages,
                  "chunks per rank V (interleaved-1f1b: default 1; interleaved-zb, looped-bfs and "
                  "the V-shaped zb-v, v-half, v-min, dualpipev: 2)")
      ->each([&args](const std::string&) { args.virtual_given = true; });
  command
      .add_option("--checkpoint", args.pipeline.checkpoint,
                  "micro-batches that recompute their forward before backward: " +
                      join_names(kCheckpoints) + ", or auto (the planner's)")
      ->capture_default_str()
      ->each([&args](const std::string&) { args.checkpoint_given = true; });
  command.add_option("--memory-limit", args.memory_limit,
                     "bytes per rank: the budget the run is checked against before it starts "
                     "(instead of the machine's), and an auto plan may use (e.g. 2GiB, 512MiB; "
                     "none: no limit)");
  command.add_flag("--skip-memory-check", args.skip_memory_check,
                   "start the run even where the memory model predicts it will not fit");
}

// The optimizer, its learning-rate schedule and clipping.
void add_optimizer_flags(CLI::App& command, TrainArgs& args) {
  command
      .add_option("--optimizer", args.optimizer,
                  "optimizer: " + join_names(train::optimizer_names()))
      ->capture_default_str();
  command.add_option("--lr", args.lr, "learning rate (peak, with a schedule)")
      ->capture_default_str();
  command.add_option("--momentum", args.momentum, "SGD momentum")->capture_default_str();
  command.add_option("--adam-betas", args.adam_betas, "Adam/AdamW moment decays B1,B2")
      ->delimiter(',')
      ->capture_default_str();
  command.add_option("--adam-eps", args.adam_eps, "Adam/AdamW epsilon")->capture_default_str();
  command
      .add_option("--weight-decay", args.weight_decay,
                  "L2 penalty (sgd, adam) or decoupled weight decay (adamw)")
      ->capture_default_str();
  command.add_option("--warmup-steps", args.warmup_steps, "steps of linear learning-rate warm-up")
      ->capture_default_str();
  command
      .add_option("--lr-schedule", args.lr_schedule,
                  "after the warm-up: " + join_names(train::lr_schedule_names()) +
                      " (cosine decays to --min-lr at the last step)")
      ->capture_default_str();
  command.add_option("--min-lr", args.min_lr, "floor of the cosine schedule")
      ->capture_default_str();
  command
      .add_option("--clip-grad-norm", args.clip_grad_norm,
                  "clip gradients to this global L2 norm (0: no clipping)")
      ->capture_default_str();
  command
      .add_option("--zero", args.zero,
                  "ZeRO stage over the data-parallel replicas: 0 none, 1 optimizer state "
                  "sharded, 2 gradients held between steps sharded too, 3 parameters too "
                  "(gathered around each stage's actions) (needs --dp > 1)")
      ->capture_default_str();
  command.add_flag("--reshard-after-forward", args.reshard_after_forward,
                   "ZeRO-3: free a stage's gathered parameters after every forward and backward "
                   "and gather them again for the next (less memory, more traffic); default: "
                   "kept from the stage's first action of a step to its last");
  command
      .add_option("--zero-gradients", args.zero_gradients,
                  "--zero 2/3: stream (each micro-batch's gradients reduce-scattered into the "
                  "shard as its backward makes them) or accumulate (summed over the step, then "
                  "reduce-scattered: more memory, fewer collectives)")
      ->capture_default_str();
  command
      .add_option("--zero3-unit", args.zero3_unit,
                  "--zero 3 gathers by layer (each layer around its uses) or stage (a stage "
                  "from its first action of the step to its last)")
      ->capture_default_str();
  const char* sizes[4][2] = {
      {"--zero3-prefetch", "--zero3-unit layer: bytes of layers gathered ahead of use (0: none)"},
      {"--zero3-max-live",
       "--zero3-unit layer: most bytes of whole layers a prefetch may bring "
       "(0: no bound)"},
      {"--zero3-max-reuse-distance",
       "--zero3-unit layer: keep a layer whole when its next use "
       "comes within this many bytes of other layers (-1: never)"},
      {"--zero3-persistence-threshold", "--zero 3: parameters smaller than this stay whole"}};
  for (int s = 0; s < 4; ++s) {
    command.add_option(sizes[s][0], args.zero3_sizes[s], sizes[s][1])->capture_default_str();
  }
  command.add_flag("--zero-keep-freed-memory", args.zero_keep_freed_memory,
                   "--zero 2/3 on the CPU: leave the heap's freed pages resident (faster, more "
                   "resident memory) instead of returning them after each layer");
  command.add_flag("--report-memory", args.report_memory,
                   "after the last step, print what each rank holds per category (parameters, "
                   "gradients, optimizer state, activations, transport), predicted by the memory "
                   "model and measured (docs/MEMORY.md)");
  command.add_flag("--overlap-grad-reduce", args.pipeline.overlap_grad_reduce,
                   "with --dp 2 or more: start a stage's gradient sum (all-reduce in buckets; "
                   "--zero 1-3: reduce-scatter) once its last backward of the step ends, while the "
                   "rest of the step runs (docs/DISTRIBUTED.md)");
  command.add_option("--bucket-size", args.pipeline.bucket_mb,
                     "MiB per gradient bucket of --overlap-grad-reduce (default 25, DDP's)");
  command.add_flag("--offload-optimizer", args.offload_optimizer,
                   "ZeRO-Offload, with --zero 1, 2 or 3 and --device cuda: the optimizer state and "
                   "the shard's float32 values in pinned host memory, stepped on the CPU "
                   "(docs/DISTRIBUTED.md)");
  command.add_flag("--offload-activations", args.pipeline.offload_activations,
                   "checkpointed micro-batches' inputs wait in pinned host memory until their "
                   "backward (CUDA stages); on CPU stages it is accounted, not a saving "
                   "(docs/MEMORY.md)");
  command
      .add_option("--precision", args.precision_name,
                  "fp32, or bf16: layers under autocast, activations and gradients cross stages "
                  "in bfloat16, float32 weights and loss (fp16 needs CUDA stages)")
      ->capture_default_str();
}

// Seeds, threads, what is written (trace, timeline, parameters, checkpoints), processes.
void add_run_flags(CLI::App& command, TrainArgs& args) {
  command
      .add_option("--seed", args.data.seed,
                  "seed of the initial weights, the data order and the random streams")
      ->capture_default_str();
  command
      .add_option("--threads", args.pipeline.threads,
                  "intra-op threads per pipeline rank (0: the cores shared among the ranks)")
      ->capture_default_str();
  command.add_option("--trace", args.trace,
                     "write every executed action of every rank here (Chrome trace JSON; "
                     "chrome://tracing or ui.perfetto.dev)");
  command.add_option("--timeline", args.timeline,
                     "draw the measured timeline of one step here (SVG: rows = ranks)");
  command.add_option("--summary-json", args.summary_json,
                     "write the run's summary here as JSON: steps, seconds, samples, tokens and "
                     "counted targets, their rates, MFU and the peak it divides by, losses, each "
                     "process's peak memory");
  command.add_option("--save-params", args.save_params,
                     "write {parameter name: tensor} here at the end (torch.load reads it)");
  command.add_option("--save-hf", args.save_hf,
                     "a Hugging Face --model: write it here at the end as transformers saves it "
                     "(safetensors and config.json; from_pretrained loads it)");
  command
      .add_option("--device", args.pipeline.device,
                  "cpu, or cuda: pipeline rank r on cuda:(r mod GPUs) in one process, rank r "
                  "on cuda:LOCAL_RANK with --nproc")
      ->capture_default_str();
  command
      .add_option("--devices", args.pipeline.devices,
                  "one device per pipeline rank in one process, e.g. cuda:0,cuda:1; with --nproc "
                  "one per process in local rank order (cuda:0,cuda:0 shares a GPU over "
                  "--backend gloo)")
      ->delimiter(',');
  command.add_option(
      "--checkpoint-dir", args.checkpoint_dir,
      "write a checkpoint every --save-every steps and at the end: DIR/step-N/ with DIR/latest "
      "(--checkpoint-format sharded) or DIR/checkpoint.pt (file)");
  command
      .add_option("--checkpoint-format", args.checkpoint_format,
                  "sharded: every rank writes its own part, no gather, any layout resumes from it; "
                  "file: one file gathered by rank 0")
      ->capture_default_str();
  command.add_flag("--async-checkpoint", args.async_checkpoint,
                   "sharded: copy each rank's part into host memory and write it while training "
                   "continues (committed once every rank has written)");
  command
      .add_option("--keep-checkpoints", args.keep_checkpoints,
                  "sharded: keep the newest K complete checkpoints (0: all)")
      ->capture_default_str();
  command
      .add_option("--save-every", args.save_every, "steps between checkpoints (0: only at the end)")
      ->capture_default_str();
  command.add_option("--resume", args.resume,
                     "continue from this checkpoint: a file, DIR/step-N or DIR (its latest); any "
                     "stage, process or parallel layout");
  command.add_option("--config", args.config,
                     "JSON file of flags ({\"lr\": 0.01, ...}); flags given here win");
  command
      .add_option("--backend", args.backend,
                  "process-group backend of a multi-process run: auto (gloo for CPU stages, nccl "
                  "for CUDA stages), gloo, nccl or mpi")
      ->capture_default_str();
  command
      .add_option("--timeout", args.pipeline.timeout,
                  "seconds any wait between ranks may take before the run fails")
      ->capture_default_str();
  command.add_option("--peak-tflops", args.peak_tflops,
                     "the peak TFLOP/s of all the hardware the run uses, in total (e.g. 4 x 989 "
                     "for four H100s in bf16): the progress line and the end show MFU, the "
                     "model FLOPs of a Hugging Face model's training over that peak");
  command.add_option("--log-every", args.log_every, "progress line every this many steps (logs)")
      ->capture_default_str();
}

}  // namespace

void add_train_flags(CLI::App& command, TrainArgs& args) {
  add_model_data_flags(command, args.data);
  add_pipeline_flags(command, args);
  add_optimizer_flags(command, args);
  add_run_flags(command, args);
}

// --balance, --chunks, --memory-limit and --precision as typed values, and what `auto` leaves to
// the planner (tune/auto_plan.h).
void resolve_auto_flags(TrainArgs& args) {
  AutoRequest& request = args.auto_request;
  const bool balance_auto = std::find(args.balance_text.begin(), args.balance_text.end(), "auto") !=
                            args.balance_text.end();
  if (balance_auto && args.balance_text.size() != 1) {
    throw UsageError(
        "--balance auto and a list of layer counts were both given; give either "
        "--balance auto (the planner splits the layers) or the list");
  }
  request.balance = balance_auto;
  args.pipeline.balance.clear();
  for (const std::string& text : args.balance_text) {
    if (balance_auto) break;
    try {
      std::size_t used = 0;
      args.pipeline.balance.push_back(std::stoll(text, &used));
      if (used != text.size()) throw std::invalid_argument(text);
    } catch (const std::exception&) {
      throw UsageError("--balance entry '" + text +
                       "' is not a layer count; give counts like 3,2,2 or auto");
    }
  }
  if (args.chunks_text == "auto") {
    request.chunks = true;
  } else if (!args.chunks_text.empty()) {
    try {
      std::size_t used = 0;
      args.pipeline.chunks = std::stoll(args.chunks_text, &used);
      if (used != args.chunks_text.size()) throw std::invalid_argument(args.chunks_text);
    } catch (const std::exception&) {
      throw UsageError("--chunks '" + args.chunks_text +
                       "' is not a micro-batch count; give a number >= 1 or auto");
    }
    if (args.pipeline.chunks < 1) {
      throw UsageError("--chunks must be at least 1 (or auto), got " + args.chunks_text);
    }
  }
  request.checkpoint = args.pipeline.checkpoint == "auto";
  request.schedule = args.pipeline.schedule == "auto";
  if (request.schedule) {
    // --schedule auto: everything the user did not give. An explicit --balance list fixes the
    // stage count K*V, so it fixes V too.
    request.chunks = request.chunks || args.chunks_text.empty();
    request.checkpoint = request.checkpoint || !args.checkpoint_given;
    request.balance = request.balance || args.balance_text.empty();
    request.virtual_stages = !args.virtual_given && args.balance_text.empty();
  }
  // Each family's own chunk count when --virtual is not given (2 for the V-shaped ones).
  if (!args.virtual_given && !request.schedule && args.pipeline.schedule_file.empty() &&
      contains(schedule::schedule_names(), args.pipeline.schedule)) {
    args.pipeline.virtual_stages = schedule::default_virtual_stages(args.pipeline.schedule);
  }
  if (!args.memory_limit.empty() && args.memory_limit != "none") {
    try {
      args.memory_limit_bytes = partition::parse_bytes(args.memory_limit);
    } catch (const pipetrain::BadInput& error) {
      throw UsageError(std::string("--memory-limit: ") + error.what());
    }
  }
  {
    const char* flags[4] = {"--zero3-prefetch", "--zero3-max-live", "--zero3-max-reuse-distance",
                            "--zero3-persistence-threshold"};
    int64_t bytes[4];
    for (int s = 0; s < 4; ++s) {
      try {
        bytes[s] = s == 2 && args.zero3_sizes[s] == "-1"
                       ? -1
                       : partition::parse_bytes(args.zero3_sizes[s]);
      } catch (const pipetrain::BadInput& error) {
        throw UsageError(std::string(flags[s]) + ": " + error.what());
      }
    }
    args.zero_options = train::ZeroOptions()
                            .gradients(train::parse_zero_gradients(args.zero_gradients))
                            .unit(train::parse_zero_unit(args.zero3_unit))
                            .prefetch_bytes(bytes[0])
                            .max_live_bytes(bytes[1])
                            .max_reuse_distance(bytes[2])
                            .persistence_threshold(bytes[3])
                            .return_freed_memory(!args.zero_keep_freed_memory);
  }
  try {
    args.pipeline.precision = parse_precision(args.precision_name);  // parsed once, here
  } catch (const pipetrain::BadInput& error) {
    throw UsageError("--precision " + args.precision_name + ": " + error.what());
  }
}

namespace {

[[noreturn]] void fail(const std::string& message) {
  throw UsageError(message);
}

// Names (optimizer, checkpoint, lr schedule, schedule) and flags that exclude each other.
// What tensor parallelism covers so far: refused with the flag's name rather than run wrong.
void check_tensor_parallel(const TrainArgs& args) {
  if (args.sequence_parallel && args.pipeline.tp <= 1) {
    fail(
        "--sequence-parallel splits the sequence over the tensor-parallel ranks: give --tp 2 or "
        "more");
  }
  if (args.pipeline.tp <= 1) return;
  if (args.sequence_parallel && args.data.pad_multiple > 0 &&
      args.data.pad_multiple % args.pipeline.tp != 0) {
    fail("--sequence-parallel with --tp " + std::to_string(args.pipeline.tp) +
         " cuts each row into " + std::to_string(args.pipeline.tp) +
         " parts: give a --pad-multiple divisible by it (got " +
         std::to_string(args.data.pad_multiple) + "), or 0 for " +
         std::to_string(args.pipeline.tp));
  }
  if (args.sequence_parallel && args.data.seq_len % args.pipeline.tp != 0) {
    fail("--sequence-parallel with --tp " + std::to_string(args.pipeline.tp) +
         " cuts each sample's --seq-len " + std::to_string(args.data.seq_len) + " ids into " +
         std::to_string(args.pipeline.tp) + " parts; give a --seq-len divisible by it");
  }
  if (!examples::is_hf_model(args.data.model)) {
    fail(
        "--tp splits the layers of a Llama-family model: give --model DIR (a Hugging Face "
        "checkpoint directory); '" +
        args.data.model + "' has no tensor-parallel form");
  }
}

void check_choices(const TrainArgs& args) {
  check_tensor_parallel(args);
  if (args.auto_request.any() && !args.pipeline.schedule_file.empty()) {
    fail(
        "--schedule-file fixes the schedule, micro-batches and stages, so there is nothing for "
        "auto to plan; drop the auto flags or --schedule-file");
  }
  if (!contains(kCheckpoints, args.pipeline.checkpoint) && !args.auto_request.checkpoint) {
    fail("unknown --checkpoint '" + args.pipeline.checkpoint +
         "'; valid: " + join_names(kCheckpoints) + ", auto");
  }
  if (args.pipeline.schedule_file.empty() &&
      !contains(schedule::schedule_names(), args.pipeline.schedule) &&
      !args.auto_request.schedule) {
    fail("unknown --schedule '" + args.pipeline.schedule +
         "'; valid: " + join_names(schedule::schedule_names()) +
         ", auto (or give --schedule-file for a custom one)");
  }
  if (!args.pipeline.schedule_file.empty() && args.schedule_given &&
      args.pipeline.schedule != "custom") {
    fail("--schedule " + args.pipeline.schedule +
         " and --schedule-file both say which schedule to run; " +
         "give only --schedule-file (or --schedule custom)");
  }
}

}  // namespace

train::TrainerOptions trainer_settings(const TrainArgs& args, int64_t total_steps) {
  return train::TrainerOptions(total_steps)
      .optimizer(args.optimizer)
      .lr(args.lr)
      .momentum(args.momentum)
      .weight_decay(args.weight_decay)
      .beta1(args.adam_betas.at(0))
      .beta2(args.adam_betas.at(1))
      .eps(args.adam_eps)
      .loss_scaling(args.pipeline.precision == Precision::kFloat16)
      .lr_schedule(args.lr_schedule)
      .warmup_steps(args.warmup_steps)
      .min_lr(args.min_lr)
      .clip_grad_norm(args.clip_grad_norm)
      .zero(args.zero)
      .reshard_after_forward(args.reshard_after_forward)
      .offload_optimizer(args.offload_optimizer)
      .zero_options(args.zero_options)
      .checkpoint_dir(args.checkpoint_dir)
      .save_every(args.save_every)
      .checkpoint_format(args.checkpoint_format)
      .keep_checkpoints(args.keep_checkpoints)
      .async_checkpoint(args.async_checkpoint)
      .trace_path(args.trace)
      .timeline_path(args.timeline)
      .report_memory(args.report_memory)
      .memory_every(args.log_every);
}

namespace {

// Every number in its range.
void check_ranges(const TrainArgs& args) {
  if (args.batch_size < 1) {
    fail("--batch-size must be at least 1, got " + std::to_string(args.batch_size));
  }
  if (args.epochs < 1) fail("--epochs must be at least 1, got " + std::to_string(args.epochs));
  // An explicit --steps must be >= 1; leaving it out (-1) means epochs x batches per epoch.
  if (args.steps == -1 && args.data.data == "text") {
    fail("--data text has no epochs: give --steps N (N >= 1)");
  }
  if (args.steps == 0 || args.steps < -1) {
    fail("--steps must be at least 1, got " + std::to_string(args.steps));
  }
  if (args.nproc < 1) fail("--nproc must be at least 1, got " + std::to_string(args.nproc));
  train::check_restart_options(args.max_restarts, args.nproc, args.checkpoint_dir);
  if (args.checkpoint_format != "file" && args.checkpoint_format != "sharded") {
    fail("unknown --checkpoint-format '" + args.checkpoint_format + "'; valid: file, sharded");
  }
  if (args.async_checkpoint && args.checkpoint_format != "sharded") {
    fail("--async-checkpoint writes sharded checkpoints; give --checkpoint-format sharded");
  }
  if (args.keep_checkpoints < 0) {
    fail("--keep-checkpoints must be >= 0, got " + std::to_string(args.keep_checkpoints));
  }
  if (args.save_every > 0 && args.checkpoint_dir.empty()) {
    fail("--save-every needs --checkpoint-dir DIR (where the checkpoints are written)");
  }
  if (args.offload_optimizer) {
    const auto& devices = args.pipeline.devices;
    const bool cuda_listed = std::any_of(devices.begin(), devices.end(), [](const std::string& d) {
      return d.rfind("cuda", 0) == 0;
    });
    if (args.pipeline.device != "cuda" && !cuda_listed) {
      fail(
          "--offload-optimizer moves the optimizer state and master weights of CUDA stages to "
          "host memory; these stages run on the CPU, where they already are: nothing to offload");
    }
  }
  if (args.adam_betas.size() != 2) fail("--adam-betas takes two numbers B1,B2");
  train::check_trainer_settings(trainer_settings(args, 1));
  if (!args.save_hf.empty() && !examples::is_hf_model(args.data.model)) {
    fail("--save-hf writes a Hugging Face --model DIR; --model " + args.data.model + " is not one");
  }
  if (args.zero > 0 && args.pipeline.dp < 2 && !args.offload_optimizer) {
    fail("--zero " + std::to_string(args.zero) +
         " shards the optimizer over data-parallel replicas and needs --dp 2 or more (with "
         "--nproc pp x dp), got --dp " +
         std::to_string(args.pipeline.dp));
  }
  if (args.pipeline.overlap_grad_reduce && args.pipeline.dp < 2) {
    fail(
        "--overlap-grad-reduce overlaps the gradient sum over data-parallel replicas: it needs "
        "--dp 2 or more (with --nproc pp x dp), got --dp " +
        std::to_string(args.pipeline.dp));
  }
  if (args.log_every < 1) fail("--log-every must be at least 1");
  if (!(args.peak_tflops >= 0) || !std::isfinite(args.peak_tflops)) {
    char got[32];
    std::snprintf(got, sizeof got, "%g", args.peak_tflops);
    fail(std::string("--peak-tflops must be a number >= 0, got ") + got);
  }
}

// Every file and directory the run will write, checked now rather than after hours of training.
void check_outputs(const TrainArgs& args) {
  const std::tuple<const char*, std::string, bool> outputs[] = {
      {"--save-params", args.save_params, false},
      {"--save-hf", args.save_hf, true},
      {"--trace", args.trace, false},
      {"--timeline", args.timeline, false},
      {"--summary-json", args.summary_json, false},
      {"--checkpoint-dir", args.checkpoint_dir, true}};
  for (const auto& [flag, path, directory] : outputs) {
    if (!path.empty()) as_usage_error(flag, [&] { check_writable(path, directory); });
  }
}

}  // namespace

void check_args(const TrainArgs& args) {
  check_model_data_args(args.data);
  check_choices(args);
  check_ranges(args);
  check_pipeline_request(args.pipeline);
  check_outputs(args);
  if (args.backend != "auto") {
    const CommBackend backend = as_usage_error("--backend " + args.backend,
                                               [&] { return parse_comm_backend(args.backend); });
    if (!comm_backend_available(backend)) {
      fail("--backend " + args.backend + " is not available (" +
           comm_backend_unavailable_reason(backend) + "); use --backend gloo or auto");
    }
  }
}

}  // namespace pipetrain::cli
