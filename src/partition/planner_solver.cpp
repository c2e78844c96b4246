// Planner (planner.h): candidate enumeration, balance, memory check, simulation, ranking.
// (The "_solver" suffix puts this torch-free file in the pipetrain_schedule library.)
//
// Flow of plan_pipeline():
//
//   for M, (schedule, V), checkpoint        candidates, each with a time-balanced split [1]
//        and a lower bound on its step time (busiest rank's total work, or one micro-batch's
//        critical path, whichever is larger)
//   sort by lower bound
//   for each candidate, cheapest bound first:
//        bound >= top-th best time so far -> pruned (and so is every later one)
//        memory of the split [2] > limit -> re-split under a memory cap; still over -> rejected
//        simulate [3] -> insert into the table
//   nothing fits -> smallest limit: min over candidates of the memory-minimising split's peak
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "pipetrain/base/error.h"
#include "pipetrain/base/median.h"
#include "pipetrain/partition/balance.h"
#include "pipetrain/partition/planner.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/simulate.h"

namespace pipetrain::partition {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Per-layer figures at one micro-batch size, as prefix sums so a stage [a, e) costs O(1).
struct LayerTable {
  std::int64_t microbatch_size = 0;
  std::vector<double> forward, backward, backward_input, backward_weight, update;  // prefix sums
  std::vector<std::int64_t> parameters, body;                                      // prefix sums
  std::vector<std::int64_t> input_of;  // bytes entering layer l (l = 0: the model input)

  // compute_scale multiplies every F, B, I and W (ModelProfile::concurrent_compute_scale and
  // process_compute_scale_at(m) when the plan has more than one rank).
  // compute_scale multiplies every layer's F, B, I and W; layer_scale (one per layer, may be
  // null or empty) each layer's too.
  LayerTable(const ModelProfile& profile, std::int64_t m, double compute_scale = 1,
             const std::vector<double>* layer_scale = nullptr)
      : microbatch_size(m) {
    const auto L = static_cast<std::size_t>(profile.num_layers());
    for (auto* v : {&forward, &backward, &backward_input, &backward_weight, &update}) {
      v->assign(L + 1, 0.0);
    }
    parameters.assign(L + 1, 0);
    body.assign(L + 1, 0);
    input_of.assign(L + 1, 0);
    input_of[0] = profile.input_bytes_at(m);
    const double overhead = profile.per_layer_overhead_seconds;
    for (std::size_t l = 0; l < L; ++l) {
      const LayerCost c = profile.layer_cost(static_cast<std::int64_t>(l), m);
      const bool has_weights = profile.layers[l].parameter_bytes > 0;
      const double k =
          compute_scale * (layer_scale && !layer_scale->empty() ? (*layer_scale)[l] : 1.0);
      forward[l + 1] = forward[l] + (c.forward_seconds + overhead) * k;
      backward[l + 1] = backward[l] + (c.backward_seconds + overhead) * k;
      const double split = profile.split_backward_scale;
      backward_input[l + 1] = backward_input[l] + (c.backward_input_seconds * split + overhead) * k;
      backward_weight[l + 1] =
          backward_weight[l] +
          (c.backward_weight_seconds * split + (has_weights ? overhead : 0.0)) * k;
      update[l + 1] = update[l] + profile.layers[l].update_seconds;
      parameters[l + 1] = parameters[l] + profile.layers[l].parameter_bytes;
      body[l + 1] = body[l] + c.activation_bytes;
      input_of[l + 1] = c.output_bytes;
    }
  }
  static double range(const std::vector<double>& prefix, int a, int e) {
    return prefix[e] - prefix[a];
  }
  static std::int64_t range(const std::vector<std::int64_t>& prefix, int a, int e) {
    return prefix[e] - prefix[a];
  }
};

// The families whose backward is (at least partly) split into I and W.
bool splits_backward(const std::string& schedule) {
  return schedule.rfind("zb-", 0) == 0 || schedule == "interleaved-zb" || schedule == "v-half" ||
         schedule == "v-min" || schedule == "dualpipev";
}

// Whether the planner tries `name` with V chunks per rank on K ranks and M micro-batches:
// interleaved-1f1b takes any V (V = 1 is 1F1B, tried as such when 1f1b is searched);
// interleaved-zb and looped-bfs V >= 2 (their V = 1 is zb-auto's and GPipe's order); the
// V-shaped families exactly 2 (dualpipev also an even K and M >= 2K); the rest V = 1.
bool tries(const std::string& name, int V, int K, int M, bool searches_1f1b) {
  if (name == "interleaved-1f1b") return V > 1 || !searches_1f1b;
  if (name == "interleaved-zb" || name == "looped-bfs") return V >= 2;
  return schedule::shape_error(name, K, M, V).empty();
}

// Fraction of micro-batches whose backward first recomputes the forward.
double recompute_fraction(Checkpoint mode, int microbatches) {
  switch (mode) {
    case Checkpoint::kNever:
      return 0;
    case Checkpoint::kAlways:
      return 1;
    case Checkpoint::kExceptLast:
      return static_cast<double>(microbatches - 1) / microbatches;
  }
  return 0;
}

struct Candidate {
  std::string schedule;
  int microbatches = 0;
  int virtual_stages = 1;
  Checkpoint checkpoint = Checkpoint::kNever;
  std::vector<int> balance;
  double lower_bound = 0;
};

// The candidate a plan was made from (its lower bound unknown).
Candidate candidate_of(const Plan& plan) {
  return {plan.schedule, plan.microbatches, plan.virtual_stages, plan.checkpoint, plan.balance, 0};
}

struct ScheduleEntry {
  schedule::Schedule schedule;
  std::vector<StageResidency> residency;
  SendWalk sends;  // one process per rank only: the same for every balance
};

class Evaluator {
 public:
  Evaluator(const ModelProfile& profile, const PlannerOptions& options)
      : profile_(profile), options_(options) {}

