// launch_local: fork/exec N ranks, prefix their output, forward signals, stop all on a failure.
//
// The loop, every 100 ms or when a child writes or a signal arrives:
//   [1] read children's pipes; emit complete lines ("[rank r] ...")
//   [2] reap exited children (waitpid WNOHANG); the first non-zero exit starts the grace period
//   [3] forward SIGINT/SIGTERM (caught through a self-pipe) to every live child's process group
//   [4] grace over: SIGTERM the rest; 2 s later SIGKILL
// until every child is reaped and its pipes are drained. Children run in their own process
// groups, so a Ctrl-C at the terminal reaches only the launcher, which forwards it ([3]), and the
// final killpg also reaches anything a rank itself spawned.
//
// A launcher killed outright (SIGKILL, the OOM killer) cannot stop its ranks: each child asks the
// kernel for SIGKILL when the launcher's thread that started it ends (PR_SET_PDEATHSIG), so no
// rank trains on as an orphan. A rank once died at its next line of output then (SIGPIPE), but
// ranks ignore SIGPIPE now (transport/c10d.h, C10dWorld::connect) and would not.
//
// [5] With LaunchOptions::store_socket, where the launcher picks MASTER_PORT, it binds and listens
// on it before any rank starts, and rank 0 inherits that socket (PIPETRAIN_STORE_SOCKET) for its
// store's server: a rank that connects before rank 0 is up waits in the socket's backlog instead
// of being refused and backing off (c10d's client sleeps 0.2 to 0.5 s after a refusal, which
// every start of a short run spent), and no other process can take the port between its choice
// and rank 0's bind.
#include "pipetrain/runtime/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <utility>

#include "pipetrain/base/error.h"

namespace pipetrain {

namespace {

using Clock = std::chrono::steady_clock;

int g_signal_pipe_write = -1;

extern "C" void forward_signal_handler(int signal_number) {
  const int saved = errno;
  const char byte = static_cast<char>(signal_number);
  if (g_signal_pipe_write >= 0) {
    [[maybe_unused]] auto ignored = write(g_signal_pipe_write, &byte, 1);
  }
  errno = saved;
}

struct Stream {
  int fd = -1;
  std::string pending;  // bytes after the last newline
};

struct Child {
  pid_t pid = -1;
  bool running = false;
  int exit_code = 0;
  Clock::time_point ended;  // when it was reaped
  Stream out, err;
  std::deque<std::string> stderr_tail;  // last lines, for the failure summary
};

constexpr std::size_t kTailLines = 20;

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe_exit(int code) {
  if (code <= 128) return "exit code " + std::to_string(code);
  const int signal_number = code - 128;
  std::string text = "killed by signal " + std::to_string(signal_number);
  // glibc's abbreviation ("PIPE"; none for real-time signals). SIGKILL is the one everyone knows
  // by its number ("killed by signal 9").
  const char* name = sigabbrev_np(signal_number);
  if (name != nullptr && signal_number != SIGKILL) text += std::string(" (SIG") + name + ")";
  return text;
}

// The kernel's own range of ports (net.ipv4.ip_local_port_range): where bind to port 0 and the
// local end of every outgoing connection draw from. {0, 0} when it cannot be read.
std::pair<int, int> local_port_range() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  int high = 0;
  if (!(in >> low >> high)) return {0, 0};
  return {low, high};
}

// Whether `port` on `address` can be bound now: 0 if so, else errno. `port` 0 asks the kernel for
// one, written back into *chosen. With `listening`, the bound socket is kept, listening, in
// *listening (close-on-exec); otherwise it is closed.
int try_bind(const sockaddr_in& address, int port, int* chosen, int* listening = nullptr) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    throw Error(ErrorKind::Runtime, std::string("find_free_port: socket: ") + strerror(errno));
  sockaddr_in here = address;
  here.sin_port = htons(static_cast<uint16_t>(port));
  int error = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&here), sizeof(here)) != 0 ||
      (listening != nullptr && listen(fd, SOMAXCONN) != 0)) {
    error = errno;
  } else {
    socklen_t length = sizeof(here);
    getsockname(fd, reinterpret_cast<sockaddr*>(&here), &length);
    *chosen = ntohs(here.sin_port);
  }
  if (listening != nullptr && error == 0) {
    *listening = fd;
  } else {
    close(fd);
  }
  return error;
}

