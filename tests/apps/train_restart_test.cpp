// Automatic restart (issue #19): ranks killed from outside with SIGKILL at random steps are
// started again by `pipetrain train --nproc 2 --max-restarts N`, and by torchrun's own
// --max-restarts, and resume from the last checkpoint; the final weights equal those of a run
// that was never interrupted, bit for bit. The model has dropout, so the random streams and the
// data order must come back too.
//
// The kills come from this test, as a crashed host would: it follows the job's progress lines and,
// at the chosen step, finds the rank's process (its environment holds RANK and this run's tag) and
// sends it SIGKILL. The steps are drawn at random; the seed is printed to repeat a failure.
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/hf_models.h"
#include "../helpers/params_file.h"
#include "../helpers/processes.h"
#include "../helpers/python.h"
#include "pipetrain/runtime/launcher.h"

namespace pipetrain::restart_test {

const std::string kBinary = std::string(PIPETRAIN_BINARY_DIR) + "/pipetrain";

// The GPT example with dropout: 36 steps, a checkpoint every 3.
std::string train_flags(const std::string& dir) {
  return "train --model gpt --data text --model-options "
         "'{\"context\": 16, \"embed_dim\": 16, \"heads\": 2, \"layers\": 1, \"dropout\": 0.3}' "
         "--batch-size 8 --optimizer adam --lr 0.01 --chunks 2 --steps 36 --log-every 1 "
         "--timeout 60 --checkpoint-format file --checkpoint-dir " +
         dir + "/checkpoints --save-every 3 --save-params " + dir + "/params.pt";
}

struct KilledRun {
  int exit_code = -1;
  std::string output;
  std::vector<int> killed_at;  // the step lines that triggered each kill
};

// Runs `command` (a /bin/sh line) and, each time a progress line reaches the next of `steps`,
// SIGKILLs rank `ranks[i]` of the attempt running then (found by testing::rank_process).
KilledRun run_killing(const std::string& command, const std::string& tag,
                      const std::vector<int>& steps, const std::vector<int>& ranks) {
  KilledRun run;
  std::mutex mutex;
  std::set<pid_t> killed;
  const std::regex step_line(R"(step (\d+)/)");
  LaunchOptions options;
  options.program = "/bin/sh";
  options.args = {"-c", command + " 2>&1"};
  options.rank_environment = false;
  options.env = {{"PIPETRAIN_TEST_JOB", tag}};
  options.timeout = std::chrono::seconds(240);
  options.on_line = [&](int, bool, const std::string& line) {
    std::lock_guard<std::mutex> lock(mutex);
    run.output += line + "\n";
    std::smatch match;
    const std::size_t next = run.killed_at.size();
    if (next >= steps.size() || !std::regex_search(line, match, step_line)) return;
    const int step = std::stoi(match[1]);
    if (step < steps[next]) return;
    const pid_t pid = testing::rank_process(tag, ranks[next]);
    if (pid <= 0 || killed.count(pid)) return;  // that attempt is already going down
    ::kill(pid, SIGKILL);
    killed.insert(pid);
    run.killed_at.push_back(step);
    run.output += "[test: SIGKILL to rank " + std::to_string(ranks[next]) + " (pid " +
                  std::to_string(pid) + ") after step " + std::to_string(step) + "]\n";
  };
  const LaunchResult result = launch_local(options);
  run.exit_code = result.timed_out ? 124 : result.exit_code;
  return run;
}

// The parameters saved at `got` equal those at `want`, bit for bit.
void expect_same_params(const std::string& got, const std::string& want) {
  auto restarted = testing::load_params(got);
  auto reference = testing::load_params(want);
  ASSERT_EQ(restarted.size(), reference.size());
  for (const auto& [name, tensor] : reference) {
    ASSERT_TRUE(restarted.count(name)) << name;
    EXPECT_TRUE(torch::equal(restarted[name], tensor)) << name;
  }
}

std::string count_of(const std::string& text, const std::string& piece) {
  int n = 0;
  for (std::size_t at = text.find(piece); at != std::string::npos; at = text.find(piece, at + 1)) {
    ++n;
  }
  return std::to_string(n);
}

class TrainRestart : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string pattern = ::testing::TempDir() + "pipetrain_restart_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = new std::string(pattern);
    // The uninterrupted run every restarted one must equal.
    const std::string whole = *dir_ + "/whole";
    KilledRun run = run_killing(
        "mkdir -p " + whole + " && " + kBinary + " " + train_flags(whole) + " --nproc 2", "whole",
        {}, {});
    ASSERT_EQ(run.exit_code, 0) << run.output;
  }
  static std::string path(const std::string& name) { return *dir_ + "/" + name; }

  // Three kill steps, 4 to 10 steps apart, and the rank each kills; the seed goes in the log.
  static void draw(std::vector<int>& steps, std::vector<int>& ranks) {
    const unsigned seed = std::random_device{}();
    std::mt19937 random(seed);
    std::cout << "kill steps drawn with seed " << seed << "\n";
    int step = 0;
    for (int k = 0; k < 3; ++k) {
      step += std::uniform_int_distribution<int>(4, 10)(random);
      steps.push_back(step);
      ranks.push_back(std::uniform_int_distribution<int>(0, 1)(random));
    }
  }

  static void expect_equal_to_whole(const std::string& params) {
    auto restarted = testing::load_params(params);
    auto whole = testing::load_params(path("whole/params.pt"));
    ASSERT_EQ(restarted.size(), whole.size());
    double worst = 0;
    for (const auto& [name, tensor] : whole) {
      ASSERT_TRUE(restarted.count(name)) << name;
      worst = std::max(worst, (restarted[name] - tensor).abs().max().item<double>());
    }
    EXPECT_EQ(worst, 0.0) << "max abs difference from the uninterrupted run";
  }

  static std::string* dir_;
};
std::string* TrainRestart::dir_ = nullptr;