  const LayerTable& table(int microbatches) {
    const std::int64_t m = profile_.batch_size / microbatches;
    auto it = tables_.find(m);
    if (it == tables_.end()) {
      const double scale = options_.ranks > 1 ? profile_.concurrent_compute_scale *
                                                    profile_.process_compute_scale_at(m)
                                              : 1.0;
      it = tables_
               .emplace(m, LayerTable(profile_, m, scale,
                                      options_.ranks > 1 ? &profile_.process_layer_scale : nullptr))
               .first;
    }
    return it->second;
  }

  const ScheduleEntry& schedule_of(const std::string& name, int microbatches, int v) {
    auto key = std::make_tuple(name, microbatches, v);
    auto it = schedules_.find(key);
    if (it == schedules_.end()) {
      auto entry = std::make_unique<ScheduleEntry>();
      entry->schedule = schedule::make_schedule(name, options_.ranks, microbatches, v);
      entry->residency = stage_residency(entry->schedule);
      if (options_.processes) entry->sends = send_walk(entry->schedule);
      it = schedules_.emplace(key, std::move(entry)).first;
    }
    return *it->second;
  }

  // Time of stage [a, e) per micro-batch: what the balance evens out.
  double stage_time(const LayerTable& t, const Candidate& c, int a, int e) const {
    const double f = LayerTable::range(t.forward, a, e);
    const double recompute = recompute_fraction(c.checkpoint, c.microbatches) * f;
    if (splits_backward(c.schedule)) {
      const double split =
          LayerTable::range(t.backward_input, a, e) + LayerTable::range(t.backward_weight, a, e);
      // DualPipeV runs most backwards whole: the smaller of the two keeps this a lower bound.
      const double backward =
          c.schedule == "dualpipev" ? std::min(split, LayerTable::range(t.backward, a, e)) : split;
      return f + backward + recompute;
    }
    return f + LayerTable::range(t.backward, a, e) + recompute;
  }

  std::int64_t stage_bytes_total(const LayerTable& t, const Candidate& c,
                                 const StageResidency& residency, int a, int e) const {
    const std::int64_t body = std::max<std::int64_t>(0, LayerTable::range(t.body, a, e));
    return stage_memory(LayerTable::range(t.parameters, a, e), t.input_of[a], body, residency,
                        c.checkpoint, options_.optimizer_state_multiple)
        .total();
  }

