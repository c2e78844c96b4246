// Running a job: what `pipetrain train`, `eval`, `generate`, `export-hf` and `plan --model` do,
// as library calls on a JobConfig (job/job_config.h), telling a JobObserver what happens
// (job/job_observer.h).
//
//   job::JobConfig job;                     // or read_job_file("job.toml", job, Command::kTrain)
//   job.model.name = "path/to/llama";  job.data.name = "indexed";  ...
//   job::ConsoleObserver console;           // prints as the CLI does; or an observer of your own
//   job::JobResult result = job::run_training(job, console);
//
// run_training composes the whole run: checks the job (bad input throws BadInput naming the flag
// before anything is built), builds the model and data, makes the auto plan, checks the memory
// the run needs against the machine, and trains in one process (a worker thread per pipeline
// rank) or as one rank of several:
//
//   parallel.nproc > 1, no launcher's environment:  this process checks the job, then starts
//       nproc copies of ITSELF (the same program, the same arguments: runtime/launcher.h) as the
//       ranks, and returns their exit code. A program calling run_training must therefore make
//       the same JobConfig in every process it is started as.
//   the torchrun environment (RANK, WORLD_SIZE, ...): this process is one rank; it resumes from
//       checkpoint.dir after a restart (TORCHELASTIC_RESTART_COUNT).
//
// With checkpoint.dir set, the main rank writes the job to DIR/job.toml (job/job_file.h).
//
// Exit codes as the CLI's: JobResult::exit_code 0 done, 1 a rank failed; a diverged loss throws
// train::NonFiniteLossError (a failure while running), bad input BadInput (exit 2).
//
// Thread-safety: one job at a time per process (training sets the intra-op thread count).
#pragma once

#include <optional>
#include <string>

#include "pipetrain/job/job_config.h"
#include "pipetrain/job/job_observer.h"
#include "pipetrain/train/trainer.h"

namespace pipetrain::job {

struct JobResult {
  int exit_code = 0;
  // The process that trained: its summary (the figures are the main rank's). Empty in the
  // launching parent of a multi-process run and for the other commands.
  std::optional<train::TrainSummary> summary;
};

// `pipetrain train`.
JobResult run_training(const JobConfig& job, JobObserver& observer);

// `pipetrain eval`: the test loss (and accuracy) of a checkpoint of `train`, or the loss and
// perplexity of a Hugging Face model over a token file or an indexed dataset (inference.checkpoint
// for other weights than its own). The result's lines go to on_result.
JobResult run_evaluation(const JobConfig& job, JobObserver& observer);

// `pipetrain generate`: greedy decoding of generate.prompt_tokens through the pipeline; on_result
// gets the ids, comma-separated.
JobResult run_generation(const JobConfig& job, JobObserver& observer);

// `pipetrain export-hf`: a checkpoint of a Hugging Face model written as transformers saves it.
JobResult run_export(const JobConfig& job, JobObserver& observer);

// `pipetrain plan --model`: profile the model, search the plans, print (or write to plan.output)
// the ranked plans and the recommendation; exit code 1 when no plan fits memory.limit. With
// `rank_job` (a JSON job plan_model handed to a process it started) this process is one rank of
// a measurement.
JobResult run_model_plan(const JobConfig& job, JobObserver& observer,
                         const std::string& rank_job = "");

}  // namespace pipetrain::job