// find_free_port's search (below), keeping the socket where `listening` is given.
int bind_free_port(const std::string& addr, int* listening) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  if (inet_pton(AF_INET, addr.c_str(), &address.sin_addr) != 1) {
    throw BadInput("find_free_port: '" + addr + "' is not an IPv4 address");
  }
  int chosen = 0;
  const int low = local_port_range().first;
  if (low > 2048) {
    std::random_device seed;
    std::mt19937 draw(seed());
    std::uniform_int_distribution<int> below(std::max(1024, low / 2), low - 1);
    for (int tries = 0; tries < 64; ++tries) {
      if (try_bind(address, below(draw), &chosen, listening) == 0) return chosen;
    }
  }
  const int error = try_bind(address, 0, &chosen, listening);
  if (error != 0) {
    throw Error(ErrorKind::Runtime, "find_free_port: bind " + addr + ":0: " + strerror(error));
  }
  return chosen;
}

// [5] The socket rank 0's store takes over: closed by the launcher once the ranks are started
// (rank 0 holds its own copy), and at the latest when the attempt ends.
class StoreSocket {
 public:
  StoreSocket() = default;
  ~StoreSocket() { release(); }
  StoreSocket(const StoreSocket&) = delete;
  StoreSocket& operator=(const StoreSocket&) = delete;
  int* out() { return &fd_; }
  int fd() const { return fd_; }
  void release() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

}  // namespace

// A port the kernel chose (bind to port 0) stays in its own range, where any connection made on
// the machine may take it as its local end before rank 0's store binds it: a test run beside
// others once failed so, EADDRINUSE. So the port is drawn at random below that range, where the
// kernel hands out none, and is checked free; the kernel's choice is the fallback.
int find_free_port(const std::string& addr) {
  return bind_free_port(addr, nullptr);
}

std::vector<std::string> strip_launcher_flags(int argc, const char* const* argv) {
  std::vector<std::string> rest;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--nproc") {
      ++a;  // skip its value
      continue;
    }
    if (arg == "--max-restarts") {
      ++a;
      continue;
    }
    if (arg.rfind("--nproc=", 0) == 0 || arg.rfind("--max-restarts=", 0) == 0) continue;
    rest.push_back(arg);
  }
  return rest;
}

namespace {

// The self-pipe and the SIGINT/SIGTERM handlers of one launch: installed by the constructor,
// restored and closed by the destructor, also when launch_local throws.
class SignalForwarding {
 public:
  SignalForwarding() {
    if (pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
      throw Error(ErrorKind::Runtime, std::string("launch: pipe: ") + strerror(errno));
    }
    g_signal_pipe_write = fds_[1];
    struct sigaction action {};
    action.sa_handler = forward_signal_handler;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~SignalForwarding() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    g_signal_pipe_write = -1;
    close(fds_[0]);
    close(fds_[1]);
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

  int read_fd() const { return fds_[0]; }

 private:
  int fds_[2] = {-1, -1};
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

// The environment of rank r: this process's, less the rendezvous variables, plus rank r's.
std::vector<std::string> rank_environment(const LaunchOptions& options, int r, int port,
                                          int world_size, int store_fd) {
  std::vector<std::string> env;
  if (!options.rank_environment) {
    for (char** e = environ; *e; ++e) env.push_back(*e);
    for (const auto& [key, value] : options.env) env.push_back(key + "=" + value);
    return env;
  }
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('='));
    if (key == "MASTER_ADDR" || key == "MASTER_PORT" || key == "RANK" || key == "WORLD_SIZE" ||
        key == "LOCAL_RANK" || key == "LOCAL_WORLD_SIZE" || key == "TORCHELASTIC_RESTART_COUNT" ||
        key == kStoreSocketVariable) {
      continue;
    }
    env.push_back(entry);
  }
  env.push_back("MASTER_ADDR=" + options.master_addr);
  env.push_back("MASTER_PORT=" + std::to_string(port));
  env.push_back("RANK=" + std::to_string(r));
  env.push_back("WORLD_SIZE=" + std::to_string(world_size));
  env.push_back("LOCAL_RANK=" + std::to_string(r));
  env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(options.nproc));
  env.push_back("PIPETRAIN_LAUNCHED=1");
  if (r == 0 && store_fd >= 0)
    env.push_back(std::string(kStoreSocketVariable) + "=" + std::to_string(store_fd));
  for (const auto& [key, value] : options.env) env.push_back(key + "=" + value);
  return env;
}

