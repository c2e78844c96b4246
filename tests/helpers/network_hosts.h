// Several hosts on one machine for the multi-host tests: N network namespaces, each with one
// interface (eth0, 10.77.0.(i+1)/24) plugged by a veth cable into a bridge that lives in a
// namespace of its own (the switch). The tests start one rank in each host and cut cables,
// take hosts off the network or stop processes there.
//
// Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2; `unavailable()` says what is missing so
// a test can skip with that message. Names carry this process's pid and a counter, so tests that
// run at the same time do not meet; the destructor deletes every namespace (and with them the
// cables and the bridge). Processes started in a host must be gone before that (the tests reap
// their launches first).
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace pipetrain::testing {

class NetworkHosts {
 public:
  // Why hosts cannot be made here, or nullopt when they can (checked once by making and removing
  // one namespace with a bridge).
  static std::optional<std::string> unavailable() {
    if (geteuid() != 0) return "network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN)";
    if (std::system("ip -V >/dev/null 2>&1") != 0) return "iproute2's `ip` is not installed";
    const std::string probe = "ptprobe" + std::to_string(getpid());
    const bool ok = std::system(("ip netns add " + probe + " >/dev/null 2>&1 && ip -n " + probe +
                                 " link add br0 type bridge >/dev/null 2>&1")
                                    .c_str()) == 0;
    // Best effort: a probe namespace that fails to go is named by the pid and harmless.
    const int removed = std::system(("ip netns del " + probe + " >/dev/null 2>&1").c_str());
    (void)removed;
    if (!ok) return "this machine does not allow `ip netns add` and a bridge in it";
    return std::nullopt;
  }

  // Whether `tc qdisc ... netem` (delay, loss) works here: it needs the kernel's sch_netem.
  static std::optional<std::string> netem_unavailable(const NetworkHosts& hosts) {
    if (hosts.run(0, "tc qdisc add dev eth0 root netem delay 1ms") != 0) {
      return "tc netem is not available here (the kernel has no sch_netem module)";
    }
    hosts.run(0, "tc qdisc del dev eth0 root");
    return std::nullopt;
  }

  explicit NetworkHosts(int count) {
    static std::atomic<int> counter{0};
    prefix_ = "pt" + std::to_string(getpid()) + "n" + std::to_string(counter++);
    must(sh("ip netns add " + switch_name()));
    must(sh("ip -n " + switch_name() + " link add br0 type bridge && ip -n " + switch_name() +
            " link set br0 up"));
    for (int i = 0; i < count; ++i) {
      must(sh("ip netns add " + host(i)));
      hosts_.push_back(host(i));
      must(sh("ip -n " + switch_name() + " link add port" + std::to_string(i) +
              " type veth peer name eth0 netns " + host(i)));
      must(sh("ip -n " + switch_name() + " link set port" + std::to_string(i) + " master br0 up"));
      must(sh("ip -n " + host(i) + " addr add " + address(i) + "/24 dev eth0 && ip -n " + host(i) +
              " link set eth0 up && ip -n " + host(i) + " link set lo up"));
    }
  }
  ~NetworkHosts() {
    for (const std::string& name : hosts_) sh("ip netns del " + name);
    sh("ip netns del " + switch_name());
  }
  NetworkHosts(const NetworkHosts&) = delete;
  NetworkHosts& operator=(const NetworkHosts&) = delete;

  int count() const { return static_cast<int>(hosts_.size()); }
  std::string host(int i) const { return prefix_ + "h" + std::to_string(i); }
  static std::string address(int i) { return "10.77.0." + std::to_string(i + 1); }
  // A shell prefix that runs the rest of the line inside host i.
  std::string in_host(int i) const { return "ip netns exec " + host(i) + " "; }
  // The "$RANK"-th host: for a command that many ranks run, each in its own host.
  std::string in_host_of_rank() const { return "ip netns exec " + prefix_ + "h$RANK "; }

  // Unplugs (or plugs back) host i's cable at the switch: its packets are lost, no reset is sent.
  void set_cable(int i, bool plugged) const {
    sh("ip -n " + switch_name() + " link set port" + std::to_string(i) +
       (plugged ? " up" : " down"));
  }
  // Runs a shell line inside host i; returns its exit status.
  int run(int i, const std::string& line) const {
    return sh(in_host(i) + "sh -c '" + line + "' >/dev/null 2>&1");
  }

 private:
  std::string switch_name() const { return prefix_ + "sw"; }
  static int sh(const std::string& line) { return std::system((line + " 2>/dev/null").c_str()); }
  void must(int status) const {
    if (status != 0) throw std::runtime_error("NetworkHosts: setting up " + prefix_ + " failed");
  }

  std::string prefix_;
  std::vector<std::string> hosts_;
};

}  // namespace pipetrain::testing
