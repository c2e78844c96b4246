// The evaluation of one plan candidate: per-layer costs at a micro-batch size as prefix sums, a
// candidate's time balance and memory-capped balances, the lower bound on its step time, its
// memory (memory.h) and its simulated step (schedule/simulate.h). The plan search
// (planner_solver.cpp, plan_pipeline) ranks candidates with it; evaluate_plan predicts one plan
// with it (plan_evaluation_solver.cpp). Internal to the partition library; torch-free.
//
// Thread-safety: a PlanEvaluator caches tables and schedules; one thread at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "pipetrain/partition/memory.h"
#include "pipetrain/partition/planner.h"
#include "pipetrain/partition/profile.h"
#include "pipetrain/schedule/schedule.h"

namespace pipetrain::partition::detail {

// Per-layer figures at one micro-batch size, as prefix sums so a stage [a, e) costs O(1).
struct LayerTable {
  std::int64_t microbatch_size = 0;
  std::vector<double> forward, backward, backward_input, backward_weight, update;  // prefix sums
  std::vector<std::int64_t> parameters, body;                                      // prefix sums
  std::vector<std::int64_t> input_of;  // bytes entering layer l (l = 0: the model input)

  // compute_scale multiplies every layer's F, B, I and W (ModelProfile::concurrent_compute_scale
  // and process_compute_scale_at(m) when the plan has more than one rank); layer_scale (one per
  // layer, may be null or empty) each layer's too.
  LayerTable(const ModelProfile& profile, std::int64_t m, double compute_scale = 1,
             const std::vector<double>* layer_scale = nullptr);
  static double range(const std::vector<double>& prefix, int a, int e) {
    return prefix[e] - prefix[a];
  }
  static std::int64_t range(const std::vector<std::int64_t>& prefix, int a, int e) {
    return prefix[e] - prefix[a];
  }
};

// The families whose backward is (at least partly) split into I and W.
bool splits_backward(const std::string& schedule);

// Fraction of micro-batches whose backward first recomputes the forward.
double recompute_fraction(Checkpoint mode, int microbatches);

// A point of the search space: a schedule at M micro-batches and V stages per rank, a checkpoint
// mode, a balance (layers per stage) and the lower bound on its step time with that balance.
struct Candidate {
  std::string schedule;
  int microbatches = 0;
  int virtual_stages = 1;
  Checkpoint checkpoint = Checkpoint::kNever;
  std::vector<int> balance;
  double lower_bound = 0;
};

// The candidate a plan was made from (its lower bound unknown).
Candidate candidate_of(const Plan& plan);

// A schedule of the search and what every balance of it shares.
struct ScheduleEntry {
  schedule::Schedule schedule;
  std::vector<StageResidency> residency;
  SendWalk sends;  // one process per rank only: the same for every balance
};

// The plan search's order: the faster predicted step first, the smaller peak on a tie.
bool faster(const Plan& a, const Plan& b);

// BadInput for a profile validate() refuses, ranks < 1, fewer layers than ranks or top < 1.
void check_planner_options(const ModelProfile& profile, const PlannerOptions& options);

// One evaluator per planning: it keeps the layer table of each micro-batch size and the schedule
// (residency, sends) of each (schedule, M, V) it was asked for. `profile` and `options` must
// outlive it.
class PlanEvaluator {
 public:
  PlanEvaluator(const ModelProfile& profile, const PlannerOptions& options)
      : profile_(profile), options_(options) {}

  // The layer table at the micro-batch size of `microbatches` (made on first use, then kept).
  const LayerTable& table(int microbatches);
  // The schedule `name` at K ranks, M micro-batches and V stages per rank (made once, kept).
  const ScheduleEntry& schedule_of(const std::string& name, int microbatches, int v);
  // Time of stage [a, e) per micro-batch: what the balance evens out.
  double stage_time(const LayerTable& t, const Candidate& c, int a, int e) const;
  // Peak bytes of stage [a, e) by the closed form of memory.h (stage_memory).
  std::int64_t stage_bytes_total(const LayerTable& t, const Candidate& c,
                                 const StageResidency& residency, int a, int e) const;
  // The project's balance solver (balance.h) on per-layer times; V chunks per rank.
  std::vector<int> time_balance(const Candidate& c);
  // Min-max time with every stage's memory <= limit / V (a rank holds V stages).
  std::vector<int> memory_capped_balance(const Candidate& c, const ScheduleEntry& s,
                                         std::int64_t limit);
  // The split with the smallest largest stage memory (what the smallest limit needs).
  std::vector<int> memory_balance(const Candidate& c, const ScheduleEntry& s);
  // The rank of stage j: the V shape for the V-shaped families, j % K for the rest.
  int rank_of(const std::string& schedule, int j) const;
  // Rank r's optimizer update: its stages' layers' update time, x (1 + state multiple).
  double update_of_rank(const Candidate& c, const LayerTable& t, int r) const;
  // The transfer time of the largest tensor crossing a stage boundary (0 on one rank).
  double comm(const LayerTable& t, const std::vector<int>& balance) const;
  // A bound on c's step time: the busiest rank's work, or one micro-batch's way down and back,
  // whichever is larger.
  double lower_bound(const Candidate& c);
  // ModelProfile::measured_step_scale where it applies to this many ranks.
  double step_scale() const;
  // A candidate with its balance fixed as a plan: its memory figures, no times yet.
  Plan memory_plan(const Candidate& c, const ScheduleEntry& s);
  // Memory and simulated time of a candidate with its balance fixed.
  Plan predict(const Candidate& c, const ScheduleEntry& s);
  // The plan's peaks per rank (predict_memory's walk), in-flight counts and whether it fits.
  void fill_memory(Plan& plan, const ScheduleEntry& s);

 private:
  const ModelProfile& profile_;
  const PlannerOptions& options_;
  std::map<std::int64_t, LayerTable> tables_;
  std::map<std::tuple<std::string, int, int>, std::unique_ptr<ScheduleEntry>> schedules_;
};

}  // namespace pipetrain::partition::detail
