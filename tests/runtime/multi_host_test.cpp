// Ranks on separate hosts (issue #19): three network namespaces joined by veth cables to a bridge
// (testing::NetworkHosts), one `pipetrain train` rank in each over c10d Gloo, the store on host 0.
// First the run is transparent there (its weights equal a one-process run's); then faults are
// injected mid-run from outside, as they happen between machines: a cable cut, the store's host
// lost, a rank SIGKILLed, SIGSTOPped (a stalled host), and made to throw (a NaN in its data);
// packet loss and delay (tc netem) where the kernel has it. For each fault:
//   - every rank that is still alive exits on its own within --timeout + 10 s of the fault,
//   - the output names a failing rank and what could not complete,
//   - no process of the job is left, and
//   - the last checkpoint loads (it was written atomically, never half).
// Skips, saying why, without root or network namespaces.
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/cli_run.h"
#include "../helpers/network_hosts.h"
#include "../helpers/params_file.h"
#include "../helpers/processes.h"
#include "pipetrain/runtime/launcher.h"
#include "pipetrain/train/checkpoint.h"

namespace pipetrain::multi_host_test {

using Clock = std::chrono::steady_clock;
using testing::NetworkHosts;

const std::string kBinary = std::string(PIPETRAIN_BINARY_DIR) + "/pipetrain";
constexpr int kHosts = 3;
constexpr int kTimeoutSeconds = 10;  // the ranks' --timeout
constexpr int kFaultStep = 20;

struct HostRun {
  LaunchResult launched;
  std::string output;
  std::optional<Clock::time_point> fault_at;  // when the fault was injected
};

void write_tensor(const torch::Tensor& tensor, const std::string& file) {
  const std::vector<char> bytes = torch::pickle_save(tensor);
  std::ofstream(file, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class MultiHost : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    skip_ = new std::optional<std::string>(NetworkHosts::unavailable());
    std::string pattern = ::testing::TempDir() + "pipetrain_multi_host_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = new std::string(pattern);
    // 64 rows of 16 features, 4 classes; a copy whose rows 40..47 (batch 5 of 8) are NaN.
    torch::manual_seed(5);
    const torch::Tensor x = torch::randn({64, 16});
    write_tensor(x, path("x.pt"));
    write_tensor(torch::randint(0, 4, {64}, torch::kLong), path("y.pt"));
    torch::Tensor poisoned = x.clone();
    poisoned.slice(0, 40, 48).fill_(std::numeric_limits<float>::quiet_NaN());
    write_tensor(poisoned, path("x_nan.pt"));
  }
  void SetUp() override {
    if (*skip_) GTEST_SKIP() << **skip_;
  }
  static std::string path(const std::string& name) { return *dir_ + "/" + name; }

  // A 5-layer MLP over three pipeline ranks (the default), 1F1B with 4 micro-batches.
  static std::string train_flags(const std::string& tag, int steps, const std::string& inputs) {
    return "train --model mlp --model-options '{\"widths\": [16, 64, 64, 4]}' --loss "
           "cross-entropy --inputs " +
           path(inputs) + " --targets " + path("y.pt") +
           " --batch-size 8 --chunks 4 --optimizer sgd --lr 0.05 --seed 1 --steps " +
           std::to_string(steps) + " --timeout " + std::to_string(kTimeoutSeconds) +
           " --checkpoint-format file --checkpoint-dir " + path(tag) + " --save-every 5";
  }

  // Runs `flags` as one rank per host and calls `fault` once, when a progress line reaches
  // `fault_step`. The launcher's grace (after the first failure) ends after the bound, so a rank
  // that exits within the bound did so on its own.
  static HostRun run_on_hosts(const NetworkHosts& hosts, const std::string& tag,
                              const std::string& flags, const std::function<void()>& fault,
                              int fault_step = kFaultStep) {
    HostRun run;
    std::mutex mutex;
    const std::regex step_line(R"(step (\d+))");
    LaunchOptions options;
    options.program = "/bin/sh";
    options.args = {"-c", "exec " + hosts.in_host_of_rank() + "env GLOO_SOCKET_IFNAME=eth0 " +
                              kBinary + " " + flags};
    options.nproc = hosts.count();
    options.master_addr = NetworkHosts::address(0);
    options.master_port = 29500;  // free: the hosts are new
    options.env = {{"PIPETRAIN_TEST_JOB", tag}};
    options.grace = std::chrono::seconds(kTimeoutSeconds + 12);
    options.timeout = std::chrono::seconds(180);
    options.on_line = [&](int rank, bool, const std::string& line) {
      std::lock_guard<std::mutex> lock(mutex);
      run.output += "[rank " + std::to_string(rank) + "] " + line + "\n";
      std::smatch match;
      if (!fault || run.fault_at || !std::regex_search(line, match, step_line) ||
          std::stoi(match[1]) < fault_step) {
        return;
      }
      fault();
      run.fault_at = Clock::now();
      run.output += "[test: fault injected after step " + std::string(match[1]) + "]\n";
    };
    run.launched = launch_local(options);
    return run;
  }

  // The checks every fault shares. The survivors are the ranks alive after the fault: every rank
  // but `victim` (-1: none was killed or stopped). Each survivor says why it stops: its error,
  // which names the step ("rank r: error: step 21 failed: <action>: ...", "rank r: error: loss is
  // nan at step 5"), or the abort that reached it ("rank r: exiting: the job was aborted: ..."),
  // whichever came first; `names_what` are pieces every run of the fault prints.
  static void expect_bounded_failure(const HostRun& run, const std::string& tag, int victim,
                                     const std::vector<std::string>& names_what) {
    ASSERT_TRUE(run.fault_at.has_value()) << "the job ended before the fault:\n" << run.output;
    EXPECT_NE(run.launched.exit_code, 0) << run.output;
    for (int r = 0; r < kHosts; ++r) {
      if (r == victim) continue;
      const auto& ended = run.launched.rank_ended_at[static_cast<std::size_t>(r)];
      const double seconds = std::chrono::duration<double>(ended - *run.fault_at).count();
      std::cout << tag << ": rank " << r << " exited " << seconds << " s after the fault (code "
                << run.launched.rank_exit_codes[static_cast<std::size_t>(r)] << ")\n";
      EXPECT_LE(seconds, kTimeoutSeconds + 10) << "rank " << r << "\n" << run.output;
      const int code = run.launched.rank_exit_codes[static_cast<std::size_t>(r)];
      EXPECT_TRUE(code != 128 + SIGTERM && code != 128 + SIGKILL)
          << "rank " << r << " had to be stopped by the launcher (code " << code << ")\n"
          << run.output;
      const std::string self = "[rank " + std::to_string(r) + "] rank " + std::to_string(r);
      EXPECT_TRUE(run.output.find(self + ": error: ") != std::string::npos ||
                  run.output.find(self + ": exiting: the job was aborted: ") != std::string::npos)
          << "rank " << r << " did not say why it stopped:\n"
          << run.output;
    }
    for (const std::string& piece : names_what) {
      EXPECT_NE(run.output.find(piece), std::string::npos) << "expected '" << piece << "' in:\n"
                                                           << run.output;
    }
    EXPECT_TRUE(testing::processes_with({"PIPETRAIN_TEST_JOB=" + tag}).empty())
        << "a process of the job is left";
    const train::Checkpoint checkpoint = train::load_checkpoint(path(tag + "/checkpoint.pt"));
    EXPECT_GE(checkpoint.step, 5) << "the last checkpoint before the fault";
  }

  static std::optional<std::string>* skip_;
  static std::string* dir_;
};
std::optional<std::string>* MultiHost::skip_ = nullptr;
std::string* MultiHost::dir_ = nullptr;

TEST_F(MultiHost, RanksOnThreeHostsTrainLikeOneProcess) {
  NetworkHosts hosts(kHosts);
  const HostRun run = run_on_hosts(
      hosts, "transparent",
      train_flags("transparent", 12, "x.pt") + " --save-params " + path("hosts.pt"), nullptr);
  ASSERT_EQ(run.launched.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("3 stages on 3 ranks (3 processes: 3 pipeline x 1 data-parallel)"),
            std::string::npos)
      << run.output;
  const testing::CliRun alone = testing::run_command(
      kBinary + " " + train_flags("alone", 12, "x.pt") + " --save-params " + path("alone.pt"));
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  EXPECT_LE(testing::max_relative_difference(path("hosts.pt"), path("alone.pt")), 1e-5);
}

TEST_F(MultiHost, ACableCutMidStepStopsEveryRankWithinTheTimeout) {
  NetworkHosts hosts(kHosts);
  const HostRun run = run_on_hosts(hosts, "cable", train_flags("cable", 100000, "x.pt"),
                                   [&] { hosts.set_cable(1, false); });
  // Which of the ranks' own bounds comes first depends on where the step was: a Gloo timeout
  // ("allreduce over group 'world' failed"), rank 1's missing heartbeat, or (rank 1) the store
  // that stopped answering. Each rank names its step and action or the abort.
  expect_bounded_failure(run, "cable", -1, {});
}

TEST_F(MultiHost, LosingTheStoresHostStopsEveryRankWithinTheTimeout) {
  NetworkHosts hosts(kHosts);
  const HostRun run = run_on_hosts(hosts, "store", train_flags("store", 100000, "x.pt"),
                                   [&] { hosts.set_cable(0, false); });
  // Each rank names the step and the action it could not complete (a Gloo timeout, a missing
  // heartbeat) or the abort; ranks 1 and 2 may see the store stop answering first.
  expect_bounded_failure(run, "store", -1, {});
}

TEST_F(MultiHost, AKilledRankStopsTheOthersWithinTheTimeout) {
  NetworkHosts hosts(kHosts);
  const HostRun run = run_on_hosts(hosts, "sigkill", train_flags("sigkill", 100000, "x.pt"),
                                   [] { ::kill(testing::rank_process("sigkill", 1), SIGKILL); });
  EXPECT_EQ(run.launched.first_failed_rank, 1) << run.output;
  expect_bounded_failure(run, "sigkill", 1, {});
}

TEST_F(MultiHost, AStalledHostStopsTheOthersWithinTheTimeout) {
  NetworkHosts hosts(kHosts);
  pid_t stopped = -1;
  const HostRun run = run_on_hosts(hosts, "sigstop", train_flags("sigstop", 100000, "x.pt"), [&] {
    stopped = testing::rank_process("sigstop", 1);
    ::kill(stopped, SIGSTOP);
  });
  // Rank 1's missing heartbeat, or a Gloo timeout when the stop came inside a collective.
  expect_bounded_failure(run, "sigstop", 1, {});
}

TEST_F(MultiHost, ARankThatThrowsStopsTheOthersWithinTheTimeout) {
  NetworkHosts hosts(kHosts);
  // Batch 5 of every epoch is NaN: the loss of step 5 + 8k is not finite. The fault is in the
  // data; the callback only marks when it is reached.
  const HostRun run = run_on_hosts(
      hosts, "throw", train_flags("throw", 100000, "x_nan.pt"), [] {}, 3);
  expect_bounded_failure(run, "throw", run.launched.first_failed_rank,
                         {"error: loss is nan at step 5 (epoch 0, batch 5)"});
}

TEST_F(MultiHost, PacketLossAndDelayEitherTrainOrFailWithinTheTimeout) {
  NetworkHosts hosts(kHosts);
  if (auto reason = NetworkHosts::netem_unavailable(hosts)) GTEST_SKIP() << *reason;
  const HostRun run = run_on_hosts(hosts, "netem", train_flags("netem", 60, "x.pt"), [&] {
    hosts.run(1, "tc qdisc add dev eth0 root netem delay 200ms loss 30%");
  });
  ASSERT_TRUE(run.fault_at.has_value()) << run.output;
  // TCP carries the job through the loss and delay, or the ranks give up within the bound.
  const double seconds =
      std::chrono::duration<double>(run.launched.rank_ended_at[0] - *run.fault_at).count();
  if (run.launched.exit_code != 0) {
    EXPECT_LE(seconds, kTimeoutSeconds + 10) << run.output;
  }
  EXPECT_TRUE(testing::processes_with({"PIPETRAIN_TEST_JOB=netem"}).empty());
}

}  // namespace pipetrain::multi_host_test