// One launch: the children, their output and the failure handling ([1]..[4] above). The
// destructor kills and reaps whatever still runs and closes every pipe, so nothing outlives a
// throw (a failed fork, an on_line callback that throws).
class Launch {
 public:
  explicit Launch(const LaunchOptions& options)
      : options_(options), children_(static_cast<std::size_t>(options.nproc)) {
    emit_ =
        options.on_line ? options.on_line : [](int rank, bool is_stderr, const std::string& line) {
          (is_stderr ? std::cerr : std::cout) << "[rank " << rank << "] " << line << std::endl;
        };
  }
  ~Launch() {
    for (auto& child : children_) {
      if (child.pid > 0 && !finished_) killpg(child.pid, SIGKILL);  // ESRCH when none is left
      if (child.running) waitpid(child.pid, nullptr, 0);
      for (Stream* stream : {&child.out, &child.err}) {
        if (stream->fd >= 0) close(stream->fd);
      }
    }
  }
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;

  // store_fd >= 0: rank 0 inherits it, a listening socket on `port` ([5]).
  void spawn_all(int port, int world_size, int store_fd);
  LaunchResult run(int signal_fd);

 private:
  void spawn(int r, const std::vector<char*>& argv, int port, int world_size, int store_fd);
  void drain_lines(int r, bool is_stderr, Stream& stream, bool final);
  void read_output(const std::vector<pollfd>& fds, const std::vector<std::pair<int, bool>>& owners);
  bool reap();  // [2]; true while a child runs
  void report_first_failure(int r);
  void kill_all(int signal_number) {
    signalled_ = true;
    for (auto& child : children_) {
      if (child.running) killpg(child.pid, signal_number);
    }
  }

  const LaunchOptions& options_;
  std::function<void(int, bool, const std::string&)> emit_;
  std::vector<Child> children_;
  LaunchResult result_;
  std::optional<Clock::time_point> term_at_;
  bool finished_ = false;   // run() returned: every child reaped, its group killed
  bool signalled_ = false;  // kill_all() has run: a rank's signal may be the launcher's own
  char buffer_[65536];
};

void Launch::spawn_all(int port, int world_size, int store_fd) {
  // argv and every environment are built before fork: the child only calls exec-safe code.
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(options_.program.c_str()));
  for (const auto& arg : options_.args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  for (int r = 0; r < options_.nproc; ++r) spawn(r, argv, port, world_size, store_fd);
}

void Launch::spawn(int r, const std::vector<char*>& argv, int port, int world_size, int store_fd) {
  const int inherited = r == 0 ? store_fd : -1;
  std::vector<std::string> env = rank_environment(options_, r, port, world_size, inherited);
  std::vector<char*> envp;
  for (auto& entry : env) envp.push_back(entry.data());
  envp.push_back(nullptr);
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    const std::string reason = strerror(errno);
    for (int fd : {out[0], out[1], err[0], err[1]}) {
      if (fd >= 0) close(fd);
    }
    throw Error(ErrorKind::Runtime, "launch: pipe: " + reason);
  }
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const std::string reason = strerror(errno);
    for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
    throw Error(ErrorKind::Runtime, "launch: fork: " + reason);
  }
  if (pid == 0) {
    // Dies with the launcher; and if the launcher died before the request, at once.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher) _exit(128 + SIGKILL);
    setpgid(0, 0);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    if (inherited >= 0) fcntl(inherited, F_SETFD, 0);  // kept across exec, by rank 0 only
    execve(options_.program.c_str(), argv.data(), envp.data());
    const std::string message =
        "launch: cannot execute " + options_.program + ": " + strerror(errno) + "\n";
    [[maybe_unused]] auto ignored = write(STDERR_FILENO, message.data(), message.size());
    _exit(127);
  }
  setpgid(pid, pid);  // also here: no race with an early killpg
  close(out[1]);
  close(err[1]);
  auto& child = children_[static_cast<std::size_t>(r)];
  child.pid = pid;
  child.running = true;
  child.out.fd = out[0];
  child.err.fd = err[0];
  result_.pids.push_back(pid);
}

