// C10dWorld: rendezvous, abort channel, heartbeat watchdog (C10dGroup, its collectives:
// c10d_group.cpp).
//
// Rendezvous, on every rank:
//   [1] connect to the TCPStore at MASTER_ADDR:MASTER_PORT (rank 0 starts the server); the client
//       retries until the timeout, so ranks may start in any order. With listen_socket the server
//       takes over a socket the launcher already listens on, and no client is ever refused.
//   [2] compareSet("pipetrain/rank/<r>", host:pid): a second process with the same RANK sees the
//       first one's value and fails naming both.
//   [3] compareSet("pipetrain/world_size", WORLD_SIZE): the first rank's value wins; a rank with
//       another value fails naming both.
//   [4] add("pipetrain/arrived", 1), then poll it until it reaches WORLD_SIZE. On timeout the
//       ranks whose key [2] is absent are the missing ones, and the error lists them.
//       With NCCL, each rank first sets "pipetrain/gpu/<r>" to its "host cuda:i"; once all have
//       arrived every rank reads them all and, when two ranks share a GPU (NCCL refuses that
//       when its first communicator is made, as a runtime error of the first send or receive),
//       all of them fail with the same BadInput.
//   [5] the world process group over PrefixStore("pipetrain/group/world").
//
// Abort channel: key "pipetrain/abort" holds the first reason published (compareSet, first wins).
// The watchdog thread of every rank polls it every 100 ms, bumps its own heartbeat counter every
// second and checks the others'. A peer whose heartbeat stood still for the timeout (SIGKILL,
// SIGSTOP, a hung machine), or a lost store (rank 0 is gone), is turned into an abort too.
//   [6] A store that does not answer (rank 0's host cut off: no reset, the read blocks) is seen
//       by the store monitor thread: a watchdog store call longer than the timeout aborts.
//
//   [7] SIGPIPE is ignored from connect() on, where the process has left it at its default: Gloo
//       writes its sockets with writev(), and a write to a peer that was killed (its connection
//       reset) would otherwise end this process at once, saying nothing, instead of failing the
//       write with EPIPE and the collective with an error naming the peer. Python, which torch's
//       own distributed code runs under, ignores SIGPIPE from its start. A handler the program
//       installed is kept.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "c10d_internal.h"
#include "pipetrain/base/check.h"
#include "pipetrain/base/message_of.h"