  // The project's balance solver (balance.h) on per-layer times; V chunks per rank.
  std::vector<int> time_balance(const Candidate& c) {
    const LayerTable& t = table(c.microbatches);
    std::vector<double> layer_time(static_cast<std::size_t>(profile_.num_layers()));
    for (std::size_t l = 0; l < layer_time.size(); ++l) {
      layer_time[l] = stage_time(t, c, static_cast<int>(l), static_cast<int>(l) + 1);
    }
    BalanceOptions options;
    options.virtual_stages = c.virtual_stages;
    return solve_balance(layer_time, options_.ranks, options).sizes;
  }

  // Min-max time with every stage's memory <= limit / V (a rank holds V stages).
  std::vector<int> memory_capped_balance(const Candidate& c, const ScheduleEntry& s,
                                         std::int64_t limit) {
    const LayerTable& t = table(c.microbatches);
    const std::int64_t cap = limit / c.virtual_stages;
    return min_max_partition(
        static_cast<int>(profile_.num_layers()), s.schedule.num_stages,
        [&](int, int a, int e) { return stage_time(t, c, a, e); },
        [&](int j, int a, int e) { return stage_bytes_total(t, c, s.residency[j], a, e) <= cap; });
  }

  std::vector<int> memory_balance(const Candidate& c, const ScheduleEntry& s) {
    const LayerTable& t = table(c.microbatches);
    return min_max_partition(
        static_cast<int>(profile_.num_layers()), s.schedule.num_stages, [&](int j, int a, int e) {
          return static_cast<double>(stage_bytes_total(t, c, s.residency[j], a, e));
        });
  }

  // The rank of stage j: the V shape for the V-shaped families, j % K for the rest.
  int rank_of(const std::string& schedule, int j) const {
    const int K = options_.ranks;
    return schedule::is_v_shaped(schedule) && j >= K ? 2 * K - 1 - j : j % K;
  }

  double update_of_rank(const Candidate& c, const LayerTable& t, int r) const {
    const std::vector<int>& balance = c.balance;
    double total = 0;
    int first = 0;
    for (std::size_t j = 0; j < balance.size(); ++j) {
      if (rank_of(c.schedule, static_cast<int>(j)) == r) {
        total += LayerTable::range(t.update, first, first + balance[j]);
      }
      first += balance[j];
    }
    return total * (1 + options_.optimizer_state_multiple);
  }

  double comm(const LayerTable& t, const std::vector<int>& balance) const {
    double worst = 0;
    int first = 0;
    for (std::size_t j = 0; j + 1 < balance.size(); ++j) {
      first += balance[j];
      worst = std::max(worst, profile_.transfer.seconds(t.input_of[first]));
    }
    return options_.ranks > 1 ? worst : 0.0;
  }

  double lower_bound(const Candidate& c) {
    const LayerTable& t = table(c.microbatches);
    const int K = options_.ranks;
    std::vector<double> busy(K, 0);
    double path = 0;
    int first = 0;
    for (std::size_t j = 0; j < c.balance.size(); ++j) {
      const double time = stage_time(t, c, first, first + c.balance[j]);
      busy[rank_of(c.schedule, static_cast<int>(j))] += time * c.microbatches;
      // One micro-batch's way down and back; a split backward's W is off that path.
      path += time - (splits_backward(c.schedule)
                          ? LayerTable::range(t.backward_weight, first, first + c.balance[j])
                          : 0.0);
      first += c.balance[j];
    }
    double worst = path;
    for (int r = 0; r < K; ++r) worst = std::max(worst, busy[r] + update_of_rank(c, t, r));
    return worst * step_scale();
  }

  // ModelProfile::measured_step_scale where it applies to this many ranks.
  double step_scale() const {
    return profile_.measured_step_scale_ranks == options_.ranks ? profile_.measured_step_scale
                                                                : 1.0;
  }

  // A candidate with its balance fixed as a plan: its memory figures, no times yet.
  Plan memory_plan(const Candidate& c, const ScheduleEntry& s) {
    Plan plan;
    plan.schedule = c.schedule;
    plan.ranks = options_.ranks;
    plan.microbatches = c.microbatches;
    plan.virtual_stages = c.virtual_stages;
    plan.checkpoint = c.checkpoint;
    plan.balance = c.balance;
    plan.microbatch_size = table(c.microbatches).microbatch_size;
    fill_memory(plan, s);
    return plan;
  }

