// Runs a command (usually build/pipetrain) from a test and captures what it prints: the one
// runner the end-to-end tests of tests/apps share.
//
// Every run is bounded: the command runs under coreutils `timeout`, which kills its whole process
// group (the ranks a `--nproc` run spawns included), so a hung command fails its test with the
// output so far instead of stalling the suite. Stateless; safe to call from any thread.
// REQUIRES: /bin/sh and coreutils `timeout` (Debian's coreutils).
#pragma once

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>

namespace pipetrain::testing {

struct CliRun {
  int exit_code = -1;  // -1: could not start or killed by a signal; 124 (137 if it had
                       // to be SIGKILLed): ran past CliOptions::timeout
  std::string output;  // stdout, and stderr unless CliOptions::without_stderr
};

/// How run_command runs its command. Defaults: stderr kept, no log file, 240 s limit.
/// Example: run_pipetrain("train ...", CliOptions().log_to(dir + "/train.log"));
struct CliOptions {
  /// Also write the output to `path` (left in the test's directory to read after a failure, or
  /// for a later test to read).
  CliOptions& log_to(std::string path) {
    log_file = std::move(path);
    return *this;
  }
  /// Discard stderr, for commands whose stdout alone is parsed (JSON) and whose progress lines go
  /// to stderr.
  CliOptions& without_stderr() {
    keep_stderr = false;
    return *this;
  }
  CliOptions& timeout_after(std::chrono::seconds limit) {
    timeout = limit;
    return *this;
  }

  std::string log_file;  // empty: no log file
  bool keep_stderr = true;
  // Below ctest's per-test TIMEOUT (300 s, tests/CMakeLists.txt), so that a hang is reported by
  // the test with the output so far rather than by ctest killing the binary without it.
  std::chrono::seconds timeout{240};
};

// `text` in single quotes for /bin/sh (an embedded ' becomes '\'').
inline std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// Runs COMMAND (a /bin/sh command line) and captures its output.
inline CliRun run_command(const std::string& command, const CliOptions& options = {}) {
  const std::string line = "timeout --kill-after=10 " + std::to_string(options.timeout.count()) +
                           " /bin/sh -c " + shell_quote(command) +
                           (options.keep_stderr ? " 2>&1" : " 2>/dev/null");
  CliRun run;
  FILE* pipe = popen(line.c_str(), "r");
  if (!pipe) return run;
  std::array<char, 4096> buffer;
  std::size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    run.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (run.exit_code == 124) {
    run.output += "\n[cli_run: killed after " + std::to_string(options.timeout.count()) + " s]\n";
  }
  if (!options.log_file.empty()) std::ofstream(options.log_file) << run.output;
  return run;
}

// Runs `build/pipetrain ARGUMENTS` (ARGUMENTS are shell words: quote what needs it).
inline CliRun run_pipetrain(const std::string& arguments, const CliOptions& options = {}) {
  return run_command(std::string(PIPETRAIN_BINARY_DIR) + "/pipetrain " + arguments, options);
}

// TEXT with every PLACEHOLDER (e.g. "{dir}") replaced by VALUE: fills the paths into a table of
// command lines written before the test's directory exists.
inline std::string replace_all(std::string text, const std::string& placeholder,
                               const std::string& value) {
  for (auto at = text.find(placeholder); at != std::string::npos;
       at = text.find(placeholder, at + value.size())) {
    text.replace(at, placeholder.size(), value);
  }
  return text;
}

}  // namespace pipetrain::testing
