// ZeRO-3's plan by unit (pipetrain/schedule/unit_residency.h).
#include "pipetrain/schedule/unit_residency.h"

#include <algorithm>
#include <set>
#include <string>

#include "pipetrain/base/error.h"

namespace pipetrain::schedule {

UnitIds unit_ids(const std::map<int, int>& units) {
  UnitIds ids;
  for (const auto& [stage, count] : units) {
    if (count < 0) {
      throw BadInput("unit_ids: stage " + std::to_string(stage) + " has " + std::to_string(count) +
                     " units");
    }
    ids.first[stage] = ids.total;
    ids.count[stage] = count;
    ids.total += count;
  }
  return ids;
}

std::vector<UnitId> unit_uses(const Schedule& s, int r, const UnitIds& ids, Checkpoint checkpoint,
                              std::vector<char>* backward) {
  const auto& list = s.actions.at(static_cast<std::size_t>(r));
  std::vector<UnitId> uses;
  if (backward) backward->clear();
  bool in_backward = false;                  // the action being listed
  std::set<std::pair<int, int>> recomputed;  // (stage, micro-batch) whose recompute has run
  auto ascending = [&](int first, int count) {
    for (int u = 0; u < count; ++u) uses.push_back(first + u);
    if (backward) backward->resize(uses.size(), in_backward ? 1 : 0);
  };
  auto descending = [&](int first, int count) {
    for (int u = count; u-- > 0;) uses.push_back(first + u);
    if (backward) backward->resize(uses.size(), in_backward ? 1 : 0);
  };
  for (const Action& action : list) {
    if (!is_compute(action.op)) continue;
    const auto found = ids.first.find(action.stage);
    if (found == ids.first.end()) continue;
    const int first = found->second;
    const int count = ids.count.at(action.stage);
    in_backward = action.op != Op::kForward;
    switch (action.op) {
      case Op::kForward:
        ascending(first, count);
        break;
      case Op::kBackward:
      case Op::kBackwardInput:
        if (is_checkpointed(checkpoint, action.microbatch, s.num_microbatches) &&
            recomputed.insert({action.stage, action.microbatch}).second) {
          ascending(first, count);
        }
        descending(first, count);
        break;
      case Op::kBackwardWeight:
        ascending(first, count);
        break;
      default:
        break;
    }
  }
  return uses;
}

UnitPlan plan_units(const std::vector<UnitId>& uses, const std::vector<std::int64_t>& unit_bytes,
                    const UnitPolicy& policy) {
  const int units = static_cast<int>(unit_bytes.size());
  for (UnitId x : uses) {
    if (x < 0 || x >= units) {
      throw BadInput("plan_units: a use of unit " + std::to_string(x) + " of " +
                     std::to_string(units));
    }
  }
  UnitPlan plan;
  plan.uses = uses;
  plan.after.resize(uses.size());
  const std::size_t n = uses.size();
  // next[t]: the index of the next use of uses[t] after t (n: none).
  std::vector<std::size_t> next(n, n);
  {
    std::vector<std::size_t> seen(static_cast<std::size_t>(units), n);
    for (std::size_t t = n; t-- > 0;) {
      next[t] = seen[static_cast<std::size_t>(uses[t])];
      seen[static_cast<std::size_t>(uses[t])] = t;
    }
  }
  auto bytes = [&](UnitId x) { return unit_bytes[static_cast<std::size_t>(x)]; };
  std::vector<char> live(static_cast<std::size_t>(units), 0);   // whole or in flight
  std::vector<char> ahead(static_cast<std::size_t>(units), 0);  // prefetched, not yet used
  std::int64_t live_bytes = 0;
  std::int64_t ahead_bytes = 0;
  auto note_peak = [&] { plan.peak_bytes = std::max(plan.peak_bytes, live_bytes); };
  // Gathers for the uses after `from` (0 before the first use), appended to `out`.
  auto prefetch = [&](std::size_t from, std::vector<UnitId>& out) {
    if (policy.prefetch_bytes <= 0) return;
    for (std::size_t t = from; t < n; ++t) {
      const UnitId y = uses[t];
      if (live[static_cast<std::size_t>(y)]) continue;
      const bool first = ahead_bytes == 0;  // the next unit, whatever the budget
      if (!first && ahead_bytes + bytes(y) > policy.prefetch_bytes) break;
      if (policy.max_live_bytes > 0 && live_bytes + bytes(y) > policy.max_live_bytes) break;
      live[static_cast<std::size_t>(y)] = 1;
      ahead[static_cast<std::size_t>(y)] = 1;
      live_bytes += bytes(y);
      ahead_bytes += bytes(y);
      ++plan.gathers;
      out.push_back(y);
    }
    note_peak();
  };
  prefetch(0, plan.first);
  for (std::size_t t = 0; t < n; ++t) {
    const UnitId x = uses[t];
    const auto at = static_cast<std::size_t>(x);
    if (!live[at]) {  // gathered at its use
      live[at] = 1;
      live_bytes += bytes(x);
      ++plan.gathers;
    }
    if (ahead[at]) {
      ahead[at] = 0;
      ahead_bytes -= bytes(x);
    }
    note_peak();
    UnitStep& step = plan.after[t];
    bool keep = false;
    if (next[t] < n && policy.max_reuse_distance >= 0) {
      // The bytes of the other units used before the next use, each once.
      std::set<UnitId> between;
      std::int64_t distance = 0;
      for (std::size_t u = t + 1; u < next[t] && distance <= policy.max_reuse_distance; ++u) {
        if (uses[u] != x && between.insert(uses[u]).second) distance += bytes(uses[u]);
      }
      keep = distance <= policy.max_reuse_distance;
    }
    if (!keep) {
      step.release.push_back(x);
      live[at] = 0;
      live_bytes -= bytes(x);
    }
    prefetch(t + 1, step.gather);
  }
  return plan;
}

UnitPeaks unit_peaks(const UnitPlan& plan, const std::vector<std::int64_t>& whole_bytes,
                     const std::vector<std::int64_t>& in_flight_bytes) {
  if (whole_bytes.size() != in_flight_bytes.size()) {
    throw BadInput("unit_peaks: " + std::to_string(whole_bytes.size()) + " whole and " +
                   std::to_string(in_flight_bytes.size()) + " in-flight sizes");
  }
  enum State : char { kFreed, kInFlight, kWhole };
  std::vector<char> state(whole_bytes.size(), kFreed);
  UnitPeaks peaks;
  std::int64_t whole = 0, in_flight = 0;
  auto at = [&](UnitId x) { return static_cast<std::size_t>(x); };
  auto start = [&](UnitId x) {
    if (state[at(x)] != kFreed) return;
    state[at(x)] = kInFlight;
    in_flight += in_flight_bytes[at(x)];
    peaks.in_flight = std::max(peaks.in_flight, in_flight);
    peaks.together = std::max(peaks.together, whole + in_flight);
  };
  for (UnitId x : plan.first) start(x);
  for (std::size_t t = 0; t < plan.uses.size(); ++t) {
    const UnitId x = plan.uses[t];
    start(x);
    if (state[at(x)] == kInFlight) {
      in_flight -= in_flight_bytes[at(x)];
      whole += whole_bytes[at(x)];
      state[at(x)] = kWhole;
      peaks.whole = std::max(peaks.whole, whole);
      peaks.together = std::max(peaks.together, whole + in_flight);
    }
    for (UnitId r : plan.after[t].release) {
      if (state[at(r)] == kWhole) whole -= whole_bytes[at(r)];
      if (state[at(r)] == kInFlight) in_flight -= in_flight_bytes[at(r)];
      state[at(r)] = kFreed;
    }
    for (UnitId g : plan.after[t].gather) start(g);
  }
  return peaks;
}

}  // namespace pipetrain::schedule