  // Memory and simulated time of a candidate with its balance fixed.
  Plan predict(const Candidate& c, const ScheduleEntry& s) {
    const LayerTable& t = table(c.microbatches);
    Plan plan = memory_plan(c, s);

    const int S = s.schedule.num_stages;
    schedule::Costs costs;
    costs.forward_per_stage.resize(S);
    costs.backward_per_stage.resize(S);
    costs.backward_input_per_stage.resize(S);
    costs.backward_weight_per_stage.resize(S);
    const double rc = recompute_fraction(c.checkpoint, c.microbatches);
    // Rank time of sending across ranks: F sends the activation to stage j+1, B (or I) the
    // gradient to stage j-1, when that stage runs on another rank.
    auto remote = [&](int a, int b) {
      return s.schedule.stage_rank[a] != s.schedule.stage_rank[b];
    };
    const double message = profile_.transfer.message_seconds;
    int first = 0;
    for (int j = 0; j < S; ++j) {
      const int e = first + c.balance[j];
      const double f = LayerTable::range(t.forward, first, e);
      const double send_forward = j + 1 < S && remote(j, j + 1) ? message : 0.0;
      const double send_backward = j > 0 && remote(j, j - 1) ? message : 0.0;
      costs.forward_per_stage[j] = f + send_forward;
      costs.backward_per_stage[j] =
          LayerTable::range(t.backward, first, e) + rc * f + send_backward;
      costs.backward_input_per_stage[j] =
          LayerTable::range(t.backward_input, first, e) + rc * f + send_backward;
      costs.backward_weight_per_stage[j] = LayerTable::range(t.backward_weight, first, e);
      first = e;
    }
    costs.comm = comm(t, c.balance);
    const schedule::SimulationResult sim = schedule::simulate(s.schedule, costs);
    plan.makespan_seconds = sim.makespan;
    plan.bubble_fraction = sim.bubble_fraction;
    plan.busy_seconds_per_rank = sim.busy;
    for (int r = 0; r < options_.ranks; ++r) {
      plan.update_seconds = std::max(plan.update_seconds, update_of_rank(c, t, r));
    }
    plan.predicted_step_seconds = (plan.makespan_seconds + plan.update_seconds +
                                   (options_.ranks > 1 ? profile_.step_overhead_seconds : 0.0)) *
                                  step_scale();
    return plan;
  }

  void fill_memory(Plan& plan, const ScheduleEntry& s) {
    MemoryModelOptions memory = memory_model_options(plan, options_);
    memory.sends = &s.sends;
    plan.peak_memory_per_rank =
        rank_peak_memory(profile_, plan.balance, plan.microbatch_size, s.schedule, memory);
    plan.peak_memory_bytes =
        *std::max_element(plan.peak_memory_per_rank.begin(), plan.peak_memory_per_rank.end());
    plan.peak_inflight.clear();
    for (const auto& r : s.residency) plan.peak_inflight.push_back(r.peak_inflight);
    plan.fits =
        options_.memory_limit_bytes <= 0 || plan.peak_memory_bytes <= options_.memory_limit_bytes;
  }

 private:
  const ModelProfile& profile_;
  const PlannerOptions& options_;
  std::map<std::int64_t, LayerTable> tables_;
  std::map<std::tuple<std::string, int, int>, std::unique_ptr<ScheduleEntry>> schedules_;
};

bool faster(const Plan& a, const Plan& b) {
  if (a.predicted_step_seconds != b.predicted_step_seconds) {
    return a.predicted_step_seconds < b.predicted_step_seconds;
  }
  return a.peak_memory_bytes < b.peak_memory_bytes;
}

void check_options(const ModelProfile& profile, const PlannerOptions& options) {
  profile.validate();
  if (options.ranks < 1) {
    throw BadInput("planner: ranks must be >= 1 (got " + std::to_string(options.ranks) + ")");
  }
  if (profile.num_layers() < options.ranks) {
    throw BadInput("planner: " + std::to_string(options.ranks) +
                   " ranks need at least as many layers, the model has " +
                   std::to_string(profile.num_layers()) +
                   "; use fewer stages or split the model into more layers");
  }
  if (options.top < 1) {
    throw BadInput("planner: top must be >= 1 (got " + std::to_string(options.top) + ")");
  }
}

}  // namespace