// Emits the complete lines of `stream` (and the rest too when `final`).
void Launch::drain_lines(int r, bool is_stderr, Stream& stream, bool final) {
  auto& child = children_[static_cast<std::size_t>(r)];
  std::size_t at;
  while ((at = stream.pending.find('\n')) != std::string::npos) {
    std::string line = stream.pending.substr(0, at);
    stream.pending.erase(0, at + 1);
    if (is_stderr) {
      child.stderr_tail.push_back(line);
      if (child.stderr_tail.size() > kTailLines) child.stderr_tail.pop_front();
    }
    emit_(r, is_stderr, line);
  }
  if (final && !stream.pending.empty()) {
    if (is_stderr) child.stderr_tail.push_back(stream.pending);
    emit_(r, is_stderr, stream.pending);
    stream.pending.clear();
  }
}

// [1]
void Launch::read_output(const std::vector<pollfd>& fds,
                         const std::vector<std::pair<int, bool>>& owners) {
  for (std::size_t f = 1; f < fds.size(); ++f) {
    if (!(fds[f].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    const auto [r, is_stderr] = owners[f];
    auto& child = children_[static_cast<std::size_t>(r)];
    Stream& stream = is_stderr ? child.err : child.out;
    const ssize_t n = read(stream.fd, buffer_, sizeof(buffer_));
    if (n > 0) {
      stream.pending.append(buffer_, static_cast<std::size_t>(n));
      drain_lines(r, is_stderr, stream, false);
    } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      drain_lines(r, is_stderr, stream, true);
      close(stream.fd);
      stream.fd = -1;
    }
  }
}

// The first failing rank: its remaining stderr, then a summary with its last error lines.
void Launch::report_first_failure(int r) {
  auto& child = children_[static_cast<std::size_t>(r)];
  result_.first_failed_rank = r;
  while (child.err.fd >= 0) {
    const ssize_t n = read(child.err.fd, buffer_, sizeof(buffer_));
    if (n <= 0) {
      drain_lines(r, true, child.err, true);
      close(child.err.fd);
      child.err.fd = -1;
      break;
    }
    child.err.pending.append(buffer_, static_cast<std::size_t>(n));
    drain_lines(r, true, child.err, false);
  }
  std::cerr << "pipetrain launch: rank " << r << " failed first (" << describe_exit(child.exit_code)
            << ")";
  if (!child.stderr_tail.empty()) {
    std::cerr << "; its last error lines:\n";
    for (const auto& line : child.stderr_tail) std::cerr << "  [rank " << r << "] " << line << "\n";
  } else {
    std::cerr << "\n";
  }
  std::cerr << "pipetrain launch: stopping the other ranks (grace "
            << options_.grace.count() / 1000.0 << " s)" << std::endl;
  if (!term_at_) term_at_ = Clock::now() + options_.grace;
}

bool Launch::reap() {
  bool any_running = false;
  std::vector<RankEnd> ended;
  for (int r = 0; r < options_.nproc; ++r) {
    auto& child = children_[static_cast<std::size_t>(r)];
    if (!child.running) continue;
    int status = 0;
    if (waitpid(child.pid, &status, WNOHANG) != child.pid) {
      any_running = true;
      continue;
    }
    child.running = false;
    child.ended = Clock::now();
    child.exit_code = decode_status(status);
    ended.push_back(RankEnd{r, child.exit_code, WIFSIGNALED(status) != 0});
  }
  const int r = first_failure(ended);
  if (r >= 0 && result_.first_failed_rank < 0) {
    if (options_.rank_environment) {
      report_first_failure(r);
    } else {
      result_.first_failed_rank = r;
      if (!term_at_) term_at_ = Clock::now() + options_.grace;
    }
  }
  // A rank killed by a signal says nothing itself (SIGPIPE, SIGSEGV, the kernel's OOM killer):
  // each one after the first failure is named, unless the signal may be this launcher's own.
  if (options_.rank_environment && !signalled_) {
    for (const RankEnd& end : ended) {
      if (!end.signaled || end.rank == result_.first_failed_rank) continue;
      std::cerr << "pipetrain launch: rank " << end.rank << " ended too, "
                << describe_exit(end.exit_code) << ", a signal this launcher did not send"
                << std::endl;
    }
  }
  return any_running;
}

LaunchResult Launch::run(int signal_fd) {
  std::optional<Clock::time_point> kill_at, drain_until;
  const auto started = Clock::now();
  while (true) {
    std::vector<pollfd> fds{{signal_fd, POLLIN, 0}};
    std::vector<std::pair<int, bool>> owners{{-1, false}};
    for (int r = 0; r < options_.nproc; ++r) {
      const auto& child = children_[static_cast<std::size_t>(r)];
      for (const bool is_stderr : {false, true}) {
        const int fd = is_stderr ? child.err.fd : child.out.fd;
        if (fd < 0) continue;
        fds.push_back({fd, POLLIN, 0});
        owners.emplace_back(r, is_stderr);
      }
    }
    poll(fds.data(), fds.size(), 100);
    read_output(fds, owners);       // [1]
    if (fds[0].revents & POLLIN) {  // [3]
      char signals[16];
      const ssize_t n = read(signal_fd, signals, sizeof(signals));
      for (ssize_t s = 0; s < n; ++s) {
        result_.interrupted = true;
        kill_all(signals[s]);
        if (!term_at_) term_at_ = Clock::now() + options_.grace;
      }
    }
    const bool any_running = reap();  // [2]
    const auto now = Clock::now();
    if (any_running && term_at_ && now >= *term_at_ && !kill_at) {  // [4]
      kill_all(SIGTERM);
      kill_at = now + std::chrono::seconds(2);
    }
    if (any_running && kill_at && now >= *kill_at) kill_all(SIGKILL);
    if (any_running && options_.timeout.count() > 0 && now - started >= options_.timeout) {
      result_.timed_out = true;
      kill_all(SIGKILL);
    }
    if (!any_running) {
      bool open = false;
      for (const auto& child : children_) open = open || child.out.fd >= 0 || child.err.fd >= 0;
      if (!open) break;
      // A grandchild may hold a pipe open: give it a second, then stop reading.
      if (!drain_until) drain_until = now + std::chrono::seconds(1);
      if (now >= *drain_until) break;
    }
  }
  for (int r = 0; r < options_.nproc; ++r) {
    auto& child = children_[static_cast<std::size_t>(r)];
    killpg(child.pid, SIGKILL);  // anything a rank left behind; ESRCH when none
    for (Stream* stream : {&child.out, &child.err}) {
      if (stream->fd >= 0) {
        drain_lines(r, stream == &child.err, *stream, true);
        close(stream->fd);
        stream->fd = -1;
      }
    }
    result_.rank_exit_codes.push_back(child.exit_code);
    result_.rank_ended_at.push_back(child.ended);
  }
  result_.exit_code =
      result_.first_failed_rank >= 0 ? result_.rank_exit_codes[result_.first_failed_rank] : 0;
  finished_ = true;
  return result_;
}

// Whether a failed attempt is worth starting again: not when a person stopped the job, the job's
// time ran out, or the first failure was bad input (exit 2), which the next attempt would meet too.
bool worth_restarting(const LaunchResult& result) {
  return result.exit_code != 0 && !result.interrupted && !result.timed_out && result.exit_code != 2;
}

}  // namespace