TEST_F(TrainRestart, ThreeKillsUnderMaxRestartsThreeEndEqualToTheUninterruptedRun) {
  std::vector<int> steps, ranks;
  draw(steps, ranks);
  const std::string dir = path("local");
  const KilledRun run = run_killing(
      "mkdir -p " + dir + " && " + kBinary + " " + train_flags(dir) + " --nproc 2 --max-restarts 3",
      "local", steps, ranks);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ASSERT_EQ(run.killed_at.size(), 3u) << run.output;
  EXPECT_NE(run.output.find("restart 3 of 3"), std::string::npos) << run.output;
  // Both ranks of every restart resumed from the checkpoint (a kill after step 3 or later comes
  // after the first checkpoint).
  EXPECT_EQ(count_of(run.output, "resuming from " + dir + "/checkpoints/checkpoint.pt"), "6")
      << run.output;
  expect_equal_to_whole(dir + "/params.pt");
}

TEST_F(TrainRestart, MoreKillsThanRestartsFailWithTheKilledRanksCode) {
  const std::string dir = path("few");
  const KilledRun run = run_killing(
      "mkdir -p " + dir + " && " + kBinary + " " + train_flags(dir) + " --nproc 2 --max-restarts 1",
      "few", {4, 10}, {1, 0});
  ASSERT_EQ(run.killed_at.size(), 2u) << run.output;
  EXPECT_EQ(run.exit_code, 128 + SIGKILL) << run.output;
  EXPECT_NE(run.output.find("restart 1 of 1"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("restart 2"), std::string::npos) << run.output;
}

TEST_F(TrainRestart, UnderTorchrunsMaxRestartsTheRanksResumeOnTheirOwn) {
  if (!testing::python_has_torch()) GTEST_SKIP() << testing::no_python_torch_message();
  std::vector<int> steps, ranks;
  draw(steps, ranks);
  const std::string dir = path("torchrun");
  const std::string torchrun =
      testing::kPython.substr(0, testing::kPython.rfind('/') + 1) + "torchrun";
  const KilledRun run =
      run_killing("mkdir -p " + dir + " && GLOO_SOCKET_IFNAME=lo " + torchrun +
                      " --nproc-per-node 2 --max-restarts 3 --no-python --master-addr 127.0.0.1 "
                      "--master-port " +
                      std::to_string(find_free_port()) + " -- " + kBinary + " " + train_flags(dir),
                  "torchrun", steps, ranks);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ASSERT_EQ(run.killed_at.size(), 3u) << run.output;
  EXPECT_NE(run.output.find("restart 3: resuming from"), std::string::npos) << run.output;
  expect_equal_to_whole(dir + "/params.pt");
}

// A 3-D job's ranks killed: a Hugging Face model (tests/helpers/hf_models.h) split over
// --pp 2 x --tp 2 x --dp 2, 8 processes (docs/TENSOR_PARALLEL.md). Its checkpoints hold whole
// tensors; after each restart every tp rank takes its slices again, and the end equals the
// uninterrupted run bit for bit.
TEST(TrainRestartTensorParallel, TwoKillsOfAThreeDimensionalJobEndEqualToTheUninterruptedRun) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  std::string pattern = ::testing::TempDir() + "pipetrain_restart_tp_XXXXXX";
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const std::string fixtures = testing::hf_fixtures();
  auto flags = [&](const std::string& dir) {
    return "train --model " + fixtures + "/qwen2 --data tokens --token-file " + fixtures +
           "/tokens.bin --seq-len 16 --batch-size 8 --optimizer sgd --momentum 0.9 --lr 0.5 "
           "--steps 30 --log-every 1 --timeout 60 --nproc 8 --pp 2 --tp 2 --dp 2 --chunks 2 "
           "--checkpoint-format file --checkpoint-dir " +
           dir + "/checkpoints --save-every 3 --save-params " + dir + "/params.pt";
  };
  const std::string whole = pattern + "/whole", killed = pattern + "/killed";
  const KilledRun first =
      run_killing("mkdir -p " + whole + " && " + kBinary + " " + flags(whole), "tp-whole", {}, {});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const KilledRun run = run_killing(
      "mkdir -p " + killed + " && " + kBinary + " " + flags(killed) + " --max-restarts 2",
      "tp-killed", {7, 16}, {5, 2});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ASSERT_EQ(run.killed_at.size(), 2u) << run.output;
  EXPECT_NE(run.output.find("restart 2 of 2"), std::string::npos) << run.output;
  EXPECT_EQ(count_of(run.output, "resuming from " + killed + "/checkpoints/checkpoint.pt"), "16")
      << run.output;
  expect_same_params(killed + "/params.pt", whole + "/params.pt");
}

