// Jobs in files: TOML with the sections and keys of job/job_fields.h, values as the flags take
// them.
//
//   [training]
//   batch_size = 64          # --batch-size
//   steps = 200
//   [pipeline]
//   schedule = "zb-h1"
//   balance = [3, 2, 2]      # or "auto"
//   [zero]
//   prefetch = "25MiB"       # sizes as --zero3-prefetch takes them (or a number of bytes)
//
// `pipetrain train --config job.toml --lr 0.01`: the file's keys replace the defaults, then the
// flags given replace the file's. `--print-config` writes the resolved job in this form, every
// key of the command with its help line, so `--config printed.toml` runs the same job. A run with
// --checkpoint-dir DIR writes DIR/job.toml; `--resume DIR` alone continues that job.
//
// Every problem names the file, the line and the key and exits 2 (JobFileError is a BadInput):
// TOML syntax, an unknown section or key, a value of the wrong type, a value the field's check
// refuses. A key of another command's section (a [plan] key read by `train`) is read and left
// unused, so one file may serve train, eval and plan.
//
// Thread-safety: pure functions (the readers and writers touch only their files).
#pragma once

#include <optional>
#include <string>

#include "pipetrain/base/error.h"
#include "pipetrain/job/job_config.h"

namespace pipetrain::job {

class JobFileError : public BadInput {
 public:
  using BadInput::BadInput;
};

// Reads the TOML file at `path` into `config` (the keys it holds replace the fields' values).
// Throws JobFileError "PATH:LINE: ..." for anything wrong, or naming PATH when it cannot be read.
void read_job_file(const std::string& path, JobConfig& config, Command command);
// The same from `text`; `source` names it in messages.
void read_job_text(const std::string& text, const std::string& source, JobConfig& config,
                   Command command);

// The TOML of every field `command` takes (every section it has a field in), each key after a
// comment with its flag and help line; an unset optional is written as a comment saying so.
std::string job_toml(const JobConfig& config, Command command);

// The job file of a run's checkpoints: DIR/job.toml for a checkpoint DIR, DIR/step-N (sharded)
// or DIR/checkpoint.pt (a file); nullopt when there is none.
std::optional<std::string> find_job_file(const std::string& checkpoint);

// Writes job_toml(config, kTrain) to DIR/job.toml (atomically; DIR is made when missing).
void write_job_file(const std::string& directory, const JobConfig& config);

// The job a checkpoint was written by, to continue it: its job.toml with checkpoint.resume set to
// `checkpoint`. Throws JobFileError when `checkpoint` has no job.toml beside it.
JobConfig job_of_checkpoint(const std::string& checkpoint);

}  // namespace pipetrain::job
