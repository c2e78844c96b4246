// The job as one value: every setting of `pipetrain train`, `eval`, `generate`, `export-hf` and
// `plan --model`, in sections, as plain values a C++ program fills in or a config file holds.
//
//   JobConfig job;                          // every default (the CLI's, flag for flag)
//   job.model.name = "build/llama";         // --model
//   job.data.name = "indexed";              // --data
//   job.training.steps = 20;                // --steps
//   job.parallel.nproc = 4;                 // --nproc
//   job::run_training(job, observer);       // job/run_job.h
//
// Each field is declared once, in job/job_fields.h, with its section, key, flag, help line and
// check; the CLI's options, `--help`, the TOML reader and writer (job/job_file.h) and the
// reference table of docs/TRAIN_CLI.md all come from that declaration.
//
// Values are what the flags take, as typed: numbers as numbers, names as strings, and text where
// a flag takes a number or a word (`chunks = "auto"`). Where the default depends on other
// settings, "not given" is a value of its own: an empty text (chunks: 1 without a pipeline, else
// 2 x pipeline ranks; schedule: 1f1b; checkpoint: except_last; under `schedule = "auto"` the
// planner's) or an unset optional (stages: 1, or the pipeline processes; virtual_stages: the
// schedule's own). A file leaves such a key out (--print-config writes it as a comment).
//
// Thread-safety: a plain value; copy it freely.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pipetrain::job {

// The commands a setting belongs to (a field may serve several).
enum class Command { kTrain, kEval, kGenerate, kExportHf, kPlanModel };

// "train", "eval", "generate", "export-hf", "plan".
const char* command_name(Command command);

// [model] which model: an example (mlp, cnn, gpt), a TorchScript file, or a Hugging Face DIR.
struct ModelSettings {
  std::string name = "cnn";         // --model
  std::string options = "{}";       // --model-options: JSON object of an example model's options
  std::string init = "checkpoint";  // --init: a Hugging Face model's weights (checkpoint, random)
  std::string loss;                 // --loss: mse, cross-entropy ("": the model's own)
};

// [data] which data and how rows are made of it.
struct DataSettings {
  std::string name = "fashion-mnist";       // --data
  std::string dir;                          // --data-dir (Fashion-MNIST; "": Debian's)
  std::string text_file;                    // --text-file (--data text; "": the default corpus)
  std::string inputs;                       // --inputs (--data tensors)
  std::string targets;                      // --targets (--data tensors)
  int64_t synthetic_samples = 2048;         // --synthetic-samples
  std::string token_file;                   // --token-file (--data tokens)
  std::vector<std::string> path;            // --data-path: PREFIX, or a blend W1 PREFIX1 W2 PREFIX2
  std::string pack = "split";               // --pack: split, whole, none
  std::vector<std::string> loss_mask_path;  // --loss-mask-path: one per --data-path dataset
  bool cross_document_attention = false;    // --cross-document-attention
  int64_t pad_multiple = 0;                 // --pad-multiple (0: tp with sequence parallel, else 1)
  bool group_by_length = false;             // --group-by-length
  int64_t seq_len = 0;                      // --seq-len
  int64_t token_bytes = 2;                  // --token-bytes: 2 or 4
  bool shuffle = false;                     // --shuffle
};

// [training] the run's length, its seed and what is logged.
struct TrainingSettings {
  int64_t epochs = 1;        // --epochs
  int64_t steps = -1;        // --steps (-1: epochs x batches per epoch)
  int64_t batch_size = 128;  // --batch-size: rows per mini-batch
  uint64_t seed = 0;         // --seed
  int64_t log_every = 100;   // --log-every
  double peak_tflops = 0;    // --peak-tflops (0: a known GPU's, or the CPU's measured)
};

// [pipeline] stages, micro-batches and the schedule.
struct PipelineSettings {
  std::optional<int64_t> stages;     // --stages: pipeline ranks of a one-process run (unset: 1)
  std::vector<std::string> balance;  // --balance: layer counts, or {"auto"}; {}: even
  std::string chunks;                // --chunks: a count or auto ("": the default)
  std::optional<int64_t> virtual_stages;  // --virtual: V (unset: the schedule's own)
  std::string schedule;                   // --schedule: a family or auto ("": 1f1b)
  std::string schedule_file;              // --schedule-file
  std::string checkpoint;  // --checkpoint: always, except_last, never, auto ("": except_last)
  std::string precision = "fp32";    // --precision: fp32, bf16, fp16
  bool offload_activations = false;  // --offload-activations
  int64_t threads = 0;               // --threads per rank (0: the cores shared)
  std::string device = "cpu";        // --device: cpu or cuda
  std::vector<std::string> devices;  // --devices
};

