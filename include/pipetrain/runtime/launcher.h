// Local launcher: runs N ranks of one program on this machine, torchrun-style.
//
// launch_local() starts `nproc` children (fork + exec of `program` with `args`), each in its own
// process group, with the rendezvous environment set:
//   MASTER_ADDR=127.0.0.1  MASTER_PORT=<a free port>  RANK=r  WORLD_SIZE=N  LOCAL_RANK=r
//   LOCAL_WORLD_SIZE=N  PIPETRAIN_LAUNCHED=1
// and, with LaunchOptions::store_socket where it picks MASTER_PORT itself, the socket it already
// listens on there for rank 0's store (PIPETRAIN_STORE_SOCKET=<fd>, rank 0 only;
// DistributedEnvironment::store_socket): ranks that start before rank 0 wait in its backlog
// rather than being refused and backing off.
// It prefixes every line the children print with "[rank r] " (stdout to stdout, stderr to stderr),
// forwards SIGINT and SIGTERM to every child, and when a rank fails (non-zero exit or a signal)
// waits `grace` for the others to stop on their own (they see the abort, docs/DISTRIBUTED.md),
// then sends SIGTERM and, 2 s later, SIGKILL to what is left. On return no child is left running.
//
// Restarts (torchrun's --max-restarts): with max_restarts = N > 0, a failed attempt is followed by
// a new one, every rank started again, up to N times. Each attempt's ranks get
// TORCHELASTIC_RESTART_COUNT = 0, 1, ... as under torchrun; `pipetrain train` resumes from its
// --checkpoint-dir when it is above 0 (train::checkpoint_after_restart, train/trainer.h). Not
// restarted: an attempt stopped by SIGINT/SIGTERM, one that ran out of `timeout`, and one whose
// first failure exited 2 (bad input, which the next attempt would meet again).
//
// Exit code: 0 when every rank exited 0; else the first failing rank's exit code (128 + signal
// for a rank killed by a signal). The first failure is summarised last, with the tail of that
// rank's stderr, so it is the first thing a reader sees at the bottom of the log.
//
// Thread-safety: call from one thread; it installs SIGINT/SIGTERM handlers for its duration and
// restores the previous ones before returning.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pipetrain {

// The environment variable naming rank 0's inherited listening socket (above).
inline constexpr char kStoreSocketVariable[] = "PIPETRAIN_STORE_SOCKET";

struct LaunchOptions {
  std::string program;            // path of the executable each rank runs
  std::vector<std::string> args;  // its arguments (argv[1..])
  int nproc = 1;                  // ranks to start on this machine
  int world_size = 0;             // WORLD_SIZE; 0 = nproc (a larger value: tests of missing ranks)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0 = a free port found by binding port 0
  std::chrono::milliseconds grace{std::chrono::seconds(10)};  // after the first failure
  std::vector<std::pair<std::string, std::string>> env;       // extra environment for every rank
  // Receives every output line (without the newline). Default: print "[rank r] line" to the
  // launcher's stdout or stderr.
  std::function<void(int rank, bool is_stderr, const std::string& line)> on_line;
  // > 0: every child still running this long after the start is killed (SIGKILL to its process
  // group) and LaunchResult::timed_out is set. Counted per attempt.
  std::chrono::milliseconds timeout{0};
  // false: plain programs, not ranks of a job: no rendezvous variables (MASTER_*, RANK,
  // WORLD_SIZE, LOCAL_*, PIPETRAIN_LAUNCHED) are set and no port is looked for, and a failure is
  // not summarised as a rank's.
  bool rank_environment = true;
  int max_restarts = 0;  // see "Restarts" above; >= 0 (else pipetrain::BadInput)
  // true: rank 0 is a pipetrain program, whose Distributed takes over the socket the launcher
  // listens on at the MASTER_PORT it picks (above). Leave false for any other program: the
  // inherited socket would hold the port its own store binds. launch_self sets it.
  bool store_socket = false;
};

struct LaunchResult {
  int exit_code = 0;                 // as described above
  int first_failed_rank = -1;        // -1 when every rank succeeded
  std::vector<int> rank_exit_codes;  // per rank: exit code, or 128 + signal
  std::vector<int> pids;             // the children's pids (all reaped on return)
  std::vector<std::chrono::steady_clock::time_point> rank_ended_at;  // per rank: when it exited
  bool timed_out = false;    // LaunchOptions::timeout ran out
  bool interrupted = false;  // SIGINT or SIGTERM reached the launcher
  int restarts = 0;          // attempts after the first; the fields above are the last's
};

// REQUIRES: nproc >= 1 (else pipetrain::BadInput); program is executable. Throws a
// pipetrain::Error of kind Runtime if a child cannot be started (naming the program and errno).
LaunchResult launch_local(const LaunchOptions& options);

// A rank the launcher found ended.
struct RankEnd {
  int rank = 0;
  int exit_code = 0;      // exit code, or 128 + signal
  bool signaled = false;  // killed by a signal
};
// Of the ranks found ended in one look, the one launch_local reports as failing first: one killed
// by a signal before one that exited with an error (a killed rank says nothing itself, and the
// others' errors are then mostly about it: a peer's connection reset), else the lowest rank with
// a non-zero exit; -1 when every one exited 0.
int first_failure(const std::vector<RankEnd>& ended);

// The path of this executable (/proc/self/exe). When the file was replaced while this process
// runs (a rebuild), the link ends in " (deleted)": the new file at the same path is returned.
// Throws a pipetrain::Error of kind Runtime naming errno when the link cannot be read.
std::string self_executable();

// Re-runs this executable as `nproc` ranks with `args` (launch_local) and keeps, per rank, the
// text after `prefix` on the last stdout line that starts with it: how a parent collects one
// result line from each rank. Every other line goes to stderr as "[rank r] line".
struct CollectedRun {
  LaunchResult launched;
  std::vector<std::optional<std::string>> results;  // per rank; nullopt: no such line
};
CollectedRun launch_self_collecting(int nproc, const std::vector<std::string>& args,
                                    const std::string& prefix);

// Re-runs this executable (/proc/self/exe) `nproc` times with `args`: the glue behind
// `pipetrain train --nproc N [--max-restarts R]`. Returns the exit code as launch_local.
int launch_self(int nproc, const std::vector<std::string>& args,
                std::chrono::milliseconds grace = std::chrono::seconds(10), int max_restarts = 0);

// A TCP port on `addr` that was free a moment ago, drawn below the kernel's own range of ports
// (ip_local_port_range), so that no connection made meanwhile takes it; the kernel's choice
// (bind port 0) where that range cannot be read or nothing below it is free.
int find_free_port(const std::string& addr = "127.0.0.1");

// This process's arguments (argv[1..], read from /proc/self/cmdline) less the launcher's own flags
// (strip_launcher_flags below): what launch_self re-runs as each rank. Throws a pipetrain::Error
// of kind Runtime when /proc/self/cmdline cannot be read.
std::vector<std::string> self_arguments();

// Removes "--nproc N" and "--max-restarts N" (also as "--flag=N", the launcher's own flags) from
// argv and returns the rest, argv[0] excluded.
std::vector<std::string> strip_launcher_flags(int argc, const char* const* argv);

}  // namespace pipetrain