// A rank of an 8-process pp 2 x tp 2 x dp 2 job killed without restarts: every other rank stops
// within the timeout + 10 s, each naming what failed, and the job exits with the killed rank's
// code.
TEST(TrainRestartTensorParallel, AKilledRankOfAThreeDimensionalJobStopsEveryRankWithinTheTimeout) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string fixtures = testing::hf_fixtures();
  const std::string command = kBinary + " train --model " + fixtures +
                              "/qwen2 --data tokens --token-file " + fixtures +
                              "/tokens.bin --seq-len 16 --batch-size 8 --steps 400 --log-every 1 "
                              "--nproc 8 --pp 2 --tp 2 --dp 2 --chunks 2 --timeout 10";
  const auto start = std::chrono::steady_clock::now();
  const KilledRun run = run_killing(command, "tp-fault", {5}, {5});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(run.killed_at.size(), 1u) << run.output;
  EXPECT_EQ(run.exit_code, 128 + SIGKILL) << run.output;
  EXPECT_NE(run.output.find("rank 5 failed first (killed by signal 9)"), std::string::npos)
      << run.output;
  for (int rank : {0, 1, 2, 3, 4, 6, 7}) {  // every survivor names the step that failed
    EXPECT_NE(run.output.find("[rank " + std::to_string(rank) + "] rank " + std::to_string(rank) +
                              ": error: step "),
              std::string::npos)
        << rank << "\n"
        << run.output;
  }
  // Steps take well under a second here: the kill comes within seconds of the start, and the
  // others must follow within the 10 s timeout and 10 s more.
  EXPECT_LT(seconds, 60.0) << run.output;
}

}  // namespace pipetrain::restart_test

