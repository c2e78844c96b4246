// Whether a run fits this machine's memory (pipetrain/train/memory_fit.h).
#include "pipetrain/train/memory_fit.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>
#include <string>

namespace pipetrain::train {
namespace {

// A "Name:   123 kB" line of a /proc status-like file, in bytes; -1 when absent.
std::int64_t kib_field(const std::string& path, const std::string& name) {
  std::ifstream file(path);
  std::string line;
  while (std::getline(file, line)) {
    if (line.rfind(name + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(name.size() + 1));
    std::int64_t kib = -1;
    fields >> kib;
    return kib < 0 ? -1 : kib * 1024;
  }
  return -1;
}

// A cgroup v2 file holding one number (or "max"); -1 when absent or unlimited.
std::int64_t cgroup_number(const std::string& path) {
  std::ifstream file(path);
  std::string text;
  if (!(file >> text) || text == "max") return -1;
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

AvailableMemory host_available_memory() {
  AvailableMemory available{0, "unknown"};
  const std::int64_t mem = kib_field("/proc/meminfo", "MemAvailable");
  if (mem >= 0) available = {mem, "MemAvailable"};
  const std::int64_t limit = cgroup_number("/sys/fs/cgroup/memory.max");
  const std::int64_t used = cgroup_number("/sys/fs/cgroup/memory.current");
  if (limit >= 0 && used >= 0 && (available.bytes == 0 || limit - used < available.bytes)) {
    available = {std::max<std::int64_t>(limit - used, 0), "cgroup memory.max less memory.current"};
  }
  return available;
}

std::int64_t resident_bytes() {
  return std::max<std::int64_t>(kib_field("/proc/self/status", "VmRSS"), 0);
}

namespace {
// The peak before the last reset_peak_resident (VmHWM itself then starts again from VmRSS).
std::atomic<std::int64_t> peak_before_reset{0};
}  // namespace

std::int64_t peak_resident_bytes() {
  return std::max<std::int64_t>(
      {kib_field("/proc/self/status", "VmHWM"), peak_before_reset.load(), 0});
}

std::int64_t reset_peak_resident() {
  const std::int64_t peak = peak_resident_bytes();
  std::int64_t seen = peak_before_reset.load();
  while (peak > seen && !peak_before_reset.compare_exchange_weak(seen, peak)) {
  }
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return clear.good() ? resident_bytes() : -1;
}

std::int64_t window_peak_resident_bytes() {
  return std::max<std::int64_t>(kib_field("/proc/self/status", "VmHWM"), 0);
}

std::int64_t needed_bytes(const std::vector<partition::RankMemory>& ranks,
                          const std::vector<std::vector<int>>& ranks_of_process,
                          std::int64_t process_bytes) {
  std::int64_t needed = 0;
  for (const std::vector<int>& process : ranks_of_process) {
    needed += process_bytes;
    for (int r : process) {
      const partition::RankMemory& rank = ranks.at(static_cast<std::size_t>(r));
      // The snapshot and what is offloaded to host memory: this machine's memory too.
      needed += rank.total() + rank.offloaded + rank.checkpoint_snapshot;
    }
  }
  return needed;
}

std::int64_t evaluation_extra_bytes(const std::vector<partition::RankMemory>& ranks,
                                    const std::vector<int>& ranks_of_process,
                                    std::int64_t whole_parameter_bytes,
                                    std::int64_t forward_bytes) {
  std::int64_t step = 0, resting = 0;
  for (int r : ranks_of_process) {
    const partition::RankMemory& rank = ranks.at(static_cast<std::size_t>(r));
    step += rank.total();
    resting += rank.parameters + rank.gradients + rank.optimizer_state;
  }
  // The gathered copy is freed before the forward starts: the larger of the two at once.
  const std::int64_t evaluating = resting + std::max(whole_parameter_bytes, forward_bytes);
  return std::max<std::int64_t>(0, evaluating - step);
}

bool MemoryFit::fits(const MemoryNeed& need) const {
  if (budget_per_rank > 0) {
    return std::all_of(need.rank_peaks.begin(), need.rank_peaks.end(),
                       [&](std::int64_t peak) { return peak <= budget_per_rank; });
  }
  return available.bytes <= 0 || need.needed <= available.bytes;
}

MemoryFit check_memory_fit(
    const std::function<std::vector<partition::RankMemory>(const std::string& settings)>& predict,
    const std::vector<std::string>& alternatives,
    const std::vector<std::vector<int>>& ranks_of_process, std::int64_t process_bytes,
    const AvailableMemory& available, std::int64_t budget_per_rank, const ProcessExtra& extra,
    bool cpu_stages) {
  auto need = [&](const std::string& settings) {
    MemoryNeed n;
    n.settings = settings;
    const std::vector<partition::RankMemory> ranks = predict(settings);
    for (const partition::RankMemory& rank : ranks) {
      // On CPU stages what is "offloaded to host" is the rank's own memory still.
      n.rank_peaks.push_back(rank.total() + (cpu_stages ? rank.offloaded : 0));
      n.rank_host.push_back(cpu_stages ? 0 : rank.offloaded);
    }
    n.needed = needed_bytes(ranks, ranks_of_process, process_bytes);
    // A process's extra is its first rank's too: a budget per rank covers it.
    for (std::size_t p = 0; p < ranks_of_process.size(); ++p) {
      const std::int64_t more = extra ? extra(ranks, static_cast<int>(p)) : 0;
      n.process_extra.push_back(more);
      n.needed += more;
      if (more > 0 && !ranks_of_process[p].empty()) {
        n.rank_peaks.at(static_cast<std::size_t>(ranks_of_process[p].front())) += more;
      }
    }
    return n;
  };
  MemoryFit fit;
  fit.run = need("");
  fit.process_bytes = process_bytes;
  fit.processes = static_cast<int>(ranks_of_process.size());
  fit.available = available;
  fit.budget_per_rank = budget_per_rank;
  if (fit.fits()) return fit;
  for (const std::string& settings : alternatives) {
    MemoryNeed n = need(settings);
    if (fit.fits(n)) fit.alternatives.push_back(std::move(n));
  }
  std::stable_sort(fit.alternatives.begin(), fit.alternatives.end(),
                   [](const MemoryNeed& a, const MemoryNeed& b) { return a.needed < b.needed; });
  return fit;
}

std::vector<std::int64_t> process_needs(const MemoryFit& fit,
                                        const std::vector<std::vector<int>>& ranks_of_process) {
  std::vector<std::int64_t> needs;
  for (const std::vector<int>& process : ranks_of_process) {
    std::int64_t need = fit.process_bytes;
    for (int r : process) {
      need += fit.run.rank_peaks.at(static_cast<std::size_t>(r)) +
              fit.run.rank_host.at(static_cast<std::size_t>(r));
    }
    needs.push_back(need);
  }
  return needs;
}

std::string peak_memory_text(const std::vector<std::int64_t>& peaks,
                             const std::vector<std::int64_t>& predicted) {
  if (peaks.empty()) return "";
  const std::size_t p =
      static_cast<std::size_t>(std::max_element(peaks.begin(), peaks.end()) - peaks.begin());
  std::ostringstream out;
  out << "peak " << partition::format_bytes(peaks[p]);
  if (peaks.size() > 1) out << " (process " << p << " of " << peaks.size();
  if (p < predicted.size() && predicted[p] > 0) {
    out << (peaks.size() > 1 ? "; " : " (") << "predicted "
        << partition::format_bytes(predicted[p]);
  }
  if (peaks.size() > 1 || (p < predicted.size() && predicted[p] > 0)) out << ")";
  return out.str();
}

std::string memory_fit_text(const MemoryFit& fit) {
  std::ostringstream out;
  if (fit.budget_per_rank > 0) {
    out << "the memory model's peaks (";
    for (std::size_t r = 0; r < fit.run.rank_peaks.size(); ++r) {
      out << (r ? ", " : "") << "rank " << r << " "
          << partition::format_bytes(fit.run.rank_peaks[r]);
    }
    out << ") pass the --memory-limit of " << partition::format_bytes(fit.budget_per_rank)
        << " per rank (pipetrain plan --memory shows their categories; docs/MEMORY.md).";
  } else {
    out << "this run needs " << partition::format_bytes(fit.run.needed) << " of memory on this "
        << "machine and " << partition::format_bytes(fit.available.bytes) << " is available ("
        << fit.available.source << "): " << fit.processes << " process"
        << (fit.processes == 1 ? "" : "es") << " of " << partition::format_bytes(fit.process_bytes)
        << " each before the model, and the memory "
        << "model's peaks (";
    for (std::size_t r = 0; r < fit.run.rank_peaks.size(); ++r) {
      out << (r ? ", " : "") << "rank " << r << " "
          << partition::format_bytes(fit.run.rank_peaks[r]);
    }
    out << ")";
    for (std::size_t p = 0; p < fit.run.process_extra.size(); ++p) {
      if (fit.run.process_extra[p] > 0) {
        out << ", and " << partition::format_bytes(fit.run.process_extra[p]) << " more on process "
            << p << " while it evaluates the whole model";
      }
    }
    out << " (pipetrain plan --memory shows their categories; docs/MEMORY.md).";
  }
  if (fit.alternatives.empty()) {
    out << " No ZeRO stage, checkpoint mode or offload fits either: use more ranks (--pp), fewer "
           "or "
           "smaller micro-batches, or a machine with more memory.";
  } else {
    out << " These fit:";
    for (std::size_t k = 0; k < fit.alternatives.size() && k < 4; ++k) {
      const MemoryNeed& n = fit.alternatives[k];
      const std::int64_t shown = fit.budget_per_rank > 0
                                     ? *std::max_element(n.rank_peaks.begin(), n.rank_peaks.end())
                                     : n.needed;
      out << (k ? ";" : "") << " " << n.settings << " (" << partition::format_bytes(shown)
          << (fit.budget_per_rank > 0 ? " on the largest rank" : "") << ")";
    }
    out << ".";
  }
  out << (fit.budget_per_rank > 0 ? "" : " --memory-limit SIZE states a budget per rank instead;")
      << " --skip-memory-check starts the run anyway.";
  return out.str();
}

}  // namespace pipetrain::train
