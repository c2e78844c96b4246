// launch_local with pipetrain_rank_helper as a tiny child: environment, prefixed output, exit
// codes, stopping the others after a failure, signal forwarding, no stray processes.
#include "pipetrain/runtime/launcher.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "../helpers/multiprocess.h"
#include "../helpers/processes.h"
#include "../helpers/wait_until.h"

namespace pipetrain {
namespace {

using testing::run_ranks;

// A directory of its own under the test's TempDir(), where the ranks of one run leave word for
// each other (rank_helper.cpp, "sleep_unless_rank0_fails").
std::string fresh_directory() {
  std::string dir = ::testing::TempDir() + "launcher_XXXXXX";
  EXPECT_NE(::mkdtemp(dir.data()), nullptr) << dir;
  return dir;
}

TEST(Launcher, GivesEveryRankItsEnvironmentAndPrefixesItsLines) {
  auto run = run_ranks(3, {"echo", "0,0,0"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  for (int r = 0; r < 3; ++r) {
    const std::string rank = std::to_string(r);
    EXPECT_TRUE(run.printed("[rank " + rank + "] hello from " + rank + " of 3 port"))
        << run.output();
    EXPECT_TRUE(run.printed("[rank " + rank + "!] note from " + rank)) << run.output();
    // A last line without a newline is still delivered, once.
    EXPECT_EQ(run.count("[rank " + rank + "] partial line without newline"), 1) << run.output();
  }
  EXPECT_EQ(run.result.first_failed_rank, -1);
  EXPECT_TRUE(run.all_gone());
}

TEST(Launcher, ExitsWithTheFirstFailingRanksCode) {
  auto run = run_ranks(3, {"echo", "0,5,0"});
  EXPECT_EQ(run.result.exit_code, 5);
  EXPECT_EQ(run.result.first_failed_rank, 1);
  EXPECT_EQ(run.result.rank_exit_codes, (std::vector<int>{0, 5, 0}));
}

// Several ranks found ended in one look (a rank SIGKILLed, and a peer that saw its connection
// reset in the same instant): the killed one is reported, not the lower rank whose error is about
// it; among equals the lowest rank; nobody when every rank succeeded.
TEST(Launcher, AmongRanksEndedAtOnceASignalledOneFailsFirst) {
  EXPECT_EQ(first_failure({{1, 1, false}, {3, 128 + SIGKILL, true}}), 3);
  EXPECT_EQ(first_failure({{3, 128 + SIGKILL, true}, {1, 1, false}}), 3);
  EXPECT_EQ(first_failure({{2, 128 + SIGKILL, true}, {3, 128 + SIGTERM, true}}), 2);
  EXPECT_EQ(first_failure({{0, 0, false}, {2, 4, false}, {1, 5, false}}), 1);
  EXPECT_EQ(first_failure({{0, 0, false}, {1, 0, false}}), -1);
  EXPECT_EQ(first_failure({}), -1);
}

TEST(Launcher, StopsTheOtherRanksAfterTheGracePeriodWhenOneFails) {
  auto run = run_ranks(3, {"sleep_unless_rank0_fails"}, 0, 8000, std::chrono::milliseconds(500));
  EXPECT_EQ(run.result.exit_code, 7);
  EXPECT_EQ(run.result.first_failed_rank, 0);
  EXPECT_EQ(run.result.rank_exit_codes[1], 128 + SIGTERM);
  EXPECT_LT(run.seconds, 10.0);  // the sleepers would take 60 s
  EXPECT_TRUE(run.all_gone());
}

// Rank 0 fails once rank 1 has said it ignores SIGTERM (before, a rank 1 still starting when
// the 300 ms grace ran out died of the SIGTERM).
TEST(Launcher, EscalatesToSigkillForRanksIgnoringSigterm) {
  auto run = run_ranks(2, {"sleep_unless_rank0_fails", "ignore_term", fresh_directory()}, 0, 8000,
                       std::chrono::milliseconds(300));
  EXPECT_EQ(run.result.exit_code, 7) << run.output();
  EXPECT_EQ(run.result.rank_exit_codes[1], 128 + SIGKILL) << run.output();
  EXPECT_LT(run.seconds, 10.0);
  EXPECT_TRUE(run.all_gone());
}

// A rank that dies of a signal says nothing: after the first failure, each other rank killed by a
// signal the launcher did not send is named with its signal; those it stopped itself are not.
// The other ranks die once the launcher has reaped rank 0 (before, they slept 300 ms and, under
// load, died first).
TEST(Launcher, NamesEveryOtherRankKilledByASignalItDidNotSend) {
  ::testing::internal::CaptureStderr();
  auto run = run_ranks(3, {"sleep_unless_rank0_fails", "die_of_sigpipe", fresh_directory()}, 0,
                       8000, std::chrono::seconds(10));
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(run.result.exit_code, 7) << run.output();
  EXPECT_EQ(run.result.first_failed_rank, 0) << run.output();
  EXPECT_EQ(run.result.rank_exit_codes, (std::vector<int>{7, 128 + SIGPIPE, 128 + SIGPIPE}))
      << run.output();
  for (const char* rank : {"1", "2"}) {
    EXPECT_NE(
        said.find(std::string("pipetrain launch: rank ") + rank + " ended too, killed by signal " +
                  std::to_string(SIGPIPE) + " (SIGPIPE), a signal this launcher did not send"),
        std::string::npos)
        << said;
  }
  // Ended by themselves, long before the grace of 10 s (counted from rank 0's end, so that the
  // ranks' start on a loaded machine does not count).
  for (const int rank : {1, 2}) {
    EXPECT_LT(
        std::chrono::duration<double>(run.result.rank_ended_at[rank] - run.result.rank_ended_at[0])
            .count(),
        5.0)
        << "rank " << rank;
  }

  ::testing::internal::CaptureStderr();
  auto stopped =
      run_ranks(2, {"sleep_unless_rank0_fails"}, 0, 8000, std::chrono::milliseconds(300));
  const std::string quiet = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(stopped.result.rank_exit_codes[1], 128 + SIGTERM);
  EXPECT_EQ(quiet.find("ended too"), std::string::npos) << quiet;
}

// A launcher SIGKILLed cannot stop its ranks itself: they die with it (PR_SET_PDEATHSIG) rather
// than train on as orphans. The launcher here is the rank helper's "launch_waiters" (2 ranks that
// say "waiting", then sleep 60 s), a process of its own, killed once both have spoken: a rank
// that wrote after the launcher's death would die of SIGPIPE anyway (its pipe has no reader), so
// only silent ranks show what the launcher's death alone does.
TEST(Launcher, RanksDieWithALauncherKilledOutright) {
  const std::string tag = "orphans-" + std::to_string(getpid());
  std::vector<std::string> env{"PIPETRAIN_TEST_JOB=" + tag};
  for (char** variable = environ; *variable != nullptr; ++variable) env.emplace_back(*variable);
  std::vector<char*> envp;
  for (auto& variable : env) envp.push_back(variable.data());
  envp.push_back(nullptr);
  std::string program = PIPETRAIN_RANK_HELPER, scenario = "launch_waiters";
  char* argv[] = {program.data(), scenario.data(), nullptr};
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  pid_t launcher = -1;
  const int spawned = posix_spawn(&launcher, program.c_str(), &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  ASSERT_EQ(spawned, 0);
  std::string said;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((said.find("[rank 0] waiting") == std::string::npos ||
          said.find("[rank 1] waiting") == std::string::npos) &&
         std::chrono::steady_clock::now() < deadline) {
    pollfd readable{out[0], POLLIN, 0};
    if (poll(&readable, 1, 100) <= 0) continue;
    char buffer[256];
    const ssize_t n = read(out[0], buffer, sizeof(buffer));
    if (n <= 0) break;
    said.append(buffer, static_cast<std::size_t>(n));
  }
  auto ranks_alive = [&] {
    return testing::processes_with({"PIPETRAIN_TEST_JOB=" + tag, "RANK=0"}).size() +
           testing::processes_with({"PIPETRAIN_TEST_JOB=" + tag, "RANK=1"}).size();
  };
  EXPECT_EQ(ranks_alive(), 2u) << "the launcher did not start its 2 ranks: " << said;
  ASSERT_EQ(kill(launcher, SIGKILL), 0);
  ASSERT_EQ(waitpid(launcher, nullptr, 0), launcher);
  close(out[0]);
  EXPECT_TRUE(testing::wait_until([&] { return ranks_alive() == 0; }, std::chrono::seconds(5)))
      << "ranks outlived their launcher by 5 s";
  for (const pid_t orphan : testing::processes_with({"PIPETRAIN_TEST_JOB=" + tag})) {
    kill(orphan, SIGKILL);  // what a failure left behind
  }
}

// The SIGTERM comes once both ranks have said "waiting" (before, 1.5 s after the start, which a
// loaded machine can spend starting the ranks); the launcher's handler catches it and forwards it.
TEST(Launcher, ForwardsSigtermToEveryRank) {
  LaunchOptions options;
  options.program = PIPETRAIN_RANK_HELPER;
  options.args = {"wait_signal"};
  options.nproc = 2;
  options.grace = std::chrono::seconds(5);
  options.timeout = std::chrono::seconds(30);  // ranks that never said "waiting" sleep 60 s
  std::vector<std::string> lines;
  int waiting = 0;
  std::chrono::steady_clock::time_point signalled;
  options.on_line = [&](int rank, bool is_stderr, const std::string& line) {
    lines.push_back("[rank " + std::to_string(rank) + (is_stderr ? "!] " : "] ") + line);
    if (!is_stderr && line == "waiting" && ++waiting == 2) {
      signalled = std::chrono::steady_clock::now();
      kill(getpid(), SIGTERM);
    }
  };
  const LaunchResult result = launch_local(options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
  std::string said;
  for (const std::string& line : lines) said += line + "\n";
  EXPECT_EQ(waiting, 2) << said;
  EXPECT_FALSE(result.timed_out) << said;
  EXPECT_TRUE(result.interrupted) << said;
  EXPECT_EQ(result.rank_exit_codes, (std::vector<int>{128 + SIGTERM, 128 + SIGTERM})) << said;
  EXPECT_LT(seconds, 4.0) << said;  // forwarded at once, not after the grace of 5 s
  for (const int pid : result.pids) EXPECT_NE(kill(pid, 0), 0) << "rank process " << pid;
}

// Regression: launch_local left its SIGINT/SIGTERM handlers installed, its pipes open and its
// children running when it threw (here: the caller's on_line throws at the first line).
TEST(Launcher, AThrowRestoresTheSignalHandlersAndLeavesNoChildBehind) {
  struct sigaction before {};
  sigaction(SIGTERM, nullptr, &before);
  LaunchOptions options;
  options.program = "/bin/sh";
  options.args = {"-c", "echo first; exec sleep 60"};
  options.nproc = 2;
  options.on_line = [](int, bool, const std::string&) -> void {
    throw std::runtime_error("the caller gives up");
  };
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(launch_local(options), std::runtime_error);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 10.0);  // the sleepers were killed, not waited for
  struct sigaction after {};
  sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
  // Every child was reaped: none is left to wait for, zombie or running.
  errno = 0;
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST(Launcher, ReportsAProgramThatCannotStart) {
  LaunchOptions options;
  options.program = "/nonexistent/pipetrain_helper";
  options.nproc = 2;
  std::vector<std::string> lines;
  options.on_line = [&](int, bool, const std::string& line) { lines.push_back(line); };
  const auto result = launch_local(options);
  EXPECT_EQ(result.exit_code, 127);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines[0].find("cannot execute /nonexistent/pipetrain_helper"), std::string::npos);
}

// With store_socket, rank 0 alone inherits a socket the launcher listens on at MASTER_PORT (a
// rank that connects before rank 0's store is up waits in its backlog); without it, none does.
TEST(Launcher, HandsRankZeroTheSocketItListensOnAtMasterPort) {
  for (const bool store_socket : {true, false}) {
    LaunchOptions options;
    options.program = "/bin/sh";
    // /proc/net/tcp lists listening sockets (state 0A) by hex port; the socket's inode ties the
    // inherited descriptor to that line.
    options.args = {"-c",
                    "fd=${PIPETRAIN_STORE_SOCKET:-none}; "
                    "if [ $fd = none ]; then echo \"rank $RANK none\"; exit 0; fi; "
                    "inode=$(readlink /proc/$$/fd/$fd | tr -dc 0-9); "
                    "port=$(printf %04X $MASTER_PORT); "
                    "grep -q \":$port 00000000:0000 0A .* $inode \" /proc/net/tcp "
                    "&& echo \"rank $RANK listens\" || echo \"rank $RANK other\""};
    options.nproc = 3;
    options.store_socket = store_socket;
    std::vector<std::string> lines;
    options.on_line = [&](int, bool, const std::string& line) { lines.push_back(line); };
    const auto result = launch_local(options);
    EXPECT_EQ(result.exit_code, 0);
    std::sort(lines.begin(), lines.end());
    const std::vector<std::string> expected = {store_socket ? "rank 0 listens" : "rank 0 none",
                                               "rank 1 none", "rank 2 none"};
    EXPECT_EQ(lines, expected) << "store_socket " << store_socket;
  }
}

TEST(FindFreePort, ReturnsAPortThatCanBeBound) {
  const int port = find_free_port();
  ASSERT_GT(port, 0);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  close(fd);
}

// The race it avoids: a port from the kernel's own range (what bind to port 0 gives) can become
// any outgoing connection's local end before rank 0's store binds it.
TEST(FindFreePort, DrawsBelowTheKernelsOwnRangeOfPorts) {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  int high = 0;
  if (!(range >> low >> high) || low <= 2048) {
    GTEST_SKIP() << "needs /proc/sys/net/ipv4/ip_local_port_range starting above 2048 (read " << low
                 << ")";
  }
  std::set<int> ports;
  for (int k = 0; k < 20; ++k) {
    const int port = find_free_port();
    EXPECT_GE(port, std::max(1024, low / 2));
    EXPECT_LT(port, low) << "the kernel's range is " << low << ".." << high;
    ports.insert(port);
  }
  EXPECT_GT(ports.size(), 1u) << "20 draws gave one port";
}

TEST(StripLauncherFlags, RemovesNprocInBothSpellings) {
  const char* argv[] = {"pipetrain", "train", "--nproc", "4", "--chunks", "8", "--nproc=2", "x"};
  EXPECT_EQ(strip_launcher_flags(8, argv),
            (std::vector<std::string>{"train", "--chunks", "8", "x"}));
}

}  // namespace
}  // namespace pipetrain
