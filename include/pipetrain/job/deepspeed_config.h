// DeepSpeed's configuration file (ds_config.json) as a job: a DeepSpeed user's file fills the
// JobConfig as the flags would, with DeepSpeed's meanings (0.19):
//
//   pipetrain train --model DIR ... --deepspeed-config ds_config.json
//
//   job::JobConfig job;                                  // defaults, then the user's settings
//   job::DeepSpeedReading read = job::read_deepspeed_config("ds_config.json", job,
//                                                           job::Command::kTrain);
//   for (const std::string& key : read.ignored) ...      // keys that change nothing here
//
// What it reads, and into which setting (docs/DEEPSPEED.md has the whole table):
//   train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps
//       -> --batch-size and --chunks (DeepSpeed's micro-batches are its accumulation steps), the
//          missing ones completed by DeepSpeed's rules over the --dp replicas, then held to
//          batch = micro x accumulation x replicas
//   gradient_clipping (absent: DeepSpeed's default 1.0), steps_per_print, bf16 / fp16
//   optimizer Adam (decoupled decay unless adam_w_mode is false), AdamW, SGD and their params
//   scheduler WarmupLR, WarmupDecayLR, WarmupCosineLR -> --lr-schedule warmup-lr, ...
//   zero_optimization: stage, offload_optimizer and offload_param (device, nvme_path,
//       buffer_count, buffer_size), overlap_comm, reduce_bucket_size, stage3_* and
//       sub_group_size; DeepSpeed's sizes count elements, converted to bytes at 4 a parameter
//       (pipetrain's parameters and gradients are float32 under every precision)
//   pipeline.activation_checkpoint_interval (> 0: --checkpoint always)
//
// "auto" resolves as Hugging Face's integration resolves it: from the job's own settings (the
// flags and defaults: batch size, accumulation, lr, betas, eps, weight decay, clipping, warm-up,
// the run's steps) and, for reduce_bucket_size, stage3_prefetch_bucket_size and
// stage3_param_persistence_threshold, from the model's hidden size (h x h, 0.9 h x h, 10 h).
//
// Throws DeepSpeedConfigError (a BadInput: exit 2), naming the file and the key, for: text that
// is not JSON (with its line and column), a value of the wrong type, an unknown optimizer or
// scheduler type, a value pipetrain cannot honour (fp16's loss-scaling keys, ZeRO++'s
// quantization and hpZ, an optimizer ratio below 1, AMSGrad, two nvme paths), inconsistent batch
// keys, and a setting the file gives a value other than the one its flag gave (`given`).
//
// Thread-safety: pure functions (they read the file and the model's config.json).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "pipetrain/base/error.h"
#include "pipetrain/job/job_config.h"

namespace pipetrain::job {

class DeepSpeedConfigError : public BadInput {
 public:
  using BadInput::BadInput;
};

struct DeepSpeedReading {
  // Keys read that change nothing in pipetrain ("aio.block_size", "wall_clock_breakdown"), in
  // the file's order: the CLI names them in one warning.
  std::vector<std::string> ignored;
  // How a key was honoured where pipetrain's means differ from DeepSpeed's, one line each.
  std::vector<std::string> notes;
  // Each setting the file set: {"train_batch_size", "training.batch_size"}.
  std::vector<std::pair<std::string, std::string>> settings;
};

// Reads the DeepSpeed config at `path` into `config` for `command` (kTrain or kPlanModel).
// `given`: the settings ("training.batch_size", as Field::name()) given on the command line;
// the file must agree with each.
DeepSpeedReading read_deepspeed_config(const std::string& path, JobConfig& config, Command command,
                                       const std::vector<std::string>& given = {});
// The same from `text`; `source` names it in messages.
DeepSpeedReading read_deepspeed_text(const std::string& text, const std::string& source,
                                     JobConfig& config, Command command,
                                     const std::vector<std::string>& given = {});

}  // namespace pipetrain::job