namespace pipetrain {

namespace {

using Clock = std::chrono::steady_clock;

const char* const kArrivedKey = "pipetrain/arrived";
const char* const kWorldSizeKey = "pipetrain/world_size";
const char* const kAbortKey = "pipetrain/abort";
const char* const kFinishedKey = "pipetrain/finished";
const char* const kAbortSeenKey = "pipetrain/abort_seen";

std::string rank_key(int r) {
  return "pipetrain/rank/" + std::to_string(r);
}
std::string gpu_key(int r) {
  return "pipetrain/gpu/" + std::to_string(r);
}
std::string heartbeat_key(int r) {
  return "pipetrain/heartbeat/" + std::to_string(r);
}
std::string finished_key(int r) {
  return "pipetrain/finished/" + std::to_string(r);
}

std::vector<uint8_t> to_bytes(const std::string& s) {
  return {s.begin(), s.end()};
}
std::string from_bytes(const std::vector<uint8_t>& v) {
  return {v.begin(), v.end()};
}

std::string host_name() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return host;
}

std::string host_and_pid() {
  return host_name() + ":" + std::to_string(getpid());
}

double seconds(std::chrono::milliseconds ms) {
  return static_cast<double>(ms.count()) / 1000.0;
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

}  // namespace

// ---- backends ---------------------------------------------------------------------------------

std::string comm_backend_name(CommBackend backend) {
  switch (backend) {
    case CommBackend::kGloo:
      return "gloo";
    case CommBackend::kNccl:
      return "nccl";
    case CommBackend::kMpi:
      return "mpi";
  }
  return "?";
}

CommBackend parse_comm_backend(const std::string& name) {
  if (name == "gloo") return CommBackend::kGloo;
  if (name == "nccl") return CommBackend::kNccl;
  if (name == "mpi") return CommBackend::kMpi;
  throw BadInput(c10::str("unknown communication backend '", name, "': use gloo, nccl or mpi"));
}

CommBackend comm_backend_for_device(const torch::Device& device) {
  return device.is_cuda() ? CommBackend::kNccl : CommBackend::kGloo;
}

bool comm_backend_available(CommBackend backend) {
  return comm_backend_unavailable_reason(backend).empty();
}

std::string comm_backend_unavailable_reason(CommBackend backend) {
  switch (backend) {
    case CommBackend::kGloo:
      return "";
    case CommBackend::kNccl:
      return detail::nccl_unavailable_reason();
    case CommBackend::kMpi:
      // ProcessGroupMPI exists only in a LibTorch built with USE_MPI; pipetrain does not link it
      // (PyPI's LibTorch has none). Use gloo under mpirun: docs/DISTRIBUTED.md.
      return "this LibTorch was built without MPI";
  }
  return "unknown backend";
}

namespace detail {

c10::intrusive_ptr<C10dBackendBase> make_gloo_group(const c10::intrusive_ptr<::c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout,
                                                    const std::string& master_addr) {
  auto options = ::c10d::ProcessGroupGloo::Options::create(timeout);
  // GLOO_SOCKET_IFNAME picks the interface as in PyTorch; a loopback master means a single-machine
  // job, which binds loopback; otherwise the address this host's name resolves to.
  if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME"); interface && *interface) {
    options->devices.push_back(::c10d::ProcessGroupGloo::createDeviceForInterface(interface));
  } else if (is_loopback(master_addr)) {
    options->devices.push_back(::c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    options->devices.push_back(::c10d::ProcessGroupGloo::createDefaultDevice());
  }
  return c10::make_intrusive<::c10d::ProcessGroupGloo>(store, rank, size, options);
}

bool wait_work(const c10::intrusive_ptr<C10dWork>& work, const std::string& what) {
  try {
    return work->wait();
  } catch (const std::exception& e) {
    const std::string failure = message_of(e);
    // Gloo words an expired wait "Timed out waiting ...ms for ... operation to complete".
    throw_error(failure.find("imed out") != std::string::npos ? ErrorKind::Timeout
                                                              : ErrorKind::TransportFailure,
                c10::str(what, " failed: ", failure));
  }
}

}  // namespace detail

// ---- C10dWorld --------------------------------------------------------------------------------

// Marks the watchdog as inside a store call for its lifetime, for the store monitor [6].
class StoreCall {
 public:
  explicit StoreCall(std::atomic<int64_t>& since) : since_(since) {
    since_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
                 .count();
  }
  ~StoreCall() { since_ = 0; }
  StoreCall(const StoreCall&) = delete;
  StoreCall& operator=(const StoreCall&) = delete;

 private:
  std::atomic<int64_t>& since_;
};

struct C10dWorld::Impl {
  RendezvousOptions options;
  c10::intrusive_ptr<::c10d::Store> store;        // used by the calling threads
  c10::intrusive_ptr<::c10d::Store> watch_store;  // the watchdog's own connection
  std::shared_ptr<C10dGroup> world;
  // TORCH_DISTRIBUTED_DEBUG=DETAIL: every group checks its collectives' order
  // (C10dGroup::Impl::check_collective).
  bool check_collectives = false;

  mutable std::mutex mutex;  // guards everything below
  std::condition_variable wake;
  bool stop = false;
  bool finalized = false;
  std::optional<std::string> abort_reason;
  bool abort_timed_out = false;  // the watchdog aborted: a peer sent no heartbeat for the timeout
  std::map<int, std::function<void(const std::string&)>> listeners;
  int next_listener = 0;
  // The thread of fire() while it calls the listeners (outside the lock); none otherwise.
  // remove_abort_listener waits for those calls (the caller frees what its listener reads next),
  // unless it runs inside one of them.
  std::thread::id listener_caller;
  std::thread watchdog;
  // [6] The store monitor: when the watchdog's current store call began (steady clock, ns; 0:
  // none), and whether it outlived the timeout (the watchdog thread is then left blocked in a
  // socket read, and this state is leaked with it: ~C10dWorld).
  std::thread store_monitor;
  std::atomic<int64_t> store_call_since{0};
  std::atomic<bool> watchdog_stuck{false};
  // Shared with the thread that publishes an abort (C10dWorld::abort), which may outlive this.
  std::shared_ptr<std::atomic<bool>> abort_counted = std::make_shared<std::atomic<bool>>(false);

