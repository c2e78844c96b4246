// The zero-bubble families beyond zb-h1. zb-v is an explicit construction (below); the others
// are the auto scheduler (auto_schedule.h) run with a placement and a memory limit, in
// micro-batches of a rank's whole share of the model:
//
//   name            placement                     limit per rank            from
//   zb-h2           stage j on rank j             2K-1                      Zero Bubble, ZB-H2
//   zb-v            V: rank r holds r, 2K-1-r     K (built, not searched)   Zero Bubble, ZB-V
//   v-half          V                             (K+2)//2                  Controllable Memory
//   v-min           V                             (K+4)//3                  Controllable Memory
//   interleaved-zb  stage j on rank j % K         K (1F1B's peak)           torch's ZB1P
//   zb-auto         stage j on rank j             K                         ZB paper's heuristic
//
// The limits and the bubble they give are tabled in docs/SCHEDULES.md.
#include <algorithm>
#include <cmath>
#include <deque>

#include "generator_util.h"
#include "pipetrain/schedule/auto_schedule.h"
#include "pipetrain/schedule/generators.h"

namespace pipetrain::schedule {
namespace {

Schedule built(const std::string& name, int ranks, int microbatches, std::vector<int> placement,
               int virtual_stages, double limit) {
  AutoScheduleOptions options;
  options.name = name;
  options.ranks = ranks;
  options.microbatches = microbatches;
  options.stage_rank = std::move(placement);
  options.virtual_stages = virtual_stages;
  options.memory_limit = {limit};
  return auto_schedule(options);
}

}  // namespace

Schedule zero_bubble_h2(int ranks, int microbatches) {
  detail::require_positive("zb-h2", "ranks", ranks);
  return built("zb-h2", ranks, microbatches, {}, 1, 2.0 * ranks - 1);
}

// zb-v on rank r (chunk 0 = stage r, chunk 1 = stage 2K-1-r; n = max(2K-1, M) micro-batches):
//   [1] 2(K-r)-1 forwards of chunk 0               [4] steady: F0 I0 W0 F1 I1 W1 until both
//   [2] r times  F1 F0                                  chunks have run their n forwards
//   [3] K-r times F1 I1 W1                         [5] r times I0 I1, [6] K-r times I0 W0,
//                                                      then every W still waiting
// At F = I = W it has no bubble between its warm-up and its drain, and stashes at most K
// micro-batches' worth per rank: 1F1B's peak (the ZB paper's ZB-V; torch's ScheduleZBVZeroBubble
// orders the same phases).
Schedule zero_bubble_v(int ranks, int microbatches) {
  detail::require_positive("zb-v", "ranks", ranks);
  detail::require_positive("zb-v", "microbatches", microbatches);
  Schedule schedule = detail::empty_schedule("zb-v", ranks, microbatches, 2);
  schedule.stage_rank = v_placement(ranks);
  const int K = ranks;
  // Built for n >= 2K-1 micro-batches (the warm-up of rank 0 needs them); with fewer, the
  // actions of the micro-batches that do not exist are left out, which keeps every dependency.
  const int n = std::max(2 * K - 1, microbatches);
  for (int r = 0; r < K; ++r) {
    const int stage[2] = {r, 2 * K - 1 - r};
    int f[2] = {0, 0};
    int b[2] = {0, 0};
    std::deque<int> waiting[2];  // micro-batches whose I ran and whose W has not
    auto& out = schedule.actions[r];
    auto emit = [&](int chunk, Op op, int i) {
      if (i < microbatches) out.push_back({stage[chunk], op, i});
    };
    auto F = [&](int c) { emit(c, Op::kForward, f[c]++); };
    auto I = [&](int c) {
      emit(c, Op::kBackwardInput, b[c]);
      waiting[c].push_back(b[c]++);
    };
    auto W = [&](int c) {
      emit(c, Op::kBackwardWeight, waiting[c].front());
      waiting[c].pop_front();
    };
    for (int k = 0; k < 2 * (K - r) - 1; ++k) F(0);  // [1] fill the way down
    for (int k = 0; k < r; ++k) {                    // [2] both chunks start
      F(1);
      F(0);
    }
    for (int k = 0; k < K - r; ++k) {  // [3] the way back up starts
      F(1);
      I(1);
      W(1);
    }
    while (f[1] < f[0] || f[0] < n) {  // [4] steady: one of each per chunk
      if (f[0] < n) F(0);
      I(0);
      W(0);
      F(1);
      I(1);
      W(1);
    }
    for (int k = 0; k < r; ++k) {  // [5] drain: input gradients first
      I(0);
      I(1);
    }
    for (int k = 0; k < K - r; ++k) {  // [6] then the weights they left behind
      I(0);
      W(0);
    }
    while (!waiting[1].empty()) W(1);
    while (!waiting[0].empty()) W(0);
  }
  return schedule;
}

Schedule v_half(int ranks, int microbatches) {
  detail::require_positive("v-half", "ranks", ranks);
  return built("v-half", ranks, microbatches, v_placement(ranks), 2, v_half_limit(ranks));
}

Schedule v_min(int ranks, int microbatches) {
  detail::require_positive("v-min", "ranks", ranks);
  return built("v-min", ranks, microbatches, v_placement(ranks), 2, v_min_limit(ranks));
}

// The Controllable Memory paper's activation memory, in micro-batches: V-Half (K+2)//2 and V-Min
// (K+4)//3, against 1F1B's K (its Table 1).
double v_half_limit(int ranks) {
  return (ranks + 2) / 2;
}

double v_min_limit(int ranks) {
  return (ranks + 4) / 3;
}

Schedule interleaved_zero_bubble(int ranks, int microbatches, int virtual_stages) {
  detail::require_positive("interleaved-zb", "ranks", ranks);
  return built("interleaved-zb", ranks, microbatches, {}, virtual_stages, ranks);
}

Schedule zero_bubble_auto(const AutoScheduleOptions& options) {
  // [1] The greedy run at the limit, with the split backward and without.
  std::vector<Schedule> candidates;
  candidates.push_back(auto_schedule(options));
  AutoScheduleOptions unsplit = options;
  unsplit.split_backward = false;
  candidates.push_back(auto_schedule(unsplit));
  // [2] With the plain placement, the hand-made zero-bubble layouts that fit the limit.
  const bool plain = options.stage_rank.empty() && options.virtual_stages == 1;
  if (plain) {
    for (const Schedule& fixed : {zero_bubble_h1(options.ranks, options.microbatches),
                                  zero_bubble_h2(options.ranks, options.microbatches),
                                  one_f_one_b(options.ranks, options.microbatches)}) {
      const SimulationResult result = simulate(fixed, options.costs);
      bool fits = true;
      for (int r = 0; r < options.ranks && !options.memory_limit.empty(); ++r) {
        const double limit =
            options.memory_limit.size() == 1 ? options.memory_limit[0] : options.memory_limit[r];
        fits = fits && result.peak_rank_activations[r] <= limit + 1e-9;
      }
      if (fits) candidates.push_back(fixed);
    }
  }
  // [3] The shortest simulated makespan; the earlier candidate on a tie.
  std::size_t best = 0;
  double best_makespan = simulate(candidates[0], options.costs).makespan;
  for (std::size_t c = 1; c < candidates.size(); ++c) {
    const double makespan = simulate(candidates[c], options.costs).makespan;
    if (makespan < best_makespan - 1e-9) {
      best = c;
      best_makespan = makespan;
    }
  }
  Schedule chosen = std::move(candidates[best]);
  chosen.name = options.name;
  return chosen;
}

Schedule zero_bubble_auto(int ranks, int microbatches) {
  detail::require_positive("zb-auto", "ranks", ranks);
  AutoScheduleOptions options;
  options.name = "zb-auto";
  options.ranks = ranks;
  options.microbatches = microbatches;
  options.memory_limit = {static_cast<double>(ranks)};
  return zero_bubble_auto(options);
}

}  // namespace pipetrain::schedule
