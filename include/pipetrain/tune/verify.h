// verify_plans: does a plan the planner recommends beat another (the hand-written default) when
// both really run? `pipetrain plan --verify` prints what this returns.
//
// The plans run together, in turn step by step (RunPlans, tune/calibration.h), `rounds` rounds of
// `steps` timed steps each: a machine whose speed drifts slows every plan alike. Each plan's step
// time is the median of all its timed steps; first_over_second is the median of the per-step
// ratios of plans[0] over plans[1] in the same turns.
//
// Thread-safety: as `run`; call from one thread.
#pragma once

#include <cstdint>
#include <vector>

#include "pipetrain/partition/planner.h"
#include "pipetrain/tune/calibration.h"

namespace pipetrain::tune {

struct PlanVerification {
  partition::Plan plan;
  double step_seconds = 0;                      // median over every timed step of every round
  std::vector<double> each_step_seconds;        // every timed step, round after round
  std::vector<double> round_step_seconds;       // each round's median
  double compute_seconds_per_rank = 0;          // median over rounds of the ranks' mean compute
  std::vector<double> compute_seconds_by_rank;  // median over rounds, per rank
  double span_seconds = 0;                      // median over rounds: first action to last
  std::vector<int64_t> peak_stashed_bytes;      // per stage, in the first round
};

struct Verification {
  std::vector<PlanVerification> plans;  // in the order given
  double first_over_second = 0;         // median of plans[0] / plans[1] per step; 0 for one plan
  int rounds = 0;
  int steps_per_round = 0;
};

// REQUIRES: plans not empty, rounds >= 1, steps >= 1 (BadInput otherwise).
Verification verify_plans(const std::vector<partition::Plan>& plans, const RunPlans& run,
                          int rounds, int steps);

}  // namespace pipetrain::tune