  // Once per process: tells rank 0 (linger_until_abort_seen) this rank knows of the abort.
  void count_abort_seen() {
    if (!abort_counted->exchange(true)) watch_store->add(kAbortSeenKey, 1);
  }

  std::shared_ptr<C10dGroup> make_group(const std::string& name, std::vector<int> ranks);
  // Every group's traffic counts, kept after the group is gone (C10dWorld::traffic).
  std::vector<std::shared_ptr<C10dGroup::Impl::Traffic>> traffic;
  void fire(const std::string& reason, bool timed_out = false);
  void watch();
  void monitor_store();
  void stop_watchdog();
};

std::shared_ptr<C10dGroup> C10dWorld::Impl::make_group(const std::string& name,
                                                       std::vector<int> ranks) {
  auto group = std::make_shared<C10dGroup::Impl>();
  group->name = name;
  group->ranks = std::move(ranks);
  group->timeout = options.timeout;
  group->ranks_per_host = options.ranks_per_host;
  group->group_rank = group->group_rank_of(options.rank);
  PIPETRAIN_CHECK_INPUT(group->group_rank >= 0, "rank ", options.rank, " creates group '", name,
                        "' but is not one of its ranks; only members create a group");
  auto prefixed = c10::make_intrusive<::c10d::PrefixStore>("pipetrain/group/" + name, store);
  const int size = static_cast<int>(group->ranks.size());
  try {
    switch (options.backend) {
      case CommBackend::kGloo:
        group->backend = detail::make_gloo_group(prefixed, group->group_rank, size, options.timeout,
                                                 options.master_addr);
        break;
      case CommBackend::kNccl:
        group->backend =
            detail::make_nccl_group(prefixed, group->group_rank, size, options.timeout);
        group->cpu_backend =
            detail::make_gloo_group(c10::make_intrusive<::c10d::PrefixStore>("cpu", prefixed),
                                    group->group_rank, size, options.timeout, options.master_addr);
        break;
      case CommBackend::kMpi:
        throw BadInput(
            "backend mpi: this LibTorch is built without MPI (ProcessGroupMPI); "
            "use --backend gloo, which also runs under mpirun (docs/DISTRIBUTED.md)");
    }
    if (check_collectives && size > 1) {
      group->check_backend =
          detail::make_gloo_group(c10::make_intrusive<::c10d::PrefixStore>("check", prefixed),
                                  group->group_rank, size, options.timeout, options.master_addr);
    }
  } catch (const Error&) {
    throw;  // already says what is wrong (a backend this build lacks)
  } catch (const std::exception& e) {
    // Creating a group connects to every member: a member that does not answer is a Timeout.
    const std::string failure = message_of(e);
    throw_error(failure.find("imed out") != std::string::npos ? ErrorKind::Timeout
                                                              : ErrorKind::TransportFailure,
                c10::str("creating ", comm_backend_name(options.backend), " group '", name,
                         "' failed: ", failure),
                ErrorSite{options.rank, -1, "", -1});
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    traffic.push_back(group->sent);
  }
  return std::make_shared<C10dGroup>(std::move(group));
}

void C10dWorld::Impl::fire(const std::string& reason, bool timed_out) {
  std::vector<std::function<void(const std::string&)>> to_call;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (abort_reason) return;  // so at most one fire() calls the listeners
    abort_reason = reason;
    abort_timed_out = timed_out;
    for (auto& [id, listener] : listeners) to_call.push_back(listener);
    listener_caller = std::this_thread::get_id();
  }
  wake.notify_all();
  struct Done {  // also when a listener throws, though they must not
    Impl& impl;
    ~Done() {
      {
        std::lock_guard<std::mutex> lock(impl.mutex);
        impl.listener_caller = std::thread::id();
      }
      impl.wake.notify_all();
    }
  } done{*this};
  for (auto& listener : to_call) listener(reason);
}

