// A training job's settings resolved into the library's own options, and checked: what `train`
// does with its JobConfig before it builds anything.
//
//   JobConfig --resolve_training--> TrainingSetup: ModelDataSpec (model, data, seed),
//             (BadInput naming      PipelineRequest (balance, chunks, virtual stages and precision
//              the flag; nothing    parsed, each family's own V), the auto plan's request, ZeRO
//              is built)            options, the memory budget; TrainerOptions from it
//
// Every name, range, combination and output path is checked here, so bad input exits 2 before
// any work; what needs the model or the data (a balance that does not fit its layers, a batch
// larger than the data) is checked where they are built (job/run_job.h).
//
// Thread-safety: pure functions (check_outputs tries the output paths).
#pragma once

#include <cstdint>

#include "pipetrain/job/job_config.h"
#include "pipetrain/job/model_data.h"
#include "pipetrain/runtime/run_layout.h"
#include "pipetrain/train/device_peak.h"
#include "pipetrain/train/memory_fit.h"
#include "pipetrain/train/trainer.h"
#include "pipetrain/tune/auto_plan.h"

namespace pipetrain::job {

struct TrainingSetup {
  JobConfig job;             // as given
  std::string resume;        // the checkpoint this process resumes from (--resume, or a restart's)
  ModelDataSpec data;        // --model, --data and their files, --seed
  PipelineRequest pipeline;  // the pipeline flags, parsed
  tune::AutoRequest
      auto_request;  // what --balance/--schedule/--chunks/--checkpoint auto leave open
  int64_t memory_limit_bytes = 0;  // --memory-limit (0: the machine's)
  train::ZeroOptions zero_options;
  train::DevicePeak peak;  // what MFU divides by (resolve_peak in run_job.cpp)
};

// Resolves and checks `job` for `train`. Throws BadInput naming the flag.
TrainingSetup resolve_training(const JobConfig& job);

// The Trainer's options the job gives (without metadata); `total_steps` as the data counts them.
train::TrainerOptions trainer_settings(const TrainingSetup& setup, int64_t total_steps);

// What the memory model needs of the job (train/memory_fit.h).
train::MemoryRunOptions memory_run_options(const TrainingSetup& setup, const RunLayout& layout);

// The fields of each process's offload file under --offload-optimizer nvme
// (train/sharded_optimizer.h): the optimizer state's, and with --offload-params nvme the shard's
// values and, on CPU stages, its gradient. A sub-group takes a buffer of each.
int64_t offload_file_fields(const TrainingSetup& setup);

// The micro-batches a replica's mini-batch is cut into as the pipeline runs `job`: --chunks, or
// its default over the job's pipeline ranks (2 x the ranks, 1 without a pipeline; run_layout.h's
// chunks_of). REQUIRES --chunks not auto. Throws BadInput for pipeline flags that do not fit.
int64_t job_chunks(const JobConfig& job);

// What every row's width must be a multiple of: --cp's cut (2 x cp chunks for ring, cp for
// Ulysses) times --tp's with --sequence-parallel (each context-parallel rank's part cut again).
// 1 without either. --pad-multiple 0 takes it.
int64_t sequence_multiple(const TrainingSetup& setup);

// The model and data settings of `job` (--model, --data, ... and --seed).
ModelDataSpec model_data_spec(const JobConfig& job);

}  // namespace pipetrain::job