std::vector<int> min_max_partition(int n, int stages,
                                   const std::function<double(int, int, int)>& cost,
                                   const std::function<bool(int, int, int)>& feasible) {
  if (stages < 1 || n < stages) return {};
  // best[j][e]: min over splits of items [0, e) into stages 0..j of the largest stage cost.
  std::vector<std::vector<double>> best(stages, std::vector<double>(n + 1, kInfinity));
  std::vector<std::vector<int>> cut(stages, std::vector<int>(n + 1, -1));
  for (int e = 1; e <= n - stages + 1; ++e) {
    if (feasible && !feasible(0, 0, e)) break;
    best[0][e] = cost(0, 0, e);
    cut[0][e] = 0;
  }
  for (int j = 1; j < stages; ++j) {
    // Stage j ends at e; stages after it need one item each.
    for (int e = j + 1; e <= n - (stages - 1 - j); ++e) {
      double value = kInfinity;
      int arg = -1;
      // Stage j = [a, e). Walking a down grows the stage: its cost only rises and feasibility
      // only falls, so stop at the first a that cannot beat `value` or does not fit.
      for (int a = e - 1; a >= j; --a) {
        if (feasible && !feasible(j, a, e)) break;
        const double own = cost(j, a, e);
        if (own >= value) break;
        const double candidate = std::max(best[j - 1][a], own);
        if (candidate < value) {
          value = candidate;
          arg = a;
        }
      }
      best[j][e] = value;
      cut[j][e] = arg;
    }
  }
  if (!(best[stages - 1][n] < kInfinity)) return {};
  std::vector<int> balance(stages);
  int e = n;
  for (int j = stages - 1; j >= 0; --j) {
    const int a = cut[j][e];
    balance[j] = e - a;
    e = a;
  }
  return balance;
}

std::vector<int> even_balance(int layers, int stages) {
  if (stages < 1 || layers < stages) {
    throw BadInput("even_balance: cannot split " + std::to_string(layers) + " layers into " +
                   std::to_string(stages) +
                   " non-empty stages; use at most as many stages as layers");
  }
  std::vector<int> balance(stages, layers / stages);
  for (int j = 0; j < layers % stages; ++j) ++balance[j];
  return balance;
}

bool same_plan(const Plan& a, const Plan& b) {
  return a.schedule == b.schedule && a.ranks == b.ranks && a.microbatches == b.microbatches &&
         a.virtual_stages == b.virtual_stages && a.checkpoint == b.checkpoint &&
         a.balance == b.balance;
}

std::vector<Plan> plans_to_measure(const PlanReport& report, const Plan* reference, int count,
                                   double within) {
  std::vector<Plan> plans;
  for (const Plan& plan : report.ranked) {
    if (static_cast<int>(plans.size()) >= count ||
        plan.predicted_step_seconds > report.ranked.front().predicted_step_seconds * (1 + within)) {
      break;
    }
    plans.push_back(plan);
  }
  if (reference && reference->fits &&
      std::none_of(plans.begin(), plans.end(),
                   [&](const Plan& plan) { return same_plan(plan, *reference); })) {
    plans.push_back(*reference);
  }
  return plans;
}

std::size_t choose_measured(const std::vector<std::vector<double>>& step_seconds,
                            std::size_t reference, double margin) {
  if (step_seconds.empty()) {
    throw BadInput("choose_measured: no candidates; measure at least one plan");
  }
  for (std::size_t k = 0; k < step_seconds.size(); ++k) {
    if (step_seconds[k].empty()) {
      throw BadInput("choose_measured: candidate " + std::to_string(k) +
                     " has no timed steps; time at least one");
    }
  }
  if (reference >= step_seconds.size()) {
    std::size_t fastest = 0;
    for (std::size_t k = 1; k < step_seconds.size(); ++k) {
      if (median(step_seconds[k]) < median(step_seconds[fastest])) fastest = k;
    }
    return fastest;
  }
  std::size_t best = reference;
  double best_ratio = 1 - margin;
  for (std::size_t k = 0; k < step_seconds.size(); ++k) {
    if (k == reference) continue;
    std::vector<double> ratios;
    for (std::size_t s = 0; s < step_seconds[k].size() && s < step_seconds[reference].size(); ++s) {
      if (step_seconds[reference][s] > 0) {
        ratios.push_back(step_seconds[k][s] / step_seconds[reference][s]);
      }
    }
    if (!ratios.empty() && median(ratios) < best_ratio) {
      best_ratio = median(ratios);
      best = k;
    }
  }
  return best;
}