void C10dWorld::Impl::watch() {
  const int world_size = options.world_size;
  std::vector<int64_t> last_beat(world_size, -1);
  std::vector<Clock::time_point> last_change(world_size, Clock::now());
  auto next_beat = Clock::now();
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex);
      wake.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop; });
      if (stop || abort_reason) return;
    }
    try {
      StoreCall call(store_call_since);
      if (watch_store->check({kAbortKey})) {
        const std::string reason = from_bytes(watch_store->get(kAbortKey));
        count_abort_seen();
        fire(reason);
        return;
      }
      const auto now = Clock::now();
      if (now < next_beat) continue;
      next_beat = now + std::chrono::seconds(1);
      watch_store->add(heartbeat_key(options.rank), 1);
      for (int q = 0; q < world_size; ++q) {
        if (q == options.rank) continue;
        const int64_t beat = watch_store->add(heartbeat_key(q), 0);
        if (beat != last_beat[q]) {
          last_beat[q] = beat;
          last_change[q] = now;
        } else if (now - last_change[q] > options.timeout &&
                   !watch_store->check({finished_key(q)})) {
          std::ostringstream reason;
          reason << "rank " << options.rank << ": rank " << q << " sent no heartbeat for "
                 << seconds(options.timeout)
                 << " s: it was killed or hangs (see its log); raise --timeout if it is only slow";
          try {
            watch_store->compareSet(kAbortKey, {}, to_bytes(reason.str()));
            count_abort_seen();
          } catch (...) {
          }
          fire(reason.str(), /*timed_out=*/true);
          return;
        }
      }
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (stop || finalized) return;
      }
      std::ostringstream reason;
      reason << "rank " << options.rank << ": lost the rendezvous store at " << options.master_addr
             << ":" << options.master_port
             << " (hosted by rank 0): rank 0 has exited or was killed (" << message_of(e) << ")";
      fire(reason.str());
      return;
    }
  }
}

// [6] A store read does not time out: when rank 0's host is cut off, the watchdog's call blocks
// until the kernel gives the connection up (many minutes) and the watchdog sees nothing. This
// thread aborts when one call has lasted longer than the timeout.
void C10dWorld::Impl::monitor_store() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex);
      wake.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop; });
      if (stop || abort_reason) return;
    }
    const int64_t since = store_call_since.load();
    if (since == 0) continue;
    const auto waited = Clock::now().time_since_epoch() - std::chrono::nanoseconds(since);
    if (waited <= options.timeout) continue;
    watchdog_stuck = true;
    std::ostringstream reason;
    reason << "rank " << options.rank << ": the rendezvous store at " << options.master_addr << ":"
           << options.master_port << " (hosted by rank 0) has not answered for "
           << seconds(options.timeout)
           << " s: rank 0's host is unreachable from here (a network cut) or stalled";
    fire(reason.str(), /*timed_out=*/true);
    return;
  }
}

void C10dWorld::Impl::stop_watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    stop = true;
  }
  wake.notify_all();
  if (store_monitor.joinable()) store_monitor.join();
  if (watchdog.joinable()) {
    if (watchdog_stuck) {
      watchdog.detach();  // blocked in a read of a store that does not answer: see ~C10dWorld
    } else {
      watchdog.join();
    }
  }
}

C10dWorld::C10dWorld(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

C10dWorld::~C10dWorld() {
  impl_->stop_watchdog();
  if (impl_->watchdog_stuck) {
    // The detached watchdog still reads this state when its read finally fails; it is leaked
    // rather than freed under it (a failure path: the process is about to exit).
    (void)impl_.release();
    return;
  }
  impl_->world.reset();
}

namespace {

// [7] SIG_IGN where SIGPIPE has its default action; a program's own handler stays.
void ignore_default_sigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) != 0) return;
  if ((current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_DFL) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, nullptr);
  }
}

void check_rendezvous_options(const RendezvousOptions& options) {
  PIPETRAIN_CHECK_INPUT(!options.master_addr.empty(),
                        "MASTER_ADDR is empty: set it to rank 0's host");
  PIPETRAIN_CHECK_INPUT(options.master_port > 0 && options.master_port < 65536,
                        "MASTER_PORT=", options.master_port, " is not a TCP port (1..65535)");
  PIPETRAIN_CHECK_INPUT(options.world_size >= 1, "WORLD_SIZE=", options.world_size,
                        " must be >= 1");
  PIPETRAIN_CHECK_INPUT(options.rank >= 0 && options.rank < options.world_size,
                        "RANK=", options.rank,
                        " is outside 0..WORLD_SIZE-1 (WORLD_SIZE=", options.world_size, ")");
  PIPETRAIN_CHECK_INPUT(options.timeout.count() > 0, "the rendezvous timeout must be positive");
  PIPETRAIN_CHECK_INPUT(options.attempt >= 0, "the attempt must be >= 0, got ", options.attempt);
  PIPETRAIN_CHECK_INPUT(
      comm_backend_available(options.backend) || options.backend == CommBackend::kMpi, "rank ",
      options.rank, ": backend ", comm_backend_name(options.backend),
      " is not available: ", comm_backend_unavailable_reason(options.backend), "; use gloo");
}

