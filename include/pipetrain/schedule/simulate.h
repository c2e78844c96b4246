// simulate(): runs a schedule on a cost model and reports its timeline, makespan, bubble and
// peak stashed activations.
//
// Cost model. Each action takes a fixed time; a rank runs its actions in list order, each as
// soon as the rank is free and its inputs have arrived:
//   F(j,i)     after F(j-1,i) ended (+ comm when stage j-1 is on another rank)
//   B/I(j,i)   after F(j,i) and after B/I(j+1,i) ended (+ comm across ranks)
//   W(j,i)     after I(j,i)
// Sends are asynchronous (they occupy no rank time); comm is the transfer latency between
// ranks. Stages on the same rank (interleaving) hand over locally, at no cost.
//
// Virtual stages: the scalar costs are per rank's whole share of the model, so with V virtual
// stages each chunk's action costs cost / V (interleaving then does the same total work as
// 1F1B). The per-stage vectors, when given, have one entry per stage (S = K*V) and are used
// as they are (already per chunk). comm is not divided.
//
// Peak activations of stage j: the most micro-batches at once whose F on j has started and
// whose backward on j has not finished, the backward being B, or W when split (W still needs
// the stashed layer inputs). So zb-h1 holds min(K, M) on every stage: equal to 1F1B's maximum
// (stage 0), which is what the Zero Bubble paper's "same peak memory as 1F1B" compares.
//
// Thread-safety: pure function. Cost: O(actions + S*M).
// REQUIRES: a schedule that validate() accepts (compute-only or lowered; communication actions
// are ignored). Throws pipetrain::BadInput on negative costs (per_action's included), per-stage
// vectors of the wrong size, or a deadlocked schedule (run validate() for the report).
#pragma once

#include <functional>
#include <vector>

#include "pipetrain/schedule/schedule.h"
#include "pipetrain/schedule/timeline.h"

namespace pipetrain::schedule {

struct Costs {
  double forward = 1;          // F, per rank's share of the model
  double backward = 2;         // B (unsplit backward)
  double backward_input = 1;   // I
  double backward_weight = 1;  // W
  double comm = 0;             // latency of one activation or gradient between ranks
  // Optional overrides, size S each (per chunk, not divided by V); empty = use the scalar.
  std::vector<double> forward_per_stage;
  std::vector<double> backward_per_stage;
  std::vector<double> backward_input_per_stage;
  std::vector<double> backward_weight_per_stage;
  // Optional: the time of each compute action on its own (e.g. the durations measured in one
  // run, to replay that run without its waits). When set it replaces everything above but comm;
  // it must return >= 0 for every compute action of the schedule.
  std::function<double(const Action&)> per_action;

  // Time of `op` on stage j of a schedule with V virtual stages per rank.
  double of(Op op, int stage, int virtual_stages) const;
};

struct TimedAction {
  Action action;
  double start = 0;
  double end = 0;
};

struct SimulationResult {
  std::vector<std::vector<TimedAction>> ranks;  // per rank, in run order (compute actions)
  double makespan = 0;
  double bubble_fraction = 0;         // idle / (ranks * makespan)
  std::vector<double> busy;           // per rank: total compute time
  std::vector<int> peak_activations;  // per stage, in micro-batches
  // Per rank: idle time between the start of its first action and the end of its last, the
  // bubble the Zero Bubble paper counts (its layouts let each rank start the next step as soon
  // as it is done, so the offsets at the ends are not idle). bubble_time is the largest.
  std::vector<double> span_idle;
  double bubble_time = 0;
  // Per rank: the most stashed activations held at once over all its stages, in units of the
  // rank's whole share of the model (a micro-batch through one of V chunks counts 1/V). 1F1B's
  // rank 0 holds min(K, M); a V-shaped rank holding both chunks of K micro-batches also K.
  std::vector<double> peak_rank_activations;

  // The timeline (for SVG, Chrome trace, text grid).
  Timeline timeline(const std::string& title = "") const;
};

SimulationResult simulate(const Schedule& schedule, const Costs& costs = {});

}  // namespace pipetrain::schedule
