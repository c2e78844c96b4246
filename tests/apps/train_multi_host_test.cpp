// A pipeline x tensor x data parallel job across hosts: 8 network namespaces on this machine
// (testing::NetworkHosts), one `pipetrain train` rank of a pp 2 x tp 2 x dp 2 job in each, the
// store on host 0. A cable cut mid-run between a tensor-parallel rank's host and the rest must
// stop every rank within the timeout + 10 s, each naming why.
//
// Needs root and iproute2 (the test skips saying which is missing) and the Hugging Face fixtures.
#include <signal.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "../helpers/cli_run.h"
#include "../helpers/hf_models.h"
#include "../helpers/network_hosts.h"
#include "../helpers/processes.h"
#include "pipetrain/runtime/launcher.h"

namespace pipetrain::multi_host_tp_test {
namespace {

using Clock = std::chrono::steady_clock;
using testing::NetworkHosts;

const std::string kBinary = std::string(PIPETRAIN_BINARY_DIR) + "/pipetrain";
constexpr int kHosts = 8;
constexpr int kTimeoutSeconds = 10;  // the ranks' --timeout
constexpr int kFaultStep = 3;
constexpr int kCutHost = 5;  // replica 1, pipeline rank 0, tp rank 1

TEST(TrainMultiHostTensorParallel, ACableCutInAThreeDimensionalJobStopsEveryRankWithinTheTimeout) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  if (auto reason = NetworkHosts::unavailable()) GTEST_SKIP() << *reason;
  NetworkHosts hosts(kHosts);
  const std::string fixtures = testing::hf_fixtures();
  const std::string flags = "train --model " + fixtures + "/qwen2 --data tokens --token-file " +
                            fixtures +
                            "/tokens.bin --seq-len 16 --batch-size 8 --steps 100000 "
                            "--log-every 1 --pp 2 --tp 2 --dp 2 --chunks 2 --timeout " +
                            std::to_string(kTimeoutSeconds);
  std::mutex mutex;
  std::string output;
  std::optional<Clock::time_point> fault_at;
  const std::regex step_line(R"(step (\d+))");
  LaunchOptions options;
  options.program = "/bin/sh";
  options.args = {"-c", "exec " + hosts.in_host_of_rank() + "env GLOO_SOCKET_IFNAME=eth0 " +
                            kBinary + " " + flags};
  options.nproc = kHosts;
  options.master_addr = NetworkHosts::address(0);
  options.master_port = 29500;  // free: the hosts are new
  options.env = {{"PIPETRAIN_TEST_JOB", "tp-cable"}};
  options.grace = std::chrono::seconds(kTimeoutSeconds + 12);
  options.timeout = std::chrono::seconds(240);
  options.on_line = [&](int rank, bool, const std::string& line) {
    std::lock_guard<std::mutex> lock(mutex);
    output += "[rank " + std::to_string(rank) + "] " + line + "\n";
    std::smatch match;
    if (fault_at || !std::regex_search(line, match, step_line) ||
        std::stoi(match[1]) < kFaultStep) {
      return;
    }
    hosts.set_cable(kCutHost, false);
    fault_at = Clock::now();
    output += "[test: host " + std::to_string(kCutHost) + "'s cable cut after step " +
              match[1].str() + "]\n";
  };
  const LaunchResult launched = launch_local(options);

  ASSERT_TRUE(fault_at.has_value()) << "the job ended before the fault:\n" << output;
  EXPECT_NE(launched.exit_code, 0) << output;
  for (int r = 0; r < kHosts; ++r) {
    const double seconds =
        std::chrono::duration<double>(launched.rank_ended_at[static_cast<size_t>(r)] - *fault_at)
            .count();
    std::cout << "rank " << r << " exited " << seconds << " s after the cut (code "
              << launched.rank_exit_codes[static_cast<size_t>(r)] << ")\n";
    EXPECT_LE(seconds, kTimeoutSeconds + 10) << "rank " << r << "\n" << output;
    const int code = launched.rank_exit_codes[static_cast<size_t>(r)];
    EXPECT_TRUE(code != 128 + SIGTERM && code != 128 + SIGKILL)
        << "rank " << r << " had to be stopped by the launcher (code " << code << ")\n"
        << output;
    const std::string self = "[rank " + std::to_string(r) + "] rank " + std::to_string(r);
    EXPECT_TRUE(output.find(self + ": error: ") != std::string::npos ||
                output.find(self + ": exiting: the job was aborted: ") != std::string::npos)
        << "rank " << r << " did not say why it stopped:\n"
        << output;
  }
  EXPECT_TRUE(testing::processes_with({"PIPETRAIN_TEST_JOB=tp-cable"}).empty())
      << "a process of the job is left";
}

}  // namespace
}  // namespace pipetrain::multi_host_tp_test