void recommend_measured(ModelProfile& profile, const PlannerOptions& options, PlanReport& report,
                        const std::vector<Plan>& candidates,
                        const std::vector<double>& measured_seconds, std::size_t chosen) {
  if (candidates.empty() || candidates.size() != measured_seconds.size() ||
      chosen >= candidates.size()) {
    throw BadInput("recommend_measured: " + std::to_string(candidates.size()) +
                   " candidates with " + std::to_string(measured_seconds.size()) +
                   " measured times, candidate " + std::to_string(chosen) +
                   " chosen; give one time per candidate, at least one, and choose "
                   "one of them");
  }
  std::vector<double> ratios;
  for (std::size_t k = 0; k < candidates.size(); ++k) {
    if (!(measured_seconds[k] > 0) || !(candidates[k].predicted_step_seconds > 0)) {
      throw BadInput("recommend_measured: candidate " + candidates[k].describe() + " measured " +
                     std::to_string(measured_seconds[k]) + " s for a prediction of " +
                     std::to_string(candidates[k].predicted_step_seconds) + " s; both must be > 0");
    }
    ratios.push_back(measured_seconds[k] / candidates[k].predicted_step_seconds);
  }
  const double ratio = median(ratios);

  const double before =
      profile.measured_step_scale_ranks == options.ranks ? profile.measured_step_scale : 1.0;
  profile.measured_step_scale = before * ratio;
  profile.measured_step_scale_ranks = options.ranks;
  for (Plan& plan : report.ranked) plan.predicted_step_seconds *= ratio;
  report.measured.clear();
  for (std::size_t k = 0; k < candidates.size(); ++k) {
    MeasuredPlan run{candidates[k], measured_seconds[k]};
    run.plan.predicted_step_seconds *= ratio;
    report.measured.push_back(std::move(run));
  }

  const Plan& recommended = report.measured[chosen].plan;
  auto in_table = std::find_if(report.ranked.begin(), report.ranked.end(),
                               [&](const Plan& plan) { return same_plan(plan, recommended); });
  if (in_table == report.ranked.end()) {
    in_table = report.ranked.insert(
        std::upper_bound(report.ranked.begin(), report.ranked.end(), recommended, faster),
        recommended);
  }
  report.recommended_index = static_cast<std::size_t>(in_table - report.ranked.begin());
}

std::string Plan::describe() const {
  std::ostringstream out;
  out << schedule;
  if (virtual_stages > 1) out << " V=" << virtual_stages;
  out << " M=" << microbatches << " ckpt=" << to_string(checkpoint) << " balance=";
  for (std::size_t j = 0; j < balance.size(); ++j) out << (j ? "," : "") << balance[j];
  return out.str();
}

MemoryModelOptions memory_model_options(const Plan& plan, const PlannerOptions& options) {
  MemoryModelOptions memory;
  memory.checkpoint = plan.checkpoint;
  memory.optimizer_state_multiple = options.optimizer_state_multiple;
  memory.zero = options.zero;
  memory.reshard_after_forward = options.reshard_after_forward;
  memory.zero_policy = options.zero_policy;
  memory.offload_optimizer = options.offload_optimizer;
  memory.data_parallel = options.data_parallel;
  memory.processes = options.processes;
  memory.cast_gathers = options.cast_gathers;
  return memory;
}

std::vector<RankMemory> plan_memory(const ModelProfile& profile, const Plan& plan,
                                    const PlannerOptions& options) {
  const schedule::Schedule s =
      schedule::make_schedule(plan.schedule, plan.ranks, plan.microbatches, plan.virtual_stages);
  return predict_memory(profile, plan.balance, plan.microbatch_size, s,
                        memory_model_options(plan, options));
}