// [parallel] processes and how they are laid out.
struct ParallelSettings {
  int64_t nproc = 1;                 // --nproc
  int64_t pp = 0;                    // --pp (0: processes / dp)
  int64_t dp = 1;                    // --dp
  int64_t tp = 1;                    // --tp
  int64_t cp = 1;                    // --cp: context-parallel ranks per data-parallel replica
  std::string cp_method = "ring";    // --cp-method: ring or ulysses
  bool cp_serial_passes = false;     // --cp-serial-passes: the ring's passes not overlapped
  int64_t ep = 1;                    // --ep: expert-parallel replicas (divides dp)
  bool ep_overlap = false;           // --ep-overlap: a forward beside a backward (PipeOptions)
  double routing_imbalance = 1;      // --routing-imbalance: planned busiest ep rank / balanced
  bool sequence_parallel = false;    // --sequence-parallel
  std::string backend = "auto";      // --backend
  double timeout = 300;              // --timeout: seconds
  int64_t max_restarts = 0;          // --max-restarts
  bool overlap_grad_reduce = false;  // --overlap-grad-reduce
  double bucket_size = 25;           // --bucket-size: MiB
  int64_t ranks_per_host = 0;        // --ranks-per-host (0: the launcher's, one host)
};

// [optimizer] the optimizer, its learning-rate schedule and clipping.
struct OptimizerSettings {
  std::string name = "adam";                   // --optimizer
  double lr = 1e-3;                            // --lr
  double momentum = 0;                         // --momentum
  double weight_decay = 0;                     // --weight-decay
  std::vector<double> adam_betas{0.9, 0.999};  // --adam-betas
  double adam_eps = 1e-8;                      // --adam-eps
  int64_t warmup_steps = 0;                    // --warmup-steps
  std::string lr_schedule = "constant";        // --lr-schedule
  double min_lr = 0;                           // --min-lr
  std::string warmup_type = "log";             // --warmup-type (DeepSpeed's schedules)
  double warmup_min_lr = 0;                    // --warmup-min-lr (DeepSpeed's schedules)
  int64_t lr_total_steps = 0;                  // --lr-total-steps (0: the run's steps)
  double clip_grad_norm = 0;                   // --clip-grad-norm
  // fp16's loss scale (train/loss_scaler.h).
  std::string loss_scaler = "torch";               // --loss-scaler torch|deepspeed|static
  double initial_loss_scale = 65536;               // --initial-loss-scale
  int64_t loss_scale_window = 2000;                // --loss-scale-window
  int64_t loss_scale_hysteresis = 2;               // --loss-scale-hysteresis (deepspeed)
  double min_loss_scale = 1;                       // --min-loss-scale (deepspeed)
  bool loss_scale_consecutive_hysteresis = false;  // --loss-scale-consecutive-hysteresis
};

// [zero] sharding over the data-parallel replicas.
struct ZeroSettings {
  int64_t stage = 0;                           // --zero
  bool reshard_after_forward = false;          // --reshard-after-forward
  std::string gradients = "stream";            // --zero-gradients
  std::string unit = "layer";                  // --zero3-unit
  std::string prefetch = "25MiB";              // --zero3-prefetch
  std::string max_live = "0";                  // --zero3-max-live
  std::string max_reuse_distance = "0";        // --zero3-max-reuse-distance
  std::string persistence_threshold = "0";     // --zero3-persistence-threshold
  bool quantized_weights = false;              // --zero-quantized-weights (ZeRO++ qwZ)
  int64_t hpz_partition_size = 1;              // --zero-hpz-partition-size (hpZ; 1: off)
  bool quantized_gradients = false;            // --zero-quantized-gradients (qgZ)
  bool keep_freed_memory = false;              // --zero-keep-freed-memory
  std::string offload_optimizer = "none";      // --offload-optimizer none|cpu|nvme (alone: cpu)
  std::string offload_params = "none";         // --offload-params none|cpu|nvme (ZeRO-3)
  std::string offload_dir;                     // --offload-dir (nvme)
  std::string offload_buffer_bytes = "16MiB";  // --offload-buffer-bytes
  int64_t offload_buffer_count = 6;            // --offload-buffer-count
  int64_t sub_group_size = 0;                  // --sub-group-size (elements; 0: a buffer's worth)
  std::string offload_io = "auto";             // --offload-io auto|uring|threads
  bool ladder = false;                         // --zero-ladder (plan --model)

