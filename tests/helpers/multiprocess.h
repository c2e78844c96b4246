// Test support: runs pipetrain_rank_helper SCENARIO as N ranks through launch_local and collects
// what they printed, the exit codes and the wall time.
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

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
  options.store_socket = true;  // the helper's ranks build a Distributed (launcher.h)
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

// The rank helper's "zero_held" scenario (rank_helper.cpp) over `replicas` processes: each
// rank's bytes held per parameter between steps at ZeRO 0..3 ("held STAGE BYTES" lines), each
// within 10% of the paper's figure for float32 Adam (16, 4 + 4 + 8/N, 4 + 12/N, 16/N), and every
// stage below the one before. `env` picks the device (PIPETRAIN_TEST_DEVICE).
inline void expect_zero_held_as_the_paper_counts(
    int replicas, const std::vector<std::pair<std::string, std::string>>& env = {}) {
  const RanksRun run =
      run_ranks(replicas, {"zero_held", "1"}, 0, 60000, std::chrono::seconds(10), env);
  ASSERT_EQ(run.result.exit_code, 0) << run.output();
  ASSERT_EQ(run.count("OK zero_held"), replicas) << run.output();
  const double n = replicas;
  const double paper[4] = {16, 4 + 4 + 8 / n, 4 + 12 / n, 16 / n};
  for (int rank = 0; rank < replicas; ++rank) {
    double before = 1e30;
    for (int stage = 0; stage <= 3; ++stage) {
      const std::string prefix =
          "[rank " + std::to_string(rank) + "] held " + std::to_string(stage) + " ";
      double held = -1;
      for (const auto& line : run.lines) {
        if (line.rfind(prefix, 0) == 0) held = std::stod(line.substr(prefix.size()));
      }
      EXPECT_NEAR(held, paper[stage], 0.1 * paper[stage])
          << "rank " << rank << ", ZeRO " << stage << "\n"
          << run.output();
      EXPECT_LT(held, before) << "rank " << rank << ", ZeRO " << stage << "\n" << run.output();
      before = held;
      std::printf("rank %d, ZeRO %d: %.3f bytes a parameter held (paper %.3f)\n", rank, stage, held,
                  paper[stage]);
    }
  }
}

}  // namespace pipetrain::testing