Plan evaluate_plan(const ModelProfile& profile, const Plan& spec, const PlannerOptions& options) {
  check_options(profile, options);
  if (spec.microbatches < 1 || profile.batch_size % spec.microbatches != 0) {
    throw BadInput("evaluate_plan: " + std::to_string(spec.microbatches) +
                   " micro-batches do not divide the batch of " +
                   std::to_string(profile.batch_size) + "; pick a divisor");
  }
  PlannerOptions local = options;
  local.ranks = spec.ranks > 0 ? spec.ranks : options.ranks;
  Evaluator evaluator(profile, local);
  Candidate c = candidate_of(spec);
  if (c.balance.empty()) c.balance = evaluator.time_balance(c);
  const int S = local.ranks * spec.virtual_stages;
  int total = 0;
  for (int layers : c.balance) total += layers;
  if (static_cast<int>(c.balance.size()) != S || total != profile.num_layers()) {
    throw BadInput("evaluate_plan: balance has " + std::to_string(c.balance.size()) +
                   " stages summing to " + std::to_string(total) + " layers; need " +
                   std::to_string(S) + " stages summing to " +
                   std::to_string(profile.num_layers()));
  }
  const ScheduleEntry& s = evaluator.schedule_of(c.schedule, c.microbatches, c.virtual_stages);
  return evaluator.predict(c, s);
}

Plan default_plan(const ModelProfile& profile, int ranks, int microbatches) {
  Plan plan;
  plan.schedule = "1f1b";
  plan.ranks = ranks;
  plan.microbatches = microbatches;
  plan.balance = even_balance(static_cast<int>(profile.num_layers()), ranks);
  return plan;
}

namespace {

// The options with every empty search dimension filled with its default.
PlannerOptions with_defaults(const ModelProfile& profile, const PlannerOptions& given) {
  PlannerOptions options = given;
  if (options.schedules.empty()) options.schedules = schedule::schedule_names();
  if (options.microbatch_counts.empty()) {
    options.microbatch_counts = default_microbatch_counts(profile.batch_size);
  }
  if (options.checkpoint_modes.empty()) options.checkpoint_modes = all_checkpoint_modes();
  if (options.virtual_stages.empty()) options.virtual_stages = {1, 2, 4};
  return options;
}

// [1] Every (schedule, M, V, checkpoint) the options allow, with its time balance and lower
// bound, cheapest bound first.
std::vector<Candidate> enumerate_candidates(const ModelProfile& profile,
                                            const PlannerOptions& options, Evaluator& evaluator) {
  const bool searches_1f1b = std::find(options.schedules.begin(), options.schedules.end(),
                                       "1f1b") != options.schedules.end();
  const int L = static_cast<int>(profile.num_layers());
  std::vector<Candidate> candidates;
  for (int M : options.microbatch_counts) {
    if (M < 1 || profile.batch_size % M != 0) {
      throw BadInput("planner: " + std::to_string(M) +
                     " micro-batches do not divide the batch of " +
                     std::to_string(profile.batch_size) + "; pick divisors");
    }
    for (const auto& name : options.schedules) {
      for (int V : options.virtual_stages) {
        if (!tries(name, V, options.ranks, M, searches_1f1b)) continue;
        if (options.ranks * V > L) continue;
        for (Checkpoint mode : options.checkpoint_modes) {
          if (splits_backward(name) && mode != Checkpoint::kNever) continue;
          Candidate c{name, M, V, mode, {}, 0};
          c.balance = evaluator.time_balance(c);
          c.lower_bound = evaluator.lower_bound(c);
          candidates.push_back(std::move(c));
        }
      }
    }
  }
  std::stable_sort(
      candidates.begin(), candidates.end(),
      [](const Candidate& a, const Candidate& b) { return a.lower_bound < b.lower_bound; });
  return candidates;
}

// [2] A balance of `c` within `limit` (its time balance when that fits, else the memory-capped
// one, else the leanest); false when none fits. Updates c's balance and lower bound.
bool fit_to_memory(Candidate& c, const ScheduleEntry& s, Evaluator& evaluator, std::int64_t limit) {
  Plan trial = evaluator.memory_plan(c, s);
  if (trial.fits) return true;
  std::vector<int> capped = evaluator.memory_capped_balance(c, s, limit);
  if (!capped.empty()) {
    trial.balance = capped;
    evaluator.fill_memory(trial, s);
  }
  if (capped.empty() || !trial.fits) {
    // The cap is limit / V per stage; with V > 1 a rank can fit while one stage is over its
    // share, so try the leanest split too (it is what smallest_fitting_limit reports).
    capped = evaluator.memory_balance(c, s);
    trial.balance = capped;
    evaluator.fill_memory(trial, s);
  }
  if (!trial.fits) return false;
  c.balance = capped;
  c.lower_bound = evaluator.lower_bound(c);
  return true;
}

// [3] Nothing fits: the smallest limit any candidate could meet with its leanest split, and that
// plan with its predicted time (for the message "needs X; would take Y").
void find_smallest_fitting(const std::vector<Candidate>& candidates, Evaluator& evaluator,
                           PlanReport& report) {
  bool have = false;
  for (const Candidate& original : candidates) {
    Candidate c = original;
    const ScheduleEntry& s = evaluator.schedule_of(c.schedule, c.microbatches, c.virtual_stages);
    c.balance = evaluator.memory_balance(c, s);
    Plan trial = evaluator.memory_plan(c, s);
    if (!have || trial.peak_memory_bytes < report.smallest_fitting_limit) {
      have = true;
      report.smallest_fitting_limit = trial.peak_memory_bytes;
      report.smallest_fitting_plan = trial;
    }
  }
  if (have) {
    const Candidate c = candidate_of(report.smallest_fitting_plan);
    const ScheduleEntry& s = evaluator.schedule_of(c.schedule, c.microbatches, c.virtual_stages);
    report.smallest_fitting_plan = evaluator.predict(c, s);
  }
}

}  // namespace

