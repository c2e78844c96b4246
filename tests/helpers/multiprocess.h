// Test support: runs pipetrain_rank_helper SCENARIO as N ranks through launch_local and collects
// what they printed, the exit codes and the wall time.
#pragma once

#include <signal.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "pipetrain/runtime/launcher.h"

namespace pipetrain::testing {

struct RanksRun {
  LaunchResult result;
  std::vector<std::string> lines;  // "[rank r] line" and "[rank r!] line" for stderr
  double seconds = 0;

  std::string output() const {
    std::string all;
    for (const auto& line : lines) all += line + "\n";
    return all;
  }
  bool printed(const std::string& needle) const {
    return output().find(needle) != std::string::npos;
  }
  int count(const std::string& needle) const {
    int n = 0;
    for (const auto& line : lines) n += line.find(needle) != std::string::npos;
    return n;
  }
  // True when every child is gone (kill(pid, 0) fails).
  bool all_gone() const {
    for (int pid : result.pids) {
      if (kill(pid, 0) == 0) return false;
    }
    return true;
  }
};

inline RanksRun run_ranks(int nproc, std::vector<std::string> args, int world_size = 0,
                          int timeout_ms = 8000,
                          std::chrono::milliseconds grace = std::chrono::seconds(10),
                          const std::vector<std::pair<std::string, std::string>>& env = {}) {
  LaunchOptions options;
  options.program = PIPETRAIN_RANK_HELPER;
  options.args = std::move(args);
  options.nproc = nproc;
  options.world_size = world_size;
  options.grace = grace;
  options.env.emplace_back("PIPETRAIN_TEST_TIMEOUT_MS", std::to_string(timeout_ms));
  for (const auto& variable : env) options.env.push_back(variable);
  RanksRun run;
  std::mutex mutex;
  options.on_line = [&](int rank, bool is_stderr, const std::string& line) {
    std::lock_guard<std::mutex> lock(mutex);
    run.lines.push_back("[rank " + std::to_string(rank) + (is_stderr ? "!] " : "] ") + line);
  };
  const auto start = std::chrono::steady_clock::now();
  run.result = launch_local(options);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

}  // namespace pipetrain::testing
