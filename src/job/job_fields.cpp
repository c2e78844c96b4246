// The declaration of every JobConfig field (job/job_fields.h), and what walks it without a file:
// the field checks, values as text and the reference table. The checks of one value the
// declaration names are field_checks.h's.
#include "pipetrain/job/job_fields.h"

#include "field_checks.h"

#include <algorithm>

#include "pipetrain/base/error.h"
#include "pipetrain/data/packing.h"
#include "pipetrain/examples/fashion_mnist.h"
#include "pipetrain/examples/model_registry.h"
#include "pipetrain/examples/text_corpus.h"
#include "pipetrain/job/model_data.h"
#include "pipetrain/partition/memory.h"
#include "pipetrain/runtime/run_layout.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/stage/precision.h"
#include "pipetrain/train/lr_schedule.h"
#include "pipetrain/train/optimizer.h"
#include "pipetrain/train/sharded_optimizer.h"
#include "pipetrain/train/trainer.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain::job {
namespace {

constexpr Command kTrain = Command::kTrain;
constexpr Command kEval = Command::kEval;
constexpr Command kGenerate = Command::kGenerate;
constexpr Command kExport = Command::kExportHf;
constexpr Command kPlan = Command::kPlanModel;

using namespace detail;  // the checks of one value (field_checks.h)

// The declaration: one call per field. Help lines are the CLI's own.
void declare(JobConfig& c, FieldVisitor& v) {
  using S = std::vector<Command>;
  const S train{kTrain};
  const S model_commands{kTrain, kEval};
  const S model_plan{kTrain, kPlan};
  auto F = [](const char* section, const char* key, const char* flag, std::string help,
              std::vector<Command> commands, std::string shown_default = "", char delimiter = 0) {
    Field f;
    f.section = section;
    f.key = key;
    f.flag = flag;
    f.help = std::move(help);
    f.commands = std::move(commands);
    f.shown_default = std::move(shown_default);
    f.delimiter = delimiter;
    return f;
  };
  // A text that a file may give as a number.
  auto N = [](Field f) {
    f.number_as_text = true;
    return f;
  };

  // [model]
  v.field(F("model", "name", "--model",
            "model: " + joined(examples::model_names()) +
                ", a TorchScript file (torch.jit.save; its children are the layers), or a "
                "Hugging Face Llama/Mistral/Qwen2 directory (config.json, safetensors)",
            {kTrain, kEval, kGenerate}),
          c.model.name, {});
  v.field(F("model", "options", "--model-options",
            "JSON object of the example model's options, e.g. '{\"width\": 16}' "
            "(docs/MODELS.md lists them)",
            model_commands),
          c.model.options, {});
  v.field(F("model", "init", "--init",
            "a Hugging Face --model's weights: checkpoint (DIR's safetensors) or random (only "
            "config.json is read; seeded by --seed)",
            {kTrain, kEval, kGenerate}),
          c.model.init, one_of({"checkpoint", "random"}));
  v.field(F("model", "loss", "--loss",
            "loss: mse, cross-entropy. Default: the example model's (cross-entropy); required "
            "with a TorchScript --model",
            model_commands, "the model's"),
          c.model.loss, {});

  // [data]
  v.field(F("data", "name", "--data",
            "data: " + joined(data_names()) +
                " (tensors: --inputs/--targets; the default with a TorchScript --model)",
            model_commands),
          c.data.name, {});
  v.field(F("data", "dir", "--data-dir",
            "Fashion-MNIST directory of the gzipped IDX files. Default " +
                std::string(examples::kFashionMnistDirectory),
            model_commands, examples::kFashionMnistDirectory),
          c.data.dir, {});
  v.field(F("data", "text_file", "--text-file",
            "corpus for --data text. Default " + std::string(examples::kDefaultCorpusPath),
            model_commands, examples::kDefaultCorpusPath),
          c.data.text_file, {});
  v.field(
      F("data", "inputs", "--inputs", "input tensor X (torch.save), rows on dim 0", model_commands),
      c.data.inputs, {});
  v.field(F("data", "targets", "--targets", "target tensor Y (torch.save), rows on dim 0",
            model_commands),
          c.data.targets, {});
  v.field(F("data", "synthetic_samples", "--synthetic-samples",
            "rows of --data synthetic (random 28x28 images, 10 classes)", model_commands),
          c.data.synthetic_samples, at_least(1));
  v.field(
      F("data", "token_file", "--token-file",
        "--data tokens: a flat file of little-endian token ids (docs/MODELS.md)", model_commands),
      c.data.token_file, {});
  v.field(F("data", "path", "--data-path",
            "--data indexed: PREFIX of a Megatron indexed dataset (PREFIX.idx and PREFIX.bin, "
            "as Megatron-LM's preprocessing and scripts/prepare-data write them); or a blend W1 "
            "PREFIX1 W2 PREFIX2 ..., rows drawn by weight as Megatron's blend draws them "
            "(docs/DATA.md)",
            model_commands),
          c.data.path, {});
  v.field(F("data", "pack", "--pack",
            "--data indexed: how documents fill rows of --seq-len: split (laid end to end, cut "
            "every T ids), whole (each whole into one row, best fit), none (one per row, each "
            "micro-batch padded to its own longest)",
            model_commands),
          c.data.pack, [](const std::string& flag, const std::string& value) {
            return library_check([&] {
              try {
                data::parse_packing(value);
              } catch (const BadInput& error) {
                throw BadInput(flag + ": " + error.what());
              }
            });
          });
  v.field(F("data", "loss_mask_path", "--loss-mask-path",
            "--data indexed: the loss mask of each --data-path dataset (PREFIX_loss_mask from "
            "scripts/prepare-data): only tokens marked 1 are learned",
            model_commands),
          c.data.loss_mask_path, {});
  v.field(F("data", "cross_document_attention", "--cross-document-attention",
            "--data indexed: tokens attend to every earlier token of their row, and RoPE counts "
            "along the row (default: only within their own document, positions restarting at "
            "each)",
            model_commands),
          c.data.cross_document_attention);
  v.field(F("data", "pad_multiple", "--pad-multiple",
            "--data indexed: row widths rounded up to a multiple of this (0: the --tp size with "
            "--sequence-parallel, else 1)",
            model_commands),
          c.data.pad_multiple, [](const std::string& flag, const int64_t& value) -> std::string {
            return value >= 0 ? ""
                              : flag + " must be >= 0 (0: automatic), got " + std::to_string(value);
          });
  v.field(F("data", "group_by_length", "--group-by-length",
            "--pack none: rows ordered longest first within windows of 50 mini-batches, so a "
            "micro-batch pads little",
            model_commands),
          c.data.group_by_length);
  v.field(F("data", "seq_len", "--seq-len", "--data tokens or indexed: ids per sample T",
            model_commands),
          c.data.seq_len, {});  // checked with --data (job/job_check.h)
  v.field(F("data", "token_bytes", "--token-bytes", "bytes per id: 2 (uint16) or 4 (uint32)",
            model_commands),
          c.data.token_bytes, [](const std::string& flag, const int64_t& value) -> std::string {
            return value == 2 || value == 4 ? ""
                                            : flag + " must be 2 (uint16 ids) or 4 (uint32), got " +
                                                  std::to_string(value);
          });
  v.field(F("data", "shuffle", "--shuffle",
            "--data tokens: samples in a seeded order per epoch; indexed: documents (--pack "
            "split) or rows (whole, none)",
            model_commands),
          c.data.shuffle);

  // [training]
  v.field(F("training", "epochs", "--epochs", "passes over the training data", train),
          c.training.epochs, at_least(1));
  v.field(F("training", "steps", "--steps",
            "optimizer steps; overrides --epochs (required for --data text). Default: epochs x "
            "batches per epoch",
            train, "epochs x batches per epoch"),
          c.training.steps, [](const std::string& flag, const int64_t& value) -> std::string {
            return value >= 1 || value == -1
                       ? ""
                       : flag + " must be at least 1, got " + std::to_string(value);
          });
  v.field(F("training", "batch_size", "--batch-size", "rows per mini-batch N", train),
          c.training.batch_size, at_least(1));
  v.field(F("training", "seed", "--seed",
            "seed of the initial weights, the data order and the random streams",
            {kTrain, kEval, kGenerate}),
          c.training.seed);
  v.field(F("training", "log_every", "--log-every", "progress line every this many steps (logs)",
            train),
          c.training.log_every, [](const std::string& flag, const int64_t& value) -> std::string {
            return value >= 1 ? "" : flag + " must be at least 1, got " + std::to_string(value);
          });
  v.field(F("training", "peak_tflops", "--peak-tflops",
            "the peak TFLOP/s of all the hardware the run uses, in total (e.g. 4 x 989 for four "
            "H100s in bf16): the progress line and the end show MFU, the model FLOPs of a "
            "Hugging Face model's training over that peak",
            train, "a known GPU's, or the CPU's measured"),
          c.training.peak_tflops, finite_at_least_zero("a number >= 0"));

  // [pipeline]
  v.field(F("pipeline", "stages", "--stages",
            "pipeline ranks K in one process (worker threads); layers split as evenly as "
            "possible. 1 with --chunks 1 is plain sequential training",
            {kTrain, kEval, kGenerate}, "1"),
          c.pipeline.stages, at_least(1));
  v.field(N(F("pipeline", "balance", "--balance",
              "layers per stage, comma-separated (K*V entries summing to the layer count), "
              "instead of --stages; or auto: profile the model and split it over the K ranks for "
              "the fastest step (docs/TRAIN_CLI.md, \"Auto plan\")",
              train, "even", ',')),
          c.pipeline.balance, check_balance);
  v.field(N(F("pipeline", "chunks", "--chunks",
              "micro-batches per mini-batch M, or auto (the planner's). Default: 1 without a "
              "pipeline, else 2 x pipeline ranks; auto with --schedule auto",
              train, "1 without a pipeline, else 2 x ranks")),
          c.pipeline.chunks, check_chunks);
  v.field(F("pipeline", "virtual_stages", "--virtual",
            "chunks per rank V (interleaved-1f1b: default 1; interleaved-zb, looped-bfs and the "
            "V-shaped zb-v, v-half, v-min, dualpipev: 2)",
            train, "the schedule's"),
          c.pipeline.virtual_stages, check_virtual);
  v.field(F("pipeline", "schedule", "--schedule",
            "schedule: " + joined(schedule::schedule_names()) +
                " (custom with --schedule-file), or auto: the planner picks the schedule and, "
                "unless given, chunks, checkpoint, virtual stages and balance",
            train, "1f1b"),
          c.pipeline.schedule, [](const std::string& flag, const std::string& value) {
            // custom is checked with --schedule-file (job/job_check.h)
            if (value.empty() || value == "custom" || value == "auto") return std::string();
            return one_of(schedule::schedule_names(),
                          ", auto (or give --schedule-file for a custom one)")(flag, value);
          });
  v.field(F("pipeline", "schedule_file", "--schedule-file",
            "custom schedule: the text form (one line of actions per rank) or, for a *.csv "
            "file, torch.distributed.pipelining's compute-only CSV",
            train),
          c.pipeline.schedule_file, {});
  v.field(F("pipeline", "checkpoint", "--checkpoint",
            "micro-batches that recompute their forward before backward: always, except_last, "
            "never, or auto (the planner's)",
            train, "except_last"),
          c.pipeline.checkpoint, [](const std::string& flag, const std::string& value) {
            if (value.empty()) return std::string();
            return one_of({"always", "except_last", "never", "auto"})(flag, value);
          });
  v.field(F("pipeline", "precision", "--precision",
            "fp32, or bf16: layers under autocast, activations and gradients cross stages in "
            "bfloat16, float32 weights and loss (fp16 needs CUDA stages)",
            model_plan),
          c.pipeline.precision, [](const std::string& flag, const std::string& value) {
            return library_check([&] {
              try {
                parse_precision(value);
              } catch (const BadInput& error) {
                throw BadInput(flag + " " + value + ": " + error.what());
              }
            });
          });
  v.field(F("pipeline", "offload_activations", "--offload-activations",
            "checkpointed micro-batches' inputs wait in pinned host memory until their backward "
            "(CUDA stages); on CPU stages it is accounted, not a saving (docs/MEMORY.md)",
            train),
          c.pipeline.offload_activations);
  v.field(F("pipeline", "threads", "--threads",
            "intra-op threads per pipeline rank (0: the cores shared among the ranks)", train),
          c.pipeline.threads, pipeline_check<int64_t>([](PipelineRequest& r, int64_t value) {
            r.threads = static_cast<int>(value);
          }));
  v.field(F("pipeline", "device", "--device",
            "cpu, or cuda: pipeline rank r on cuda:(r mod GPUs) in one process, rank r on "
            "cuda:LOCAL_RANK with --nproc",
            {kTrain, kEval, kGenerate}),
          c.pipeline.device, one_of({"cpu", "cuda"}));
  v.field(F("pipeline", "devices", "--devices",
            "one device per pipeline rank in one process, e.g. cuda:0,cuda:1; with --nproc one "
            "per process in local rank order (cuda:0,cuda:0 shares a GPU over --backend gloo)",
            train, "", ','),
          c.pipeline.devices, {});

  // [parallel]
  v.field(F("parallel", "nproc", "--nproc",
            "processes on this machine (pipeline ranks x data-parallel replicas); > 1 starts "
            "them with the local launcher",
            train),
          c.parallel.nproc, at_least(1));
  v.field(F("parallel", "pp", "--pp",
            "pipeline ranks per replica in a multi-process run. Default: processes / --dp", train,
            "processes / dp"),
          c.parallel.pp, pipeline_check<int64_t>([](PipelineRequest& r, int64_t value) {
            r.pp = static_cast<int>(value);
          }));
  v.field(F("parallel", "dp", "--dp", "data-parallel replicas in a multi-process run", model_plan),
          c.parallel.dp, pipeline_check<int64_t>([](PipelineRequest& r, int64_t value) {
            r.dp = static_cast<int>(value);
          }));
  v.field(F("parallel", "tp", "--tp",
            "tensor-parallel processes per pipeline rank (Megatron's split of a Llama model's "
            "heads, MLP and vocabulary; --nproc = pp x tp x dp)",
            train),
          c.parallel.tp, pipeline_check<int64_t>([](PipelineRequest& r, int64_t value) {
            r.tp = static_cast<int>(value);
          }));
  v.field(F("parallel", "cp", "--cp",
            "context-parallel processes per data-parallel replica: each sequence split over "
            "them, attention over the group (--cp-method; a Llama-family model; --nproc = pp x tp "
            "x dp x cp; --seq-len divisible by 2 x cp for ring, cp for Ulysses); plan --world: "
            "the largest cp its layouts may take",
            model_plan),
          c.parallel.cp, pipeline_check<int64_t>([](PipelineRequest& r, int64_t value) {
            r.cp = static_cast<int>(value);
          }));
  v.field(F("parallel", "cp_method", "--cp-method",
            "with --cp: ring (keys and values pass around the group, each rank holding two "
            "chunks, one from each end) or ulysses (an all-to-all between sequence and heads; cp "
            "divides the attention heads per tensor-parallel rank)",
            model_plan),
          c.parallel.cp_method, one_of({"ring", "ulysses"}));
  v.field(F("parallel", "cp_serial_passes", "--cp-serial-passes",
            "with --cp ring: wait for each pass of the ring as soon as it starts, after the "
            "block's compute, instead of overlapping it with that compute (what the overlap "
            "hides: the run's ring line)",
            train),
          c.parallel.cp_serial_passes);
  v.field(F("parallel", "ep", "--ep",
            "expert-parallel replicas: a mixture's experts split over groups of this many "
            "data-parallel replicas, each token sent to its experts' rank and back (divides --dp "
            "and the experts per layer)",
            train),
          c.parallel.ep, at_least(1));
  v.field(F("parallel", "ep_overlap", "--ep-overlap",
            "with --ep: each rank runs a forward of one micro-batch beside a backward of another "
            "wherever the schedule allows (DualPipe's overlapped F&B, Megatron's combined 1F1B), "
            "so that one's expert all-to-alls wait while the other computes (CPU stages, "
            "--checkpoint never, ZeRO 0 or 1, no --tp)",
            train),
          c.parallel.ep_overlap);
  v.field(F("parallel", "routing_imbalance", "--routing-imbalance",
            "with --ep: the memory check takes the MoE layers' routed "
            "activations on the busiest expert-parallel rank as this many times the balanced "
            "share (1; at most ep x min(k, experts / ep) / k; --report-routing's worst is an "
            "upper bound of a run's); plan --world: each layout with ep > 1, at most its bound",
            model_plan),
          c.parallel.routing_imbalance, finite_at_least(1, "a number >= 1 (1: balanced)"));
  v.field(F("parallel", "sequence_parallel", "--sequence-parallel",
            "with --tp: norms and residuals on 1/tp of the sequence, and 1/tp of each activation "
            "sent between stages (--seq-len divisible by --tp)",
            train),
          c.parallel.sequence_parallel);
  v.field(F("parallel", "backend", "--backend",
            "process-group backend of a multi-process run: auto (gloo for CPU stages, nccl for "
            "CUDA stages), gloo, nccl or mpi",
            train),
          c.parallel.backend, [](const std::string&, const std::string& value) {
            if (value == "auto") return std::string();
            return library_check([&] { parse_comm_backend(value); });
          });
  v.field(F("parallel", "timeout", "--timeout",
            "seconds any wait between ranks may take before the run fails", train),
          c.parallel.timeout,
          pipeline_check<double>([](PipelineRequest& r, double value) { r.timeout = value; }));
  v.field(F("parallel", "max_restarts", "--max-restarts",
            "when a rank fails, stop all and start them again up to this many times, resuming "
            "from --checkpoint-dir (torchrun's --max-restarts)",
            train),
          c.parallel.max_restarts, not_negative());
  v.field(F("parallel", "overlap_grad_reduce", "--overlap-grad-reduce",
            "with --dp 2 or more: start a stage's gradient sum (all-reduce in buckets; --zero "
            "1-3: reduce-scatter) once its last backward of the step ends, while the rest of the "
            "step runs (docs/DISTRIBUTED.md)",
            train),
          c.parallel.overlap_grad_reduce);
  v.field(F("parallel", "bucket_size", "--bucket-size",
            "MiB per gradient bucket of --overlap-grad-reduce (default 25, DDP's)", train),
          c.parallel.bucket_size,
          pipeline_check<double>([](PipelineRequest& r, double value) { r.bucket_mb = value; }));
  v.field(F("parallel", "ranks_per_host", "--ranks-per-host",
            "ranks on each host, hosts holding consecutive ranks: what --report-comm counts as "
            "within a host and between hosts (0: torchrun's LOCAL_WORLD_SIZE, or the local "
            "launcher's one host)",
            train),
          c.parallel.ranks_per_host, not_negative());

  // [optimizer]
  v.field(F("optimizer", "name", "--optimizer", "optimizer: " + joined(train::optimizer_names()),
            train),
          c.optimizer.name, one_of(train::optimizer_names()));
  v.field(
      F("optimizer", "lr", "--lr", "learning rate (peak, with a schedule)", train), c.optimizer.lr,
      trainer_check<double>([](train::TrainerOptions& o, double value) { o.lr(value).min_lr(0); }));
  v.field(F("optimizer", "momentum", "--momentum", "SGD momentum", train), c.optimizer.momentum,
          trainer_check<double>([](train::TrainerOptions& o, double value) { o.momentum(value); }));
  v.field(
      F("optimizer", "weight_decay", "--weight-decay",
        "L2 penalty (sgd, adam) or decoupled weight decay (adamw)", train),
      c.optimizer.weight_decay,
      trainer_check<double>([](train::TrainerOptions& o, double value) { o.weight_decay(value); }));
  v.field(F("optimizer", "adam_betas", "--adam-betas", "Adam/AdamW moment decays B1,B2", train, "",
            ','),
          c.optimizer.adam_betas,
          [](const std::string& flag, const std::vector<double>& betas) -> std::string {
            if (betas.size() != 2) return flag + " takes two numbers B1,B2";
            return library_check([&] {
              train::TrainerOptions options(1);
              options.beta1(betas[0]).beta2(betas[1]);
              train::check_trainer_settings(options);
            });
          });
  v.field(F("optimizer", "adam_eps", "--adam-eps", "Adam/AdamW epsilon", train),
          c.optimizer.adam_eps,
          trainer_check<double>([](train::TrainerOptions& o, double value) { o.eps(value); }));
  v.field(F("optimizer", "warmup_steps", "--warmup-steps",
            "steps of learning-rate warm-up (linear from 0; DeepSpeed's schedules: --warmup-type)",
            train),
          c.optimizer.warmup_steps,
          trainer_check<int64_t>(
              [](train::TrainerOptions& o, int64_t value) { o.warmup_steps(value); }));
  v.field(F("optimizer", "lr_schedule", "--lr-schedule",
            "after the warm-up: " + joined(train::lr_schedule_names()) +
                " (cosine decays to --min-lr at the last step; warmup-lr, warmup-decay-lr and "
                "warmup-cosine-lr are DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR, "
                "stepped as its engine steps them)",
            train),
          c.optimizer.lr_schedule, one_of(train::lr_schedule_names()));
  v.field(F("optimizer", "min_lr", "--min-lr", "floor of the cosine schedules", train),
          c.optimizer.min_lr, finite_at_least_zero("in 0..--lr"));
  v.field(F("optimizer", "warmup_type", "--warmup-type",
            "DeepSpeed's schedules: log or linear warm-up from --warmup-min-lr", train),
          c.optimizer.warmup_type, one_of({"log", "linear"}));
  v.field(F("optimizer", "warmup_min_lr", "--warmup-min-lr",
            "DeepSpeed's schedules: the rate the warm-up starts from (warmup-decay-lr decays to "
            "it)",
            train),
          c.optimizer.warmup_min_lr, finite_at_least_zero("in 0..--lr"));
  v.field(
      F("optimizer", "lr_total_steps", "--lr-total-steps",
        "the step at which the decaying schedules reach their floor (0: the run's steps)", train),
      c.optimizer.lr_total_steps, not_negative());
  v.field(F("optimizer", "clip_grad_norm", "--clip-grad-norm",
            "clip gradients to this global L2 norm (0: no clipping)", train),
          c.optimizer.clip_grad_norm,
          trainer_check<double>(
              [](train::TrainerOptions& o, double value) { o.clip_grad_norm(value); }));

  v.field(F("optimizer", "loss_scaler", "--loss-scaler",
            "--precision fp16: how the loss scale moves: torch (GradScaler's rule), deepspeed "
            "(DeepSpeed's, with hysteresis and a floor) or static (fixed; a non-finite step is "
            "skipped)",
            train),
          c.optimizer.loss_scaler, one_of({"torch", "deepspeed", "static"}));
  v.field(F("optimizer", "initial_loss_scale", "--initial-loss-scale",
            "--precision fp16: the first loss scale (static: the scale)", train),
          c.optimizer.initial_loss_scale, positive_number());
  v.field(F("optimizer", "loss_scale_window", "--loss-scale-window",
            "--precision fp16: good steps before the scale doubles (deepspeed: its "
            "loss_scale_window)",
            train),
          c.optimizer.loss_scale_window, at_least(1));
  v.field(F("optimizer", "loss_scale_hysteresis", "--loss-scale-hysteresis",
            "--loss-scaler deepspeed: overflows before the scale halves", train),
          c.optimizer.loss_scale_hysteresis, at_least(1));
  v.field(F("optimizer", "min_loss_scale", "--min-loss-scale",
            "--loss-scaler deepspeed: the scale's floor (an overflow there stops the run)", train),
          c.optimizer.min_loss_scale, positive_number());
  v.field(F("optimizer", "loss_scale_consecutive_hysteresis", "--loss-scale-consecutive-hysteresis",
            "--loss-scaler deepspeed: every good step refills the hysteresis", train),
          c.optimizer.loss_scale_consecutive_hysteresis);
  // [zero]
  v.field(F("zero", "stage", "--zero",
            "ZeRO stage over the data-parallel replicas: 0 none, 1 optimizer state sharded, 2 "
            "gradients held between steps sharded too, 3 parameters too (gathered around each "
            "stage's actions) (needs --dp > 1, or --offload-optimizer; --zero 3 without --nproc "
            "runs one stage as one rank process)",
            model_plan),
          c.zero.stage, [](const std::string& flag, const int64_t& value) -> std::string {
            return value >= 0 && value <= 3
                       ? ""
                       : flag + " must be 0, 1, 2 or 3, got " + std::to_string(value);
          });
  v.field(F("zero", "reshard_after_forward", "--reshard-after-forward",
            "ZeRO-3: free a stage's gathered parameters after every forward and backward and "
            "gather them again for the next (less memory, more traffic); default: kept from the "
            "stage's first action of a step to its last",
            model_plan),
          c.zero.reshard_after_forward);
  v.field(F("zero", "gradients", "--zero-gradients",
            "--zero 2/3: stream (each micro-batch's gradients reduce-scattered into the shard as "
            "its backward makes them) or accumulate (summed over the step, then "
            "reduce-scattered: more memory, fewer collectives)",
            model_plan),
          c.zero.gradients, [](const std::string&, const std::string& value) {
            return library_check([&] { train::parse_zero_gradients(value); });
          });
  v.field(F("zero", "unit", "--zero3-unit",
            "--zero 3 gathers by layer (each layer around its uses) or stage (a stage from its "
            "first action of the step to its last)",
            model_plan),
          c.zero.unit, [](const std::string&, const std::string& value) {
            return library_check([&] { train::parse_zero_unit(value); });
          });
  v.field(N(F("zero", "prefetch", "--zero3-prefetch",
              "--zero3-unit layer: bytes of layers gathered ahead of use (0: none)", train)),
          c.zero.prefetch, size_check());
  v.field(N(F("zero", "max_live", "--zero3-max-live",
              "--zero3-unit layer: most bytes of whole layers a prefetch may bring (0: no bound)",
              train)),
          c.zero.max_live, size_check());
  v.field(N(F("zero", "max_reuse_distance", "--zero3-max-reuse-distance",
              "--zero3-unit layer: keep a layer whole when its next use comes within this many "
              "bytes of other layers (-1: never)",
              train)),
          c.zero.max_reuse_distance, size_check(/*minus_one=*/true));
  v.field(N(F("zero", "persistence_threshold", "--zero3-persistence-threshold",
              "--zero 3: parameters smaller than this stay whole", train)),
          c.zero.persistence_threshold, size_check());
  v.field(F("zero", "quantized_weights", "--zero-quantized-weights",
            "ZeRO++ qwZ, with --zero 3: the parameter gathers send int8 blocks with a scale each "
            "(a quarter of float32's bytes, half of bf16's)",
            train),
          c.zero.quantized_weights);
  v.field(F("zero", "hpz_partition_size", "--zero-hpz-partition-size",
            "ZeRO++ hpZ, with --zero 3: groups of N consecutive replicas (a host's) keep a copy "
            "of each gathered layer, 1/N per replica, which the backward's gathers read within "
            "the group (1: off; N divides --dp)",
            train),
          c.zero.hpz_partition_size, at_least(1));
  v.field(F("zero", "quantized_gradients", "--zero-quantized-gradients",
            "ZeRO++ qgZ, with --zero 1-3: the gradients' reduce-scatter becomes two all-to-alls "
            "of int8 blocks, within each host (--ranks-per-host), then between hosts",
            train),
          c.zero.quantized_gradients);
  v.field(F("zero", "keep_freed_memory", "--zero-keep-freed-memory",
            "--zero 2/3 on the CPU: leave the heap's freed pages resident (faster, more resident "
            "memory) instead of returning them after each layer",
            train),
          c.zero.keep_freed_memory);
  {
    Field offload = F("zero", "offload_optimizer", "--offload-optimizer",
                      "with --zero 1, 2 or 3: none; cpu (alone: cpu), the shard's float32 values, "
                      "its gradient and the optimizer state in host memory (pinned for CUDA "
                      "stages), stepped on the CPU; nvme, the optimizer state in files under "
                      "--offload-dir, stepped by sub-groups (docs/OFFLOAD.md)",
                      model_plan);
    offload.implicit = "cpu";
    v.field(offload, c.zero.offload_optimizer, one_of({"none", "cpu", "nvme"}));
  }
  v.field(F("zero", "offload_params", "--offload-params",
            "with --zero 3: none; cpu (CPU stages: where they are already); nvme, each replica's "
            "parameter shard in the offload files with the optimizer state (needs "
            "--offload-optimizer nvme), read per layer as it is gathered; on CPU stages its "
            "gradient too",
            train),
          c.zero.offload_params, one_of({"none", "cpu", "nvme"}));
  v.field(F("zero", "offload_dir", "--offload-dir",
            "--offload-optimizer nvme: the directory of the offload files (a fast local disk; the "
            "files are removed as soon as they are open)",
            train),
          c.zero.offload_dir, {});
  v.field(N(F("zero", "offload_buffer_bytes", "--offload-buffer-bytes",
              "nvme: bytes of each aligned host buffer the offload files' transfers go through",
              model_plan)),
          c.zero.offload_buffer_bytes, size_check());
  v.field(F("zero", "offload_buffer_count", "--offload-buffer-count",
            "nvme: buffers in the pool (the host memory of the transfers is count x bytes; "
            "3 x the optimizer's state fields keep reads and writes in flight while it steps)",
            model_plan),
          c.zero.offload_buffer_count, at_least(1));
  v.field(F("zero", "sub_group_size", "--sub-group-size",
            "nvme: elements the optimizer steps at once (each state field of a sub-group fills "
            "one buffer; 0: as many as a buffer holds)",
            train),
          c.zero.sub_group_size, not_negative());
  v.field(F("zero", "offload_io", "--offload-io",
            "nvme: the I/O engine, uring (io_uring), threads (pread/pwrite on a thread pool) or "
            "auto (uring where the kernel allows it)",
            train),
          c.zero.offload_io, [](const std::string&, const std::string& value) {
            return library_check([&] { train::parse_offload_io(value); });
          });
  v.field(F("zero", "ladder", "--zero-ladder",
            "walk DeepSpeed's ladder (ZeRO 0, 1, 2, 2 + optimizer offload, 3, 3 + parameter "
            "offload, nvme) to the first rung that fits (plan: --memory-limit a rank; train: "
            "--memory-limit or this machine, the rung's flags then used; docs/PLANNER.md)",
            model_plan),
          c.zero.ladder);

  // [memory]
  v.field(N(F("memory", "limit", "--memory-limit",
              "bytes per rank: the budget the run is checked against before it starts (instead of "
              "the machine's), and an auto plan may use (e.g. 2GiB, 512MiB; none: no limit)",
              model_plan, "the machine's")),
          c.memory.limit, [](const std::string& flag, const std::string& value) {
            if (value.empty() || value == "none") return std::string();
            return size_check()(flag, value);
          });
  v.field(F("memory", "skip_check", "--skip-memory-check",
            "start the run even where the memory model predicts it will not fit", train),
          c.memory.skip_check);
  v.field(F("memory", "report", "--report-memory",
            "after the last step, print what each rank holds per category (parameters, "
            "gradients, optimizer state, activations, transport), predicted by the memory model "
            "and measured (docs/MEMORY.md)",
            train),
          c.memory.report);

  // [checkpoint]
  v.field(F("checkpoint", "dir", "--checkpoint-dir",
            "write a checkpoint every --save-every steps and at the end: DIR/step-N/ with "
            "DIR/latest (--checkpoint-format sharded) or DIR/checkpoint.pt (file), and the job "
            "as DIR/job.toml",
            train),
          c.checkpoint.dir, {});
  v.field(F("checkpoint", "save_every", "--save-every",
            "steps between checkpoints (0: only at the end)", train),
          c.checkpoint.save_every,
          [](const std::string& flag, const int64_t& value) -> std::string {
            return value >= 0 ? "" : flag + " must be >= 0, got " + std::to_string(value);
          });
  v.field(F("checkpoint", "format", "--checkpoint-format",
            "sharded: every rank writes its own part, no gather, any layout resumes from it; "
            "file: one file gathered by rank 0",
            train),
          c.checkpoint.format, one_of({"file", "sharded"}));
  v.field(F("checkpoint", "keep", "--keep-checkpoints",
            "sharded: keep the newest K complete checkpoints (0: all)", train),
          c.checkpoint.keep, not_negative());
  v.field(F("checkpoint", "async", "--async-checkpoint",
            "sharded: copy each rank's part into host memory and write it while training "
            "continues (committed once every rank has written)",
            train),
          c.checkpoint.async);
  v.field(F("checkpoint", "resume", "--resume",
            "continue from this checkpoint: a file, DIR/step-N or DIR (its latest); any stage, "
            "process or parallel layout. Alone, it continues the job DIR/job.toml describes",
            train),
          c.checkpoint.resume, {});

  // [output]
  v.field(F("output", "trace", "--trace",
            "write every executed action of every rank here (Chrome trace JSON; "
            "chrome://tracing or ui.perfetto.dev)",
            train),
          c.output.trace, {});
  v.field(F("output", "timeline", "--timeline",
            "draw the measured timeline of one step here (SVG: rows = ranks)", train),
          c.output.timeline, {});
  v.field(F("output", "summary_json", "--summary-json",
            "write the run's summary here as JSON: steps, seconds, samples, tokens and counted "
            "targets, their rates, MFU and the peak it divides by, losses, each process's peak "
            "memory, each step's seconds",
            train),
          c.output.summary_json, {});
  v.field(F("output", "save_params", "--save-params",
            "write {parameter name: tensor} here at the end (torch.load reads it)", train),
          c.output.save_params, {});
  v.field(F("output", "save_hf", "--save-hf",
            "a Hugging Face --model: write it here at the end as transformers saves it "
            "(safetensors and config.json; from_pretrained loads it)",
            train),
          c.output.save_hf, {});
  v.field(F("output", "report_comm", "--report-comm",
            "a multi-process run: at the end, the bytes its collectives sent per step, within "
            "hosts and between hosts, by kind (as a ring sends them; docs/DISTRIBUTED.md)",
            train),
          c.output.report_comm);
  v.field(F("output", "report_routing", "--report-routing",
            "a mixture of experts: each MoE layer's busiest expert's tokens over the mean, per "
            "step (every --log-every), and its experts' tokens over the run, summed over the ranks",
            train),
          c.output.report_routing);

  // [inference]
  v.field(F("inference", "checkpoint", "--checkpoint",
            "weights from this pipetrain checkpoint (of the same --model) instead of DIR's; "
            "eval of an example model: required",
            {kEval, kGenerate}),
          c.inference.checkpoint, {});

  // [eval]
  v.field(F("eval", "batch_size", "--batch-size", "rows per forward", {kEval}), c.eval.batch_size,
          [](const std::string& flag, const int64_t& value) -> std::string {
            return value >= 1 ? "" : flag + " must be at least 1";
          });

  // [generate]
  v.field(F("generate", "prompt_tokens", "--prompt-tokens", "prompt ids, comma-separated",
            {kGenerate}, "", ','),
          c.generate.prompt_tokens, {});
  v.field(
      F("generate", "max_new_tokens", "--max-new-tokens", "ids to generate at most", {kGenerate}),
      c.generate.max_new_tokens, [](const std::string& flag, const int64_t& value) -> std::string {
        return value >= 0 ? "" : flag + " must be >= 0";
      });

  // [export]
  v.field(F("export", "checkpoint", "CHECKPOINT",
            "checkpoint: a file (DIR/checkpoint.pt), a sharded DIR/step-N or DIR (its latest)",
            {kExport}),
          c.export_hf.checkpoint, {});
  v.field(F("export", "out", "OUT", "output directory", {kExport}), c.export_hf.out, {});
  v.field(F("export", "dtype", "--dtype", "float32, bfloat16 or float16", {kExport}),
          c.export_hf.dtype, one_of({"float32", "bfloat16", "float16"}));

  // [plan]
  const S plan{kPlan};
  v.field(F("plan", "model", "--model",
            "Plan for a model: MODEL.pt (TorchScript Sequential), mlp, cnn or a Hugging Face DIR "
            "(--sample-shape B,T; profiled from one decoder layer)",
            plan),
          c.plan.model, {});
  v.field(F("plan", "sample_shape", "--sample-shape",
            "With --model: the mini-batch shape, batch first (e.g. 256,784)", plan),
          c.plan.sample_shape, {});
  v.field(F("plan", "stages", "--stages", "pipeline ranks K (>= 1; with --model: 2 unless given)",
            plan, "2 with --model"),
          c.plan.stages, not_negative());
  v.field(F("plan", "optimizer", "--optimizer",
            "With --model: sgd | momentum | adam | adamw (state 0x/1x/2x/2x params; train's sgd "
            "has --momentum 0.9 unless told: plan it as momentum)",
            plan),
          c.plan.optimizer, one_of({"sgd", "momentum", "adam", "adamw"}));
  v.field(F("plan", "schedules", "--schedules",
            "With --model: schedules to search, comma-separated (default all)", plan, "all"),
          c.plan.schedules, {});
  v.field(F("plan", "top", "--top", "With --model: rows of the ranked table", plan), c.plan.top,
          [](const std::string& flag, const int64_t& value) -> std::string {
            return value >= 1 ? "" : flag + " must be >= 1 (got " + std::to_string(value) + ")";
          });
  v.field(F("plan", "calibrate", "--calibrate",
            "With --model: calibrate the cost model with real steps, then run the best few plans "
            "and the default together and recommend by measurement (implied by --verify)",
            plan),
          c.plan.calibrate);
  v.field(F("plan", "verify", "--verify",
            "With --model: run the recommended and the default plan in-process and print "
            "predicted vs measured step time",
            plan),
          c.plan.verify);
  v.field(F("plan", "verify_steps", "--verify-steps",
            "With --verify (and for the plans measured after planning): timed steps per plan and "
            "round, at least; a round also lasts at least 1.5 s",
            plan),
          c.plan.verify_steps, [](const std::string& flag, const int64_t& value) -> std::string {
            return value >= 1 ? "" : flag + " must be >= 1 (got " + std::to_string(value) + ")";
          });
  v.field(F("plan", "verify_rounds", "--verify-rounds",
            "With --verify: rounds of the two plans in turn step by step; medians over all their "
            "steps",
            plan),
          c.plan.verify_rounds, [](const std::string& flag, const int64_t& value) -> std::string {
            return value >= 1 ? "" : flag + " must be >= 1 (got " + std::to_string(value) + ")";
          });
  v.field(F("plan", "processes", "--processes",
            "With --model: plan for K processes over Gloo (the transfer model is measured by two "
            "processes on this machine's loopback); --verify then runs each plan as K processes "
            "instead of K worker threads in one process",
            plan),
          c.plan.processes);
  v.field(F("plan", "profile_out", "--profile-out",
            "With --model: write the measured profile as JSON to FILE", plan),
          c.plan.profile_out, {});
  v.field(F("plan", "memory", "--memory",
            "With --model: the recommended plan's bytes per rank: parameters, gradients, "
            "optimizer state, activations, transport (docs/MEMORY.md)",
            plan),
          c.plan.memory);
  v.field(F("plan", "world", "--world",
            "With a Hugging Face --model: search the pipeline x tensor x data parallel layouts of "
            "N processes (every pp x tp x dp = N the model allows, with and without sequence "
            "parallelism) and print the best few with why; --sample-shape is then the whole "
            "job's mini-batch",
            plan),
          c.plan.world, [](const std::string& flag, const int64_t& value) -> std::string {
            return value >= 0 ? "" : flag + " must be >= 1 (got " + std::to_string(value) + ")";
          });
  v.field(F("plan", "profile_repeats", "--profile-repeats",
            "With --model: timed trials of each layer's figures, the median kept (fewer plan "
            "faster, with noisier times; the memory figures are the same)",
            plan),
          c.plan.profile_repeats, [](const std::string& flag, const int64_t& value) -> std::string {
            return value >= 1 ? ""
                              : flag + " must be 1 or more (got " + std::to_string(value) + ")";
          });
  v.field(F("plan", "profile_warmup", "--profile-warmup",
            "With --model: untimed runs of each layer before its trials", plan),
          c.plan.profile_warmup, [](const std::string& flag, const int64_t& value) -> std::string {
            return value >= 0 ? ""
                              : flag + " must be 0 or more (got " + std::to_string(value) + ")";
          });
  v.field(F("plan", "format", "--format",
            "json | text | svg (svg: a schedule's timeline, with --output; --model: text or json)",
            plan),
          c.plan.format, one_of({"text", "json", "svg"}));
  v.field(F("plan", "output", "--output", "write to FILE (atomically; required for svg)", plan,
            "stdout"),
          c.plan.output, {});
}

// Collects the metadata of every field.
class Collect : public TypedFieldVisitor<Collect> {
 public:
  explicit Collect(std::vector<Field>& out) : out_(out) {}
  template <typename T, typename C>
  void on(const Field& f, T&, const C&) {
    out_.push_back(f);
  }

 private:
  std::vector<Field>& out_;
};

}  // namespace

const char* command_name(Command command) {
  switch (command) {
    case Command::kTrain:
      return "train";
    case Command::kEval:
      return "eval";
    case Command::kGenerate:
      return "generate";
    case Command::kExportHf:
      return "export-hf";
    case Command::kPlanModel:
      return "plan";
  }
  return "?";
}

bool Field::serves(Command command) const {
  return std::find(commands.begin(), commands.end(), command) != commands.end();
}

void visit_fields(JobConfig& config, FieldVisitor& visitor) {
  declare(config, visitor);
}

std::vector<Field> fields() {
  std::vector<Field> out;
  JobConfig config;
  Collect collect(out);
  visit_fields(config, collect);
  return out;
}

std::vector<Field> fields_of(Command command) {
  std::vector<Field> out;
  for (Field& f : fields()) {
    if (f.serves(command)) out.push_back(std::move(f));
  }
  return out;
}

}  // namespace pipetrain::job
