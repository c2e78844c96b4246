// The subcommands of the pipetrain CLI. Each lives in its own file and registers itself here.
//
// Exit codes, for every command: 0 success, 1 runtime failure (training diverged, a rank died),
// 2 bad usage or bad input (unknown name, bad number, missing or malformed file).
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

#include "pipetrain/base/as_bad_input.h"
#include "pipetrain/base/error.h"

namespace pipetrain::cli {

// Thrown by a command for bad user input; main() prints the message and exits with 2.
using UsageError = pipetrain::BadInput;

// A command adds its subcommand to `app` and sets its callback; the callback returns the exit code
// through `exit_code`.
using CommandSetup = std::function<void(CLI::App& app, int& exit_code)>;

void add_plan_command(CLI::App& app, int& exit_code);             // plan.cpp
void add_train_command(CLI::App& app, int& exit_code);            // train.cpp
void add_bench_command(CLI::App& app, int& exit_code);            // bench.cpp
void add_eval_command(CLI::App& app, int& exit_code);             // inference.cpp
void add_launch_command(CLI::App& app, int& exit_code);           // train_distributed.cpp (hidden)
void add_generate_command(CLI::App& app, int& exit_code);         // inference.cpp
void add_export_hf_command(CLI::App& app, int& exit_code);        // inference.cpp
void add_checkpoint_info_command(CLI::App& app, int& exit_code);  // inference.cpp

}  // namespace pipetrain::cli
