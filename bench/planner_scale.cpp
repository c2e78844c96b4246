// bench_planner_scale: how the planner's search time grows with the pipeline. One run plans a
// uniform 256-layer model at batch 512 for 16 ranks (the baseline) and for 64 ranks, and prints
// each search (candidates, simulated, pruned, seconds) and the ratio of the two times, then the
// 64-rank search of each schedule family alone (where the time goes). It was a
// unit test ("plans 64 ranks in 10 s", checked by reading its output) until the schedule families
// of issue #16 made the search take 132 s here; a timing belongs in a benchmark.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "pipetrain/partition/planner.h"
#include "pipetrain/partition/profile.h"
#include "pipetrain/schedule/generators.h"

using namespace pipetrain::partition;

namespace {

double plan_seconds(int ranks, const std::vector<std::string>& schedules = {}) {
  const ModelProfile profile = uniform_profile(256, 512, UniformLayer{});
  PlannerOptions options;
  options.ranks = ranks;
  options.schedules = schedules;
  const auto start = std::chrono::steady_clock::now();
  const PlanReport report = plan_pipeline(profile, options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%2d ranks%s%s: %lld candidates, %lld simulated, %lld pruned, %.2f s; best %s\n",
              ranks, schedules.empty() ? "" : ", ", schedules.empty() ? "" : schedules[0].c_str(),
              static_cast<long long>(report.candidates), static_cast<long long>(report.simulated),
              static_cast<long long>(report.pruned), seconds,
              report.found() ? report.recommended().describe().substr(0, 50).c_str() : "(none)");
  return seconds;
}

}  // namespace

int main() {
  const double baseline = plan_seconds(16);
  const double large = plan_seconds(64);
  std::printf("64 ranks / 16 ranks: %.2fx the search time\n",
              baseline > 0 ? large / baseline : 0.0);
  for (const std::string& name : pipetrain::schedule::schedule_names()) {
    const double alone = plan_seconds(64, {name});
    std::printf("   %s: %.0f%% of the 64-rank search\n", name.c_str(), 100 * alone / large);
  }
  return 0;
}
