// The evaluation of one plan (plan_evaluation.h): what a candidate costs and holds. The per-layer
// table, a candidate's balances (time, memory-capped, leanest), the lower bound on its step, its
// memory per rank and its simulated step; then the public pieces made of them: evaluate_plan,
// default_plan, plan_memory, memory_model_options, Plan::describe and the balance helpers
// (even_balance, min_max_partition). The search over candidates is planner_solver.cpp.
// (The "_solver" suffix puts this torch-free file in the pipetrain_schedule library.)
#include <algorithm>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "pipetrain/base/error.h"
#include "pipetrain/partition/balance.h"
#include "pipetrain/partition/planner.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/simulate.h"
#include "plan_evaluation.h"

namespace pipetrain::partition {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

}  // namespace

namespace detail {

LayerTable::LayerTable(const ModelProfile& profile, std::int64_t m, double compute_scale,
                       const std::vector<double>* layer_scale)
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

// The families whose backward is (at least partly) split into I and W.
bool splits_backward(const std::string& schedule) {
  return schedule.rfind("zb-", 0) == 0 || schedule == "interleaved-zb" || schedule == "v-half" ||
         schedule == "v-min" || schedule == "dualpipev";
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

// The candidate a plan was made from (its lower bound unknown).
Candidate candidate_of(const Plan& plan) {
  return {plan.schedule, plan.microbatches, plan.virtual_stages, plan.checkpoint, plan.balance, 0};
}

bool faster(const Plan& a, const Plan& b) {
  if (a.predicted_step_seconds != b.predicted_step_seconds) {
    return a.predicted_step_seconds < b.predicted_step_seconds;
  }
  return a.peak_memory_bytes < b.peak_memory_bytes;
}

void check_planner_options(const ModelProfile& profile, const PlannerOptions& options) {
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

const LayerTable& PlanEvaluator::table(int microbatches) {
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

const ScheduleEntry& PlanEvaluator::schedule_of(const std::string& name, int microbatches, int v) {
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
double PlanEvaluator::stage_time(const LayerTable& t, const Candidate& c, int a, int e) const {
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

std::int64_t PlanEvaluator::stage_bytes_total(const LayerTable& t, const Candidate& c,
                                              const StageResidency& residency, int a, int e) const {
  const std::int64_t body = std::max<std::int64_t>(0, LayerTable::range(t.body, a, e));
  return stage_memory(LayerTable::range(t.parameters, a, e), t.input_of[a], body, residency,
                      c.checkpoint, options_.optimizer_state_multiple)
      .total();
}

// The project's balance solver (balance.h) on per-layer times; V chunks per rank.
std::vector<int> PlanEvaluator::time_balance(const Candidate& c) {
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
std::vector<int> PlanEvaluator::memory_capped_balance(const Candidate& c, const ScheduleEntry& s,
                                                      std::int64_t limit) {
  const LayerTable& t = table(c.microbatches);
  const std::int64_t cap = limit / c.virtual_stages;
  return min_max_partition(
      static_cast<int>(profile_.num_layers()), s.schedule.num_stages,
      [&](int, int a, int e) { return stage_time(t, c, a, e); },
      [&](int j, int a, int e) { return stage_bytes_total(t, c, s.residency[j], a, e) <= cap; });
}

std::vector<int> PlanEvaluator::memory_balance(const Candidate& c, const ScheduleEntry& s) {
  const LayerTable& t = table(c.microbatches);
  return min_max_partition(
      static_cast<int>(profile_.num_layers()), s.schedule.num_stages, [&](int j, int a, int e) {
        return static_cast<double>(stage_bytes_total(t, c, s.residency[j], a, e));
      });
}

// The rank of stage j: the V shape for the V-shaped families, j % K for the rest.
int PlanEvaluator::rank_of(const std::string& schedule, int j) const {
  const int K = options_.ranks;
  return schedule::is_v_shaped(schedule) && j >= K ? 2 * K - 1 - j : j % K;
}

double PlanEvaluator::update_of_rank(const Candidate& c, const LayerTable& t, int r) const {
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

double PlanEvaluator::comm(const LayerTable& t, const std::vector<int>& balance) const {
  double worst = 0;
  int first = 0;
  for (std::size_t j = 0; j + 1 < balance.size(); ++j) {
    first += balance[j];
    worst = std::max(worst, profile_.transfer.seconds(t.input_of[first]));
  }
  return options_.ranks > 1 ? worst : 0.0;
}

double PlanEvaluator::lower_bound(const Candidate& c) {
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
double PlanEvaluator::step_scale() const {
  return profile_.measured_step_scale_ranks == options_.ranks ? profile_.measured_step_scale : 1.0;
}

// A candidate with its balance fixed as a plan: its memory figures, no times yet.
Plan PlanEvaluator::memory_plan(const Candidate& c, const ScheduleEntry& s) {
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
Plan PlanEvaluator::predict(const Candidate& c, const ScheduleEntry& s) {
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
  auto remote = [&](int a, int b) { return s.schedule.stage_rank[a] != s.schedule.stage_rank[b]; };
  const double message = profile_.transfer.message_seconds;
  int first = 0;
  for (int j = 0; j < S; ++j) {
    const int e = first + c.balance[j];
    const double f = LayerTable::range(t.forward, first, e);
    const double send_forward = j + 1 < S && remote(j, j + 1) ? message : 0.0;
    const double send_backward = j > 0 && remote(j, j - 1) ? message : 0.0;
    costs.forward_per_stage[j] = f + send_forward;
    costs.backward_per_stage[j] = LayerTable::range(t.backward, first, e) + rc * f + send_backward;
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

void PlanEvaluator::fill_memory(Plan& plan, const ScheduleEntry& s) {
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

}  // namespace detail

using detail::Candidate;
using detail::PlanEvaluator;
using detail::ScheduleEntry;

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
  memory.optimizer_state_in_files = options.optimizer_state_in_files;
  memory.parameters_in_files = options.parameters_in_files;
  memory.gradients_in_files = options.gradients_in_files;
  memory.offload_buffer_bytes = options.offload_buffer_bytes;
  memory.data_parallel = options.data_parallel;
  memory.expert_parallel = options.expert_parallel;
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
  detail::check_planner_options(profile, options);
  if (spec.microbatches < 1 || profile.batch_size % spec.microbatches != 0) {
    throw BadInput("evaluate_plan: " + std::to_string(spec.microbatches) +
                   " micro-batches do not divide the batch of " +
                   std::to_string(profile.batch_size) + "; pick a divisor");
  }
  PlannerOptions local = options;
  local.ranks = spec.ranks > 0 ? spec.ranks : options.ranks;
  PlanEvaluator evaluator(profile, local);
  Candidate c = detail::candidate_of(spec);
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

}  // namespace pipetrain::partition