std::string address_of(const RendezvousOptions& options) {
  return options.master_addr + ":" + std::to_string(options.master_port);
}

// [1] Rank 0's store is the server; every other connection is a client.
c10::intrusive_ptr<::c10d::Store> open_store(const RendezvousOptions& options, bool server) {
  ::c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(options.master_port);
  store_options.isServer = server;
  store_options.numWorkers = c10::nullopt;
  store_options.waitWorkers = false;
  store_options.timeout = options.timeout;
  if (server && options.listen_socket >= 0) store_options.masterListenFd = options.listen_socket;
  try {
    return c10::make_intrusive<::c10d::TCPStore>(options.master_addr, store_options);
  } catch (const std::exception& e) {
    // Rank 0 cannot listen on MASTER_PORT: the port is the caller's choice. Another rank waited
    // the whole timeout for rank 0's store.
    throw_error(server ? ErrorKind::BadInput : ErrorKind::Timeout,
                c10::str(server ? "could not start the rendezvous store on "
                                : "could not reach the rendezvous store at ",
                         address_of(options), " within ", seconds(options.timeout), " s",
                         server ? " (is MASTER_PORT in use?)"
                                : " (has rank 0 started? do all ranks use the same MASTER_ADDR "
                                  "and MASTER_PORT?)",
                         ": ", message_of(e)),
                ErrorSite{options.rank, -1, "", -1});
  }
}

// [1] Under torchrun the store is its agent's, and it outlives the ranks: the keys of a restarted
// attempt go under a prefix of their own, or the new ranks would meet the old ones' claims.
c10::intrusive_ptr<::c10d::Store> within_attempt(c10::intrusive_ptr<::c10d::Store> store,
                                                 const RendezvousOptions& options) {
  if (options.attempt == 0) return store;
  return c10::make_intrusive<::c10d::PrefixStore>(
      "pipetrain/attempt/" + std::to_string(options.attempt), std::move(store));
}

// [2] This process holds its RANK alone; [3] every rank agrees on WORLD_SIZE.
void claim_rank(::c10d::Store& store, const RendezvousOptions& options) {
  const int r = options.rank;
  const std::string me = host_and_pid();
  const std::string holder = from_bytes(store.compareSet(rank_key(r), {}, to_bytes(me)));
  PIPETRAIN_CHECK_INPUT(holder == me, "RANK=", r, " was started twice (", holder, " and ", me,
                        "): give every process its own RANK in 0..WORLD_SIZE-1");
  const std::string size_text = std::to_string(options.world_size);
  const std::string agreed = from_bytes(store.compareSet(kWorldSizeKey, {}, to_bytes(size_text)));
  PIPETRAIN_CHECK_INPUT(agreed == size_text, "rank ", r, " has WORLD_SIZE=", size_text,
                        " but another rank registered WORLD_SIZE=", agreed,
                        ": start every rank with the same WORLD_SIZE");
}

