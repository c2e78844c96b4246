// Memory fit: whether a training run fits the memory of the machine it starts on, decided before
// any rank builds its share of the model, and the settings that would fit when it does not.
//
//   needed     = sum over the run's processes on this machine of
//                  (a process's own footprint + the memory model's peak of the pipeline ranks
//                   it runs: train/memory_report.h, partition/memory.h, and what they offload
//                   to host memory (ZeRO-Offload's shard, the offload files' buffer pool)
//                   + what the process needs beyond that peak between steps: the evaluation,
//                   which the main process runs on the whole model: MemoryNeed::process_extra)
//   available  = the least of MemAvailable (/proc/meminfo) and the cgroup's memory.max less
//                memory.current
//
// or, with a budget stated per rank (--memory-limit, as the planner reads it): each rank's peak
// against it, footprints aside.
//
// A process's own footprint is what one has before it holds a model: LibTorch, the runtime, the
// data; measured in the process that checks (its resident memory then), which has loaded the
// same. The peaks are the model's upper bounds (the categories' peaks added, though they need not
// fall at one moment), and host memory only: CPU stages. On CUDA stages the device's categories
// are the device's business (not checked here); the host then holds the footprints and what is
// offloaded.
//
// Thread-safety: pure functions, but for reading /proc and /sys.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "pipetrain/partition/memory.h"

namespace pipetrain::train {

struct AvailableMemory {
  std::int64_t bytes = 0;
  std::string source;  // "MemAvailable", "cgroup memory.max", "--memory-limit", ...
};
// What this machine has for new processes now. Where neither file can be read: 0 bytes, source
// "unknown" (nothing is then refused).
AvailableMemory host_available_memory();

// This process's resident memory now (VmRSS) and at its most so far (VmHWM); 0 where /proc is
// not there.
std::int64_t resident_bytes();
std::int64_t peak_resident_bytes();
// Starts a window of peak measurement: VmHWM is reset to VmRSS (/proc/self/clear_refs "5"),
// peak_resident_bytes() still counting the peak before it. Returns VmRSS at the reset, or -1
// where the kernel does not allow it (no window: window_peak_resident_bytes is then the
// process's peak). window_peak_resident_bytes: VmHWM, the peak since the last reset.
std::int64_t reset_peak_resident();
std::int64_t window_peak_resident_bytes();

// One way to run, and what it needs here.
struct MemoryNeed {
  std::string settings;  // "--zero 3", "" for the run as given
  // The model's total per pipeline rank; a process's extra counts on its first rank.
  std::vector<std::int64_t> rank_peaks;
  // Each rank's host memory beyond its peak: what is offloaded there (RankMemory::offloaded).
  std::vector<std::int64_t> rank_host;
  // Per process, what it needs beyond its ranks' step peaks (0: nothing): the evaluation between
  // steps where it needs more than a step (ProcessExtra).
  std::vector<std::int64_t> process_extra;
  std::int64_t needed = 0;  // on this machine, footprints included
};

struct MemoryFit {
  MemoryNeed run;                  // as given
  std::int64_t process_bytes = 0;  // each process's own footprint
  int processes = 1;               // the run's processes on this machine
  AvailableMemory available;
  std::int64_t budget_per_rank = 0;      // > 0: each rank's peak against it instead
  std::vector<MemoryNeed> alternatives;  // those that fit, least memory first
  bool fits(const MemoryNeed& need) const;
  bool fits() const { return fits(run); }
};

// The run's need on this machine: `ranks_of_process[p]` lists the pipeline ranks process p runs
// (every process of a --nproc run holds one; one process may run them all). Each rank's total(),
// what it offloads to host memory and its checkpoint snapshot (this machine's memory too).
std::int64_t needed_bytes(const std::vector<partition::RankMemory>& ranks,
                          const std::vector<std::vector<int>>& ranks_of_process,
                          std::int64_t process_bytes);

// What process `p` needs beyond its ranks' peaks, given the ranks' prediction (0: nothing).
using ProcessExtra =
    std::function<std::int64_t(const std::vector<partition::RankMemory>& ranks, int p)>;

// The check: `predict(settings)` gives the model's per-rank prediction of the run with
// `settings` applied ("" for the run as given; then each of `alternatives`, only when the run
// does not fit). Fills MemoryFit::alternatives with those that fit, least memory first.
// `cpu_stages`: the ranks run on the CPU, so what they offload to host memory is part of each
// rank's peak (against a --memory-limit too); otherwise it counts for the machine only.
MemoryFit check_memory_fit(
    const std::function<std::vector<partition::RankMemory>(const std::string& settings)>& predict,
    const std::vector<std::string>& alternatives,
    const std::vector<std::vector<int>>& ranks_of_process, std::int64_t process_bytes,
    const AvailableMemory& available, std::int64_t budget_per_rank = 0,
    const ProcessExtra& extra = {}, bool cpu_stages = true);

// The evaluation between steps, on the process that runs it: its ranks keep their parameters,
// gradients and optimizer state, the whole model's parameters are gathered there once (a copy),
// and then the evaluation's forward runs its largest batch (`forward_bytes`: the most bytes its
// no-grad forward holds at once). Returns what that needs beyond the process's step peak
// (`ranks`' totals), 0 when the step needs more.
std::int64_t evaluation_extra_bytes(const std::vector<partition::RankMemory>& ranks,
                                    const std::vector<int>& ranks_of_process,
                                    std::int64_t whole_parameter_bytes, std::int64_t forward_bytes);

// Each process's need (the footprint and its ranks' peaks), in process order.
std::vector<std::int64_t> process_needs(const MemoryFit& fit,
                                        const std::vector<std::vector<int>>& ranks_of_process);
// "peak 1.81 GiB (process 2 of 4; predicted 1.63 GiB)": the process whose peak is the largest,
// against its prediction where `predicted` has one. "" for no peaks.
std::string peak_memory_text(const std::vector<std::int64_t>& peaks,
                             const std::vector<std::int64_t>& predicted);

// What `train` prints when a run does not fit: the need and where it comes from, what is
// available, and the settings that fit (or that none does).
std::string memory_fit_text(const MemoryFit& fit);

}  // namespace pipetrain::train