  // --offload-optimizer is cpu or nvme.
  bool offloads_optimizer() const { return offload_optimizer != "none"; }
  // Any of ZeRO++'s three is on.
  bool plus_plus() const {
    return quantized_weights || hpz_partition_size != 1 || quantized_gradients;
  }
};

// [memory] the up-front check and the report.
struct MemorySettings {
  std::string limit;        // --memory-limit: per rank ("" or none: the machine's)
  bool skip_check = false;  // --skip-memory-check
  bool report = false;      // --report-memory
};

// [checkpoint] writing and resuming.
struct CheckpointSettings {
  std::string dir;                 // --checkpoint-dir
  int64_t save_every = 0;          // --save-every
  std::string format = "sharded";  // --checkpoint-format
  int64_t keep = 0;                // --keep-checkpoints
  bool async = false;              // --async-checkpoint
  std::string resume;              // --resume
};

// [output] what the run writes besides checkpoints.
struct OutputSettings {
  std::string trace;            // --trace
  std::string timeline;         // --timeline
  std::string summary_json;     // --summary-json
  std::string save_params;      // --save-params
  std::string save_hf;          // --save-hf
  bool report_comm = false;     // --report-comm
  bool report_routing = false;  // --report-routing
};

// [inference] the weights and the pipeline of `eval` and `generate`.
struct InferenceSettings {
  std::string checkpoint;  // --checkpoint: a pipetrain checkpoint ("": the model's own weights)
};

// [eval]
struct EvalSettings {
  int64_t batch_size = 1000;  // --batch-size: rows per forward
};

// [generate]
struct GenerateSettings {
  std::vector<int64_t> prompt_tokens;  // --prompt-tokens
  int64_t max_new_tokens = 16;         // --max-new-tokens
};

// [export] `export-hf CHECKPOINT OUT`.
struct ExportSettings {
  std::string checkpoint;         // CHECKPOINT
  std::string out;                // OUT
  std::string dtype = "float32";  // --dtype
};

// [plan] `plan --model`.
struct PlanSettings {
  std::string model;              // --model: MODEL.pt | mlp | cnn | a Hugging Face DIR
  std::string sample_shape;       // --sample-shape: the mini-batch, batch first
  int64_t stages = 0;             // --stages: pipeline ranks (0: 2)
  std::string optimizer = "sgd";  // --optimizer: sgd, momentum, adam, adamw
  std::string schedules;          // --schedules: a comma-separated subset ("": all)
  int64_t top = 10;               // --top
  bool calibrate = false;         // --calibrate
  bool verify = false;            // --verify
  int64_t verify_steps = 5;       // --verify-steps
  int64_t verify_rounds = 3;      // --verify-rounds
  bool processes = false;         // --processes
  std::string profile_out;        // --profile-out
  bool memory = false;            // --memory
  int64_t world = 0;              // --world
  int64_t profile_repeats = 7;    // --profile-repeats
  int64_t profile_warmup = 2;     // --profile-warmup
  std::string format = "text";    // --format: text, json
  std::string output;             // --output ("": stdout)
};

struct JobConfig {
  ModelSettings model;
  DataSettings data;
  TrainingSettings training;
  PipelineSettings pipeline;
  ParallelSettings parallel;
  OptimizerSettings optimizer;
  ZeroSettings zero;
  MemorySettings memory;
  CheckpointSettings checkpoint;
  OutputSettings output;
  InferenceSettings inference;
  EvalSettings eval;
  GenerateSettings generate;
  ExportSettings export_hf;
  PlanSettings plan;
};

}  // namespace pipetrain::job
