// DeepSpeed's tuning ladder on pipetrain's memory model (pipetrain/tune/zero_ladder.h).
#include "pipetrain/tune/zero_ladder.h"

#include <algorithm>
#include <sstream>

#include "pipetrain/base/error.h"
#include "pipetrain/partition/memory.h"

namespace pipetrain::tune {

const std::vector<ZeroRung>& zero_ladder() {
  static const std::vector<ZeroRung> rungs = {
      {"ZeRO 0", "--zero 0", 0, false, false, false},
      {"ZeRO 1", "--zero 1", 1, false, false, false},
      {"ZeRO 2", "--zero 2", 2, false, false, false},
      {"ZeRO 2 + optimizer offload", "--zero 2 --offload-optimizer cpu", 2, true, false, false},
      {"ZeRO 3", "--zero 3", 3, false, false, false},
      {"ZeRO 3 + parameter offload", "--zero 3 --offload-optimizer cpu --offload-params cpu", 3,
       true, true, false},
      {"ZeRO 3 + NVMe", "--zero 3 --offload-optimizer nvme --offload-params nvme --offload-dir DIR",
       3, true, true, true},
  };
  return rungs;
}

std::string zero_rung_not_tried(const ZeroRung& rung, bool chosen_below, int replicas,
                                bool cpu_stages) {
  if (chosen_below) return "not needed";
  if (rung.zero > 0 && replicas < 2 && !rung.offload_optimizer) {
    return "skipped: it shards over data-parallel replicas (--dp 2 or more)";
  }
  if (rung.offload_params && !rung.nvme && cpu_stages) {
    return "skipped: on CPU stages the parameter shards are in host memory already (ZeRO 3)";
  }
  return "";
}

namespace {

// A rank's bytes under the plan: the device's, and on CPU stages its host memory too.
std::vector<std::int64_t> rank_bytes(const partition::ModelProfile& profile,
                                     const partition::Plan& plan,
                                     const partition::PlannerOptions& options, bool cpu_stages) {
  std::vector<std::int64_t> bytes;
  for (const partition::RankMemory& rank : partition::plan_memory(profile, plan, options)) {
    bytes.push_back(rank.total() +
                    (cpu_stages ? rank.offloaded + rank.checkpoint_snapshot : std::int64_t{0}));
  }
  return bytes;
}

std::string gib(std::int64_t bytes) {
  return partition::format_bytes(bytes);
}

}  // namespace

ZeroLadder walk_zero_ladder(const partition::ModelProfile& profile,
                            const partition::PlannerOptions& options, bool cpu_stages,
                            std::int64_t offload_buffer_bytes) {
  if (options.memory_limit_bytes <= 0) {
    throw BadInput("the ZeRO ladder climbs until a run fits a limit: give --memory-limit");
  }
  const std::int64_t limit = options.memory_limit_bytes;
  const int replicas = std::max(1, options.data_parallel);
  ZeroLadder ladder;
  for (const ZeroRung& rung : zero_ladder()) {
    ZeroLadderStep step;
    step.rung = rung;
    step.why = zero_rung_not_tried(rung, ladder.chosen >= 0, replicas, cpu_stages);
    if (!step.why.empty()) {
      ladder.steps.push_back(step);
      continue;
    }
    step.tried = true;
    partition::PlannerOptions o = options;
    o.zero = rung.zero;
    o.offload_optimizer = rung.offload_optimizer;
    o.optimizer_state_in_files = rung.nvme;
    o.parameters_in_files = rung.nvme;
    o.gradients_in_files = rung.nvme && cpu_stages;
    o.offload_buffer_bytes = rung.nvme ? offload_buffer_bytes : 0;
    // The fastest plans within the limit by the device's bytes, then the first within it with the
    // host's too.
    o.top = std::max(o.top, 50);
    const partition::PlanReport report = partition::plan_pipeline(profile, o);
    // The fastest plan within the limit with the host's bytes too; where none is, the one that
    // needs the least (of the ranked plans, or the planner's least where none was ranked).
    std::vector<std::int64_t> best_bytes;
    std::int64_t least = -1;
    for (const partition::Plan& plan : report.ranked) {
      const std::vector<std::int64_t> bytes = rank_bytes(profile, plan, o, cpu_stages);
      const std::int64_t peak = *std::max_element(bytes.begin(), bytes.end());
      if (peak <= limit) {
        step.plan = plan;
        best_bytes = bytes;
        step.fits = true;
        break;
      }
      if (least < 0 || peak < least) {
        least = peak;
        step.plan = plan;
        best_bytes = bytes;
      }
    }
    if (report.ranked.empty() && report.smallest_fitting_plan.ranks > 0) {
      step.plan = report.smallest_fitting_plan;
      best_bytes = rank_bytes(profile, *step.plan, o, cpu_stages);
    }
    if (!best_bytes.empty()) {
      step.rank_bytes = *std::max_element(best_bytes.begin(), best_bytes.end());
      for (std::int64_t b : best_bytes) step.machine_bytes += b * replicas;
    }
    if (step.fits) {
      step.why = "fits: the fastest plan within the limit at this rung";
      ladder.chosen = static_cast<int>(ladder.steps.size());
    } else if (step.plan) {
      step.why = "over the limit of " + gib(limit) + " a rank (its least)";
      if (rung.offload_optimizer && !rung.nvme && cpu_stages) {
        step.why += "; on CPU stages what it offloads stays in the host's memory";
      }
    } else {
      step.why = "no plan";
    }
    ladder.steps.push_back(step);
  }
  return ladder;
}

std::string zero_ladder_text(const ZeroLadder& ladder, std::int64_t limit) {
  std::ostringstream out;
  out << "ZeRO ladder (DeepSpeed's)"
      << (limit > 0 ? ", within " + gib(limit) + " a rank" : std::string(", on this machine"))
      << ":\n";
  for (const ZeroLadderStep& step : ladder.steps) {
    out << "  " << step.rung.name << "  (" << step.rung.flags << ")  ";
    if (step.tried && step.rank_bytes > 0) {
      out << "needs " << gib(step.rank_bytes) << " a rank, " << gib(step.machine_bytes)
          << " for the machine";
      if (step.plan) {
        char seconds[32];
        std::snprintf(seconds, sizeof seconds, "%.3g", step.plan->predicted_step_seconds);
        out << ", " << seconds << " s/step";
      }
      out << ": ";
    }
    out << step.why << "\n";
  }
  if (ladder.chosen < 0) {
    out << "no rung fits" << (limit > 0 ? " " + gib(limit) + " a rank" : std::string()) << "\n";
  } else {
    const ZeroLadderStep& chosen = ladder.steps[static_cast<std::size_t>(ladder.chosen)];
    out << "chosen: " << chosen.rung.name << " (" << chosen.rung.flags << ")";
    if (chosen.plan) out << ", " << chosen.plan->describe();
    out << "\n";
  }
  return out.str();
}

}  // namespace pipetrain::tune