PlanReport plan_pipeline(const ModelProfile& profile, const PlannerOptions& options_in) {
  const auto started = std::chrono::steady_clock::now();
  check_options(profile, options_in);
  const PlannerOptions options = with_defaults(profile, options_in);
  Evaluator evaluator(profile, options);
  PlanReport report;
  std::vector<Candidate> candidates = enumerate_candidates(profile, options, evaluator);  // [1]
  report.candidates = static_cast<int>(candidates.size());

  // Candidates in order of their lower bound: once the table holds `top` plans and a bound is no
  // better than its slowest, that candidate cannot enter it (pruned).
  const std::int64_t limit = options.memory_limit_bytes;
  auto table_full_and_beats = [&](double bound) {
    return static_cast<int>(report.ranked.size()) >= options.top &&
           bound >= report.ranked.back().predicted_step_seconds;
  };
  for (Candidate& c : candidates) {
    if (table_full_and_beats(c.lower_bound)) {
      ++report.pruned;
      continue;
    }
    const ScheduleEntry& s = evaluator.schedule_of(c.schedule, c.microbatches, c.virtual_stages);
    const std::vector<int> time_balance = c.balance;
    if (limit > 0 && !fit_to_memory(c, s, evaluator, limit)) {  // [2]
      ++report.rejected_memory;
      continue;
    }
    const bool for_memory = c.balance != time_balance;
    if (for_memory && table_full_and_beats(c.lower_bound)) {
      ++report.pruned;
      continue;
    }
    Plan plan = evaluator.predict(c, s);
    plan.balanced_for_memory = for_memory;
    ++report.simulated;
    auto at = std::upper_bound(report.ranked.begin(), report.ranked.end(), plan, faster);
    report.ranked.insert(at, std::move(plan));
    if (static_cast<int>(report.ranked.size()) > options.top) report.ranked.pop_back();
  }
  if (report.ranked.empty() && limit > 0)
    find_smallest_fitting(candidates, evaluator, report);  // [3]
  report.planning_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return report;
}

std::vector<int> default_microbatch_counts(std::int64_t batch) {
  std::vector<int> counts;
  for (std::int64_t m = 1; m <= batch; m *= 2) {
    if (batch % m == 0) counts.push_back(static_cast<int>(m));
  }
  if (counts.back() != batch) counts.push_back(static_cast<int>(batch));
  return counts;
}

}  // namespace pipetrain::partition
