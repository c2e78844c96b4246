// `pipetrain train`'s flags: TrainArgs, the options that fill it, and the checks that run before
// anything is built (train.cpp [1]). Every refusal here is a UsageError naming the flag (exit 2).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "pipetrain/runtime/run_layout.h"
#include "pipetrain/train/device_peak.h"
#include "pipetrain/train/trainer.h"
#include "pipetrain/tune/auto_plan.h"
#include "train_setup.h"

namespace pipetrain::cli {

struct TrainArgs {
  ModelDataArgs data;
  PipelineRequest pipeline;             // stages, balance, chunks, schedule, devices, ...
  std::string precision_name = "fp32";  // --precision as typed (pipeline.precision once parsed)
  int64_t epochs = 1;
  int64_t steps = -1;  // -1 (not given): epochs x batches per epoch
  int64_t batch_size = 128;
  std::string chunks_text;                // --chunks as given: a count or "auto"
  std::vector<std::string> balance_text;  // --balance as given: layer counts or "auto"
  int nproc = 1;
  int max_restarts = 0;
  bool schedule_given = false;
  bool virtual_given = false;
  bool checkpoint_given = false;
  std::string memory_limit;  // per rank, bounds the auto plan; "" or "none": no limit
  int64_t memory_limit_bytes = 0;
  bool skip_memory_check = false;
  tune::AutoRequest
      auto_request;  // what --balance/--schedule/--chunks/--checkpoint auto leave open
  std::string optimizer = "adam";
  double lr = 1e-3;
  double momentum = 0;
  double weight_decay = 0;
  std::vector<double> adam_betas{0.9, 0.999};
  double adam_eps = 1e-8;
  int64_t warmup_steps = 0;
  std::string lr_schedule = "constant";
  double min_lr = 0;
  double clip_grad_norm = 0;
  int zero = 0;                        // ZeRO stage
  bool reshard_after_forward = false;  // ZeRO-3
  bool offload_optimizer = false;      // ZeRO-Offload (CUDA stages only)
  // --zero-gradients, --zero3-unit, and the sizes of --zero3-prefetch, --zero3-max-live,
  // --zero3-max-reuse-distance and --zero3-persistence-threshold as typed; parsed into
  // zero_options by resolve_auto_flags.
  std::string zero_gradients = "stream", zero3_unit = "layer";
  std::string zero3_sizes[4] = {"25MiB", "0", "0", "0"};
  bool zero_keep_freed_memory = false;
  train::ZeroOptions zero_options;
  bool report_memory = false;
  bool sequence_parallel = false;  // --sequence-parallel (with --tp)
  std::string trace;
  std::string timeline;
  std::string summary_json;  // --summary-json
  std::string save_params;
  std::string save_hf;
  std::string checkpoint_dir;
  int64_t save_every = 0;
  std::string checkpoint_format = "sharded";
  int keep_checkpoints = 0;
  bool async_checkpoint = false;
  std::string resume;
  std::string config;  // expanded by main() before parsing; listed here for --help
  std::string backend = "auto";
  int64_t log_every = 100;
  double peak_tflops = 0;  // the hardware's peak per device, for MFU (0: the table's or measured)
  train::DevicePeak peak;  // resolved once per run (resolve_peak in train.cpp): every device's
};

// Registers every flag of `pipetrain train` on `command`, bound to `args`.
void add_train_flags(CLI::App& command, TrainArgs& args);

// --balance, --chunks, --memory-limit and --precision as typed values, and what `auto` leaves to
// the planner (tune/auto_plan.h).
void resolve_auto_flags(TrainArgs& args);

// The Trainer's options as the flags give them (without metadata); `total_steps` as the data
// source counts them.
train::TrainerOptions trainer_settings(const TrainArgs& args, int64_t total_steps);

// Every name, range, combination and output path, before any work: names the flag.
void check_args(const TrainArgs& args);

}  // namespace pipetrain::cli
