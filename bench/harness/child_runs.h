// What the suites that train with `pipetrain train` in child processes share (moe_suite.h,
// long_suite.h): running a child under a time limit, and reading the step times its
// --summary-json wrote.
//
// Thread-safety: runs children one at a time from the calling thread.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "bench_options.h"

namespace pipetrain::bench {

// This program's path (/proc/self/exe).
std::string self_path();

// What a child printed (stdout and stderr), with its exit status; `timeout` ends it after
// options.config_timeout seconds.
struct Child {
  std::string output;
  int status = 0;
};
Child run_child(const BenchOptions& options, const std::string& command);

// `count` uint16 ids below 4096 (the bench models' vocabulary), drawn by a fixed generator.
void write_random_ids(const std::string& path, int64_t count);

// The largest predicted and the largest measured activations (bytes) of the rows of
// `pipetrain train --report-memory`'s table in `output`; {0, 0} without one.
std::pair<double, double> largest_activations(const std::string& output);

// A report's cell: row[key] x scale printed with `format` (one double), "-" where the row has no
// such figure.
std::string report_cell(const nlohmann::json& row, const char* key, double scale,
                        const char* format);

// The last 800 characters of `text` (an error's context).
std::string tail(const std::string& text);

// Runs `command` (a `pipetrain train ... --summary-json summary` line) and fills `row` with
// "step_seconds" (the median after options.warmup steps), "step_seconds_all" and
// "process_peak_bytes" (every process's), or "error". Returns the child's output.
std::string run_train_row(const BenchOptions& options, const std::string& command,
                          const std::string& summary, nlohmann::json& row);

}  // namespace pipetrain::bench