namespace pipetrain::restart_test {

// The data-parallel gradient sum overlapped with the pipeline, in buckets of 4 KiB (many per
// step, so a kill mid-step lands in or between bucketed all-reduces): pp 2 x dp 2,
// interleaved-1f1b with 2 stages per rank; `extra` adds flags (a ZeRO stage).
// The receive timeout is 10 s; the fault run's is 5 s, under the launcher's 10 s grace, so that a
// rank blocked in a collective when its peer dies reports its own timeout before the grace ends
// (with both at 10 s, the launcher's SIGKILL raced the rank's message).
std::string overlap_flags(const std::string& dir, int steps, const std::string& extra,
                          int timeout = 10) {
  return "train --data synthetic --synthetic-samples 256 --model mlp --model-options "
         "'{\"widths\": [784, 64, 64, 32, 10]}' --batch-size 32 --seed 3 --optimizer sgd --lr "
         "0.05 --momentum 0.9 --steps " +
         std::to_string(steps) +
         " --log-every 1 --nproc 4 --pp 2 --dp 2 --chunks 4 --schedule interleaved-1f1b "
         "--virtual 2 --overlap-grad-reduce --bucket-size 0.004 --timeout " +
         std::to_string(timeout) + " --checkpoint-format file --checkpoint-dir " + dir +
         "/checkpoints --save-every 3 --save-params " + dir + "/params.pt " + extra;
}

// A replica killed while its gradients are summed in buckets: without restarts every other rank
// stops within the timeout (5 s) + 10 s naming what failed (its step and action, or the collective
// it was in); with --max-restarts the run ends bit for bit where the uninterrupted one ends.
void expect_killed_replica_stops_and_restarts_exactly(const std::string& extra,
                                                      const std::string& tag) {
  std::string pattern = ::testing::TempDir() + "pipetrain_restart_overlap_XXXXXX";
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const std::string fault = pattern + "/fault", whole = pattern + "/whole",
                    killed = pattern + "/killed";
  const auto start = std::chrono::steady_clock::now();
  const KilledRun stopped = run_killing(
      "mkdir -p " + fault + " && " + kBinary + " " + overlap_flags(fault, 100000, extra, 5),
      tag + "-fault", {6}, {3});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(stopped.killed_at.size(), 1u) << stopped.output;
  EXPECT_EQ(stopped.exit_code, 128 + SIGKILL) << stopped.output;
  for (int rank : {0, 1, 2}) {
    const std::string self = "[rank " + std::to_string(rank) + "] rank " + std::to_string(rank);
    EXPECT_TRUE(stopped.output.find(self + ": error: ") != std::string::npos ||
                stopped.output.find(self + ": exiting: the job was aborted") != std::string::npos)
        << rank << "\n"
        << stopped.output;
  }
  EXPECT_LT(seconds, 60.0) << stopped.output;  // steps take milliseconds; timeout 10 s

  const KilledRun first =
      run_killing("mkdir -p " + whole + " && " + kBinary + " " + overlap_flags(whole, 30, extra),
                  tag + "-whole", {}, {});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const KilledRun run = run_killing("mkdir -p " + killed + " && " + kBinary + " " +
                                        overlap_flags(killed, 30, extra) + " --max-restarts 2",
                                    tag + "-killed", {7, 16}, {2, 1});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ASSERT_EQ(run.killed_at.size(), 2u) << run.output;
  expect_same_params(killed + "/params.pt", whole + "/params.pt");
}

TEST(TrainRestartOverlap, AKilledReplicaStopsEveryRankAndRestartsEndEqualToTheUninterruptedRun) {
  expect_killed_replica_stops_and_restarts_exactly("", "overlap");
}

// ZeRO-3: each stage's parameters all-gathered around its actions and its gradients
// reduce-scattered after its last backward; the kill lands in one of those collectives or
// between them, and the restarted run resumes from checkpoints whose parameters were gathered.
// The optimizer state and the parameter shards are in files (--offload-optimizer nvme
// --offload-params nvme): a killed process's file is gone with it, the restart reads the last
// checkpoint, and the run still ends exactly.
TEST(TrainRestartOverlap, ZeroThreeAKilledReplicaStopsEveryRankAndRestartsEndExactly) {
  expect_killed_replica_stops_and_restarts_exactly(
      "--zero 3 --offload-optimizer nvme --offload-params nvme --offload-dir " +
          ::testing::TempDir(),
      "overlap-zero3");
}

}  // namespace pipetrain::restart_test