int first_failure(const std::vector<RankEnd>& ended) {
  int first = -1;
  bool first_signaled = false;
  for (const RankEnd& end : ended) {
    if (end.exit_code == 0) continue;
    const bool earlier = first < 0 || end.rank < first;
    if (first < 0 || (end.signaled && !first_signaled) ||
        (end.signaled == first_signaled && earlier)) {
      first = end.rank;
      first_signaled = end.signaled;
    }
  }
  return first;
}

LaunchResult launch_local(const LaunchOptions& options) {
  if (options.nproc < 1) {
    throw BadInput("launch: --nproc must be >= 1, got " + std::to_string(options.nproc));
  }
  if (options.max_restarts < 0) {
    throw BadInput("launch: --max-restarts must be >= 0, got " +
                   std::to_string(options.max_restarts));
  }
  const int world_size = options.world_size > 0 ? options.world_size : options.nproc;
  SignalForwarding signals;  // declared first: restored last, after the children are gone
  for (int attempt = 0;; ++attempt) {
    // A fresh port per attempt: the last one's store may still be in TIME_WAIT. A port the
    // launcher picks it also listens on ([5]).
    StoreSocket store_socket;
    const int port = !options.rank_environment ? 0
                     : options.master_port > 0
                         ? options.master_port
                         : bind_free_port(options.master_addr,
                                          options.store_socket ? store_socket.out() : nullptr);
    LaunchOptions this_attempt = options;
    if (options.rank_environment) {
      this_attempt.env.emplace_back("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt));
    }
    LaunchResult result;
    {
      Launch launch(this_attempt);
      launch.spawn_all(port, world_size, store_socket.fd());
      store_socket.release();
      result = launch.run(signals.read_fd());
    }
    result.restarts = attempt;
    if (attempt >= options.max_restarts || !worth_restarting(result)) return result;
    std::cerr << "pipetrain launch: restart " << attempt + 1 << " of " << options.max_restarts
              << ": starting all " << options.nproc << " ranks again (rank "
              << result.first_failed_rank << " " << describe_exit(result.exit_code) << ")"
              << std::endl;
  }
}

std::string self_executable() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0)
    throw Error(ErrorKind::Runtime, std::string("launch: /proc/self/exe: ") + strerror(errno));
  path[n] = '\0';
  std::string executable = path;
  const std::string deleted = " (deleted)";
  if (executable.size() > deleted.size() &&
      executable.compare(executable.size() - deleted.size(), deleted.size(), deleted) == 0) {
    executable.resize(executable.size() - deleted.size());
  }
  return executable;
}

