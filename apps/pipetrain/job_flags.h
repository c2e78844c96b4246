// The flags of the job commands (train, eval, generate, export-hf, plan --model): one CLI11 option
// per field of the library's declaration (job/job_fields.h), bound to a JobConfig and grouped by
// section in --help; plus --config FILE (TOML, or JSON of flags) and --print-config.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "pipetrain/job/job_config.h"

namespace pipetrain::cli {

// A job command's JobConfig, filled by its flags (and its --config file, read first).
struct JobCommand {
  job::JobConfig config;
  job::Command command;
  std::string config_file;       // --config's TOML file, read before the flags (read_config_file)
  std::string deepspeed_config;  // --deepspeed-config FILE (train, plan --model)
  bool print_config = false;
  bool reference_table = false;  // hidden: the settings as docs/TRAIN_CLI.md's Markdown table
  CLI::App* app = nullptr;
};

// Adds `command`'s fields, --config and --print-config to `app`, bound to a new JobCommand that
// main() can find by the subcommand's name (read_config_file).
std::shared_ptr<JobCommand> add_job_flags(CLI::App& app, job::Command command);

// main(), before parsing: "--config FILE" of a job command with a TOML FILE (not *.json, which
// becomes flags: train/config_file.h) is taken out of `arguments` and read into that command's
// JobConfig, so that the flags parsed after it replace the file's values.
std::vector<std::string> read_config_file(std::vector<std::string> arguments);

// --deepspeed-config FILE: reads DeepSpeed's config into the job (job/deepspeed_config.h) after
// the flags, which it must agree with; prints the keys it ignores in one warning and its notes.
void apply_deepspeed_config(JobCommand& job);

// --print-config: writes the job as TOML to stdout (--reference-table: the command's settings as
// a Markdown table). Returns true when it did (the command then ends with exit code 0).
bool print_config_if_asked(const JobCommand& job);

// The options given on the command line, --config and --print-config aside.
std::vector<std::string> given_flags(const CLI::App& app);

}  // namespace pipetrain::cli