// [4] Waits until WORLD_SIZE processes have arrived; on timeout names the missing ranks.
void wait_for_every_rank(::c10d::Store& store, const RendezvousOptions& options) {
  store.add(kArrivedKey, 1);
  const auto deadline = Clock::now() + options.timeout;
  const ErrorSite site{options.rank, -1, "", -1};
  while (true) {
    const int64_t arrived = store.add(kArrivedKey, 0);
    PIPETRAIN_CHECK_AT(arrived <= options.world_size, BadInput, site, arrived,
                       " processes joined the rendezvous at ", address_of(options),
                       " but WORLD_SIZE=", options.world_size,
                       ": another job uses the same MASTER_PORT, or too many "
                       "processes were started");
    if (arrived == options.world_size) return;
    if (Clock::now() > deadline) {
      std::ostringstream missing;
      int count = 0;
      for (int q = 0; q < options.world_size; ++q) {
        if (!store.check({rank_key(q)})) missing << (count++ ? ", " : "") << q;
      }
      throw Timeout(c10::str("rendezvous at ", address_of(options), " timed out after ",
                             seconds(options.timeout), " s: WORLD_SIZE=", options.world_size,
                             " but only ", arrived, " ranks arrived; missing ranks: ",
                             missing.str(), ". Start every rank 0..", options.world_size - 1,
                             " with the same MASTER_ADDR/MASTER_PORT, or fix WORLD_SIZE"),
                    site);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

std::string gpu_placement(const std::string& host, int cuda_device) {
  return host + " cuda:" + std::to_string(cuda_device);
}

std::string shared_gpu_conflict(const std::vector<std::string>& placements) {
  for (std::size_t a = 0; a < placements.size(); ++a) {
    for (std::size_t b = a + 1; b < placements.size(); ++b) {
      if (placements[a] != placements[b]) continue;
      const auto space = placements[a].rfind(' ');
      return c10::str("NCCL cannot run two ranks on one GPU: ranks ", a, " and ", b, " both use ",
                      placements[a].substr(space + 1), " on host ", placements[a].substr(0, space),
                      ": give each rank its own GPU (cuda:LOCAL_RANK), or share one over the gloo "
                      "backend");
    }
  }
  return "";
}

std::shared_ptr<C10dWorld> C10dWorld::connect(const RendezvousOptions& options) {
  check_rendezvous_options(options);
  ignore_default_sigpipe();  // [7]
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->store = within_attempt(open_store(options, options.rank == 0), options);  // [1]
  impl->watch_store = within_attempt(open_store(options, false), options);
  claim_rank(*impl->store, options);  // [2] [3]
  const bool nccl = options.backend == CommBackend::kNccl;
  if (nccl) {
    impl->store->set(gpu_key(options.rank),
                     to_bytes(gpu_placement(host_name(), std::max(options.cuda_device, 0))));
  }
  wait_for_every_rank(*impl->store, options);  // [4]
  if (nccl) {
    std::vector<std::string> placements;
    for (int q = 0; q < options.world_size; ++q) {
      placements.push_back(from_bytes(impl->store->get(gpu_key(q))));
    }
    const std::string conflict = shared_gpu_conflict(placements);
    PIPETRAIN_CHECK_AT(conflict.empty(), BadInput, (ErrorSite{options.rank, -1, "", -1}), conflict);
  }
  // [5]
  std::vector<int> all(options.world_size);
  for (int q = 0; q < options.world_size; ++q) all[q] = q;
  const char* debug = std::getenv("TORCH_DISTRIBUTED_DEBUG");
  impl->check_collectives = debug != nullptr && std::string(debug) == "DETAIL";
  impl->world = impl->make_group("world", all);

  Impl* raw = impl.get();
  impl->watchdog = std::thread([raw] { raw->watch(); });
  impl->store_monitor = std::thread([raw] { raw->monitor_store(); });
  return std::shared_ptr<C10dWorld>(new C10dWorld(std::move(impl)));
}

int C10dWorld::rank() const {
  return impl_->options.rank;
}
int C10dWorld::world_size() const {
  return impl_->options.world_size;
}
std::chrono::milliseconds C10dWorld::timeout() const {
  return impl_->options.timeout;
}
CommBackend C10dWorld::backend() const {
  return impl_->options.backend;
}
bool C10dWorld::checks_collectives() const {
  return impl_->check_collectives;
}
const RendezvousOptions& C10dWorld::options() const {
  return impl_->options;
}
std::shared_ptr<C10dGroup> C10dWorld::world_group() {
  return impl_->world;
}

CollectiveTraffic C10dWorld::traffic(TrafficKind collective) const {
  const auto k = static_cast<std::size_t>(collective);
  CollectiveTraffic sum;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (const auto& group : impl_->traffic) {
    sum.within_host += group->within[k].load();
    sum.between_hosts += group->between[k].load();
  }
  return sum;
}

std::map<std::string, CollectiveTraffic> C10dWorld::labelled_traffic() const {
  std::map<std::string, CollectiveTraffic> sum;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (const auto& group : impl_->traffic) {
    std::lock_guard<std::mutex> labelled(group->labelled_mutex);
    for (const auto& [label, t] : group->labelled) {
      sum[label].within_host += t.within_host;
      sum[label].between_hosts += t.between_hosts;
    }
  }
  return sum;
}

std::shared_ptr<C10dGroup> C10dWorld::new_group(const std::string& name, std::vector<int> ranks) {
  PIPETRAIN_CHECK_INPUT(!ranks.empty(), "group '", name, "' has no ranks");
  std::sort(ranks.begin(), ranks.end());
  PIPETRAIN_CHECK_INPUT(std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end(), "group '",
                        name, "' lists a rank twice");
  for (int q : ranks) {
    PIPETRAIN_CHECK_INPUT(q >= 0 && q < world_size(), "group '", name, "' names rank ", q,
                          " outside the world 0..", world_size() - 1);
  }
  PIPETRAIN_CHECK_INPUT(name != "world", "the group name 'world' is reserved");
  return impl_->make_group(name, std::move(ranks));
}

void C10dWorld::abort(const std::string& reason) {
  const std::string full = "rank " + std::to_string(rank()) + ": " + reason;
  // First reason wins: a rank that aborts because of another's abort keeps the original. The
  // store may not answer (rank 0's host cut off, [6]): it is asked on a thread of its own, given
  // a few seconds, and the local abort below wakes this rank either way.
  struct Answer {
    std::mutex mutex;
    std::condition_variable done;
    std::optional<std::string> published;
  };
  auto answer = std::make_shared<Answer>();
  std::thread([store = impl_->watch_store, counted = impl_->abort_counted, answer, full] {
    std::string published = full;
    try {
      auto current = store->compareSet(kAbortKey, {}, to_bytes(full));
      if (!current.empty()) published = from_bytes(current);
      if (!counted->exchange(true)) store->add(kAbortSeenKey, 1);
    } catch (...) {
      // The store is gone (rank 0 died).
    }
    std::lock_guard<std::mutex> lock(answer->mutex);
    answer->published = published;
    answer->done.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(answer->mutex);
  answer->done.wait_for(lock, std::min(timeout(), std::chrono::milliseconds(3000)),
                        [&] { return answer->published.has_value(); });
  const std::string published = answer->published.value_or(full);
  lock.unlock();
  impl_->fire(published);
}

std::optional<std::string> C10dWorld::abort_reason() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->abort_reason;
}

bool C10dWorld::abort_was_timeout() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->abort_timed_out;
}

std::optional<std::string> C10dWorld::await_abort_reason(std::chrono::milliseconds max) {
  const auto deadline = Clock::now() + max;
  while (true) {
    if (auto known = abort_reason()) return known;
    try {
      if (impl_->watch_store->check({kAbortKey})) {
        return from_bytes(impl_->watch_store->get(kAbortKey));
      }
    } catch (...) {
      return std::nullopt;  // the store is gone as well
    }
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int C10dWorld::add_abort_listener(std::function<void(const std::string&)> listener) {
  std::optional<std::string> already;
  int id = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    id = impl_->next_listener++;
    impl_->listeners[id] = listener;
    already = impl_->abort_reason;
  }
  if (already) listener(*already);
  return id;
}

void C10dWorld::remove_abort_listener(int id) {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  impl_->listeners.erase(id);
  // fire() may have taken the listener before the erase and still be running it.
  impl_->wake.wait(lock, [&] {
    return impl_->listener_caller == std::thread::id() ||
           impl_->listener_caller == std::this_thread::get_id();
  });
}

void C10dWorld::linger_until_abort_seen(std::chrono::milliseconds max) {
  if (rank() != 0) return;
  const auto deadline = Clock::now() + max;
  try {
    while (impl_->watch_store->add(kAbortSeenKey, 0) < world_size() && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (...) {
  }
}

void C10dWorld::finalize() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->finalized) return;
    impl_->finalized = true;
  }
  try {
    impl_->store->set(finished_key(rank()), to_bytes("1"));
    impl_->store->add(kFinishedKey, 1);
    if (rank() == 0) {
      const auto deadline = Clock::now() + timeout();
      while (impl_->store->add(kFinishedKey, 0) < world_size() && !abort_reason() &&
             Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  } catch (...) {
    // Shutting down: a store error only means rank 0 has already gone.
  }
  impl_->stop_watchdog();
}

}  // namespace pipetrain