std::vector<std::string> self_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  if (!in) throw Error(ErrorKind::Runtime, "launch: cannot read /proc/self/cmdline");
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> argv;
  std::string current;
  for (char c : all) {
    if (c == '\0') {
      argv.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  std::vector<const char*> pointers;
  for (const auto& a : argv) pointers.push_back(a.c_str());
  return strip_launcher_flags(static_cast<int>(pointers.size()), pointers.data());
}

CollectedRun launch_self_collecting(int nproc, const std::vector<std::string>& args,
                                    const std::string& prefix) {
  LaunchOptions options;
  options.program = self_executable();
  options.args = args;
  options.nproc = nproc;
  options.store_socket = true;
  CollectedRun run;
  run.results.resize(static_cast<std::size_t>(std::max(nproc, 0)));
  std::mutex mutex;  // the launcher reads every rank's output on its own thread
  options.on_line = [&](int rank, bool is_stderr, const std::string& line) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!is_stderr && line.rfind(prefix, 0) == 0 && rank >= 0 && rank < nproc) {
      run.results[static_cast<std::size_t>(rank)] = line.substr(prefix.size());
    } else {
      std::cerr << "[rank " << rank << "] " << line << "\n";
    }
  };
  run.launched = launch_local(options);
  return run;
}

int launch_self(int nproc, const std::vector<std::string>& args, std::chrono::milliseconds grace,
                int max_restarts) {
  LaunchOptions options;
  options.program = self_executable();
  options.args = args;
  options.nproc = nproc;
  options.grace = grace;
  options.max_restarts = max_restarts;
  options.store_socket = true;
  return launch_local(options).exit_code;
}

}  // namespace pipetrain
