// Calibration measurements of the planner (plan_calibration.h).
#include "pipetrain/tune/calibration.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <memory>
#include <stdexcept>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>

#include "pipetrain/base/error.h"
#include "pipetrain/base/median.h"
#include "pipetrain/runtime/distributed_pipe.h"
#include "pipetrain/schedule/action.h"
#include "pipetrain/tune/plan_options.h"

namespace pipetrain::tune {
namespace {

namespace pp = pipetrain::partition;

// Per step: the seconds of compute actions per rank and the last action's end (seconds since the
// step's start); medians over the timed steps (the first 2 are warm-up). With one rank, every
// event counts for it (a DistributedPipe's events are this process's).
class StepRecorder {
 public:
  explicit StepRecorder(int ranks) : busy_(static_cast<std::size_t>(ranks)) {}

  void record(const std::vector<ActionEvent>& events) {
    std::vector<double> busy(busy_.size(), 0.0);
    double span = 0;
    for (const auto& event : events) {
      const std::size_t r = busy.size() == 1 ? 0 : static_cast<std::size_t>(event.rank);
      if (schedule::is_compute(event.action.op) && r < busy.size()) {
        busy[r] += (event.end_us - event.start_us) * 1e-6;
      }
      span = std::max(span, event.end_us * 1e-6);
    }
    for (std::size_t r = 0; r < busy.size(); ++r) busy_[r].push_back(busy[r]);
    span_.push_back(span);
  }

  std::vector<double> busy_by_rank() const {
    std::vector<double> medians;
    for (const auto& steps : busy_) medians.push_back(timed_median(steps));
    return medians;
  }
  double span() const { return timed_median(span_); }

 private:
  static double timed_median(const std::vector<double>& steps) {
    return steps.size() > 2 ? upper_median({steps.begin() + 2, steps.end()}) : 0.0;
  }

  std::vector<std::vector<double>> busy_;
  std::vector<double> span_;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The timed step loop both runtimes share, for `plans` plans run together: in each round one step
// of every plan in turn (zero_grad + train_step(k) + SGD step of plan k), `steps` rounds timed
// after 2 warm-up rounds; `before_step` runs untimed before each step (a barrier across
// processes). Plans taking turns step by step see the same machine: a slow spell of this host
// slows all of them alike. Returns the timed seconds per plan.
template <typename TrainStep>
std::vector<std::vector<double>> timed_steps(std::vector<torch::optim::SGD>& sgds, int steps,
                                             const TrainStep& train_step,
                                             const std::function<void()>& before_step = {}) {
  std::vector<std::vector<double>> seconds(sgds.size());
  for (int step = 0; step < steps + 2; ++step) {
    for (std::size_t k = 0; k < sgds.size(); ++k) {
      if (before_step) before_step();
      const auto start = std::chrono::steady_clock::now();
      sgds[k].zero_grad();
      train_step(k);
      sgds[k].step();
      if (step >= 2) seconds[k].push_back(seconds_since(start));
    }
  }
  return seconds;
}

torch::Tensor zeros_target(torch::nn::Sequential& model, const torch::Tensor& sample) {
  torch::NoGradGuard no_grad;
  return torch::zeros_like(model->forward(sample));
}

torch::Tensor mse(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::mse_loss(output, target);
}

}  // namespace

RandomStateGuard::RandomStateGuard() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  state_ = generator.get_state();
}

RandomStateGuard::~RandomStateGuard() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state_);
}

ModelStateGuard::ModelStateGuard(torch::nn::Sequential& model, bool copy_parameters)
    : model_(model) {
  for (const auto& parameter : model_->parameters()) {
    parameters_.push_back(copy_parameters ? parameter.detach().clone() : torch::Tensor());
  }
  for (const auto& buffer : model_->buffers()) buffers_.push_back(buffer.detach().clone());
  for (const auto& module : model_->modules(/*include_self=*/false)) {
    if (auto* norm = dynamic_cast<DeferredBatchNormImpl*>(module.get())) {
      tracked_.emplace_back(norm, norm->tracked_state());
    }
  }
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator_state_ = generator.get_state();
}

ModelStateGuard::~ModelStateGuard() {
  torch::NoGradGuard no_grad;
  const std::vector<torch::Tensor> parameters = model_->parameters();
  for (std::size_t q = 0; q < parameters.size() && q < parameters_.size(); ++q) {
    if (parameters_[q].defined()) parameters[q].copy_(parameters_[q]);
    parameters[q].mutable_grad().reset();
  }
  const std::vector<torch::Tensor> buffers = model_->buffers();
  for (std::size_t q = 0; q < buffers.size() && q < buffers_.size(); ++q) {
    buffers[q].copy_(buffers_[q]);
  }
  for (const auto& [norm, state] : tracked_) norm->restore_tracked_state(state);
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(generator_state_);
}

double Measured::busy_seconds_per_rank() const {
  double mean = 0;
  for (double busy : busy_seconds_by_rank) {
    mean += busy / static_cast<double>(busy_seconds_by_rank.size());
  }
  return mean;
}

std::vector<Measured> measure_in_process(torch::nn::Sequential& model, const torch::Tensor& sample,
                                         const std::vector<pp::Plan>& plans, int threads, int steps,
                                         Precision precision) {
  std::vector<Pipe> pipes;
  std::vector<torch::optim::SGD> sgds;
  std::vector<StepRecorder> recorders;
  for (const pp::Plan& plan : plans) {
    pipes.emplace_back(model,
                       pipe_options_for(plan).threads_per_stage(threads).precision(precision));
    sgds.emplace_back(pipes.back()->parameters(), torch::optim::SGDOptions(1e-4));
    recorders.emplace_back(plan.ranks);
  }
  const torch::Tensor target = zeros_target(model, sample);
  const auto seconds = timed_steps(sgds, steps, [&](std::size_t k) {
    pipes[k]->train_step(sample, target, mse);
    recorders[k].record(pipes[k]->last_events());
  });
  std::vector<Measured> measured(plans.size());
  for (std::size_t k = 0; k < plans.size(); ++k) {
    measured[k].step_seconds = seconds[k];
    measured[k].median_seconds = upper_median(seconds[k]);
    measured[k].busy_seconds_by_rank = recorders[k].busy_by_rank();
    measured[k].span_seconds = recorders[k].span();
    for (const auto& stage : pipes[k]->stage_accounting()) {
      measured[k].peak_stashed_bytes.push_back(stage.peak_stashed_bytes);
    }
  }
  return measured;
}

Measured measure_in_process(torch::nn::Sequential& model, const torch::Tensor& sample,
                            const pp::Plan& plan, int threads, int steps, Precision precision) {
  return measure_in_process(model, sample, std::vector<pp::Plan>{plan}, threads, steps, precision)
      .front();
}

// Run the whole model as one stage (K = 1) with small micro-batches, where fixed costs show most.
// [1] gpipe: the gap between measured compute and the profile's prediction, spread over the
// 2 * M * L layer calls, is the per-layer overhead. [2] zb-h1 with that overhead: what remains of
// the gap scales the split backward (I + W). [3] K copies of the model run the [1] step on K
// threads at once.
namespace {

void warn(const Diagnostics& diagnostics, const std::string& text) {
  if (diagnostics) diagnostics({Diagnostic::Kind::kWarning, text});
}

// [1] and [2]: gpipe and zb-h1 on the whole model as one stage with M = `one_stage.microbatches`,
// in 3 rounds, each parameter the median over the rounds (one run of a few steps varies by tens of
// percent on a busy machine). Returns the predicted gpipe plan, which [3] runs again.
pp::Plan calibrate_overheads(torch::nn::Sequential& model, const torch::Tensor& sample,
                             pp::ModelProfile& profile, const pp::PlannerOptions& single,
                             const pp::Plan& one_stage, const Diagnostics& diagnostics) {
  const int microbatches = one_stage.microbatches;
  const double layers = static_cast<double>(profile.num_layers());
  double split = 0;  // the profile's I + W for one micro-batch of the whole model
  for (std::int64_t l = 0; l < profile.num_layers(); ++l) {
    const pp::LayerCost c = profile.layer_cost(l, profile.batch_size / microbatches);
    split += c.backward_input_seconds + c.backward_weight_seconds;
  }
  pp::Plan gpipe = one_stage, zb = one_stage;
  gpipe.schedule = "gpipe";
  zb.schedule = "zb-h1";
  gpipe = pp::evaluate_plan(profile, gpipe, single);
  // false when zb-h1 cannot train the model as one stage (e.g. a layer that modifies its input in
  // place, which the split backward refuses).
  bool split_runs = true;
  std::vector<double> overheads, splits;
  for (int round = 0; round < 3; ++round) {
    // The two run together, in turn step by step.
    std::vector<Measured> measured;
    if (split_runs) {
      try {
        measured = measure_in_process(model, sample, {gpipe, zb}, profile.intra_op_threads, 3,
                                      parse_precision(profile.precision));
      } catch (const std::exception& error) {
        std::string reason = error.what();
        reason = reason.substr(0, reason.find('\n'));
        warn(diagnostics, "plan: zb-h1 cannot train this model as one stage (" + reason +
                              "); the split backward is not calibrated");
        split_runs = false;
      }
    }
    if (!split_runs) {
      measured =
          measure_in_process(model, sample, std::vector<pp::Plan>{gpipe}, profile.intra_op_threads,
                             3, parse_precision(profile.precision));
    }
    pp::ModelProfile trial = profile;  // [1]
    trial.per_layer_overhead_seconds =
        std::max(0.0, (measured[0].busy_seconds_per_rank() - gpipe.makespan_seconds) /
                          (2 * microbatches * layers));
    overheads.push_back(trial.per_layer_overhead_seconds);
    const pp::Plan predicted = pp::evaluate_plan(trial, zb, single);  // [2], this round's overhead
    if (split_runs && split > 0) {
      const double gap =
          (measured[1].busy_seconds_per_rank() - predicted.makespan_seconds) / microbatches;
      splits.push_back(std::max(0.5, 1 + gap / split));
    }
  }
  profile.per_layer_overhead_seconds = upper_median(overheads);
  if (!splits.empty()) profile.split_backward_scale = upper_median(splits);
  return gpipe;
}

// [3] All ranks at once: `gpipe` on `ranks` threads together, each with its own copy of the model
// and the same intra-op threads, over the same step alone, in 3 rounds (alone, then together);
// the median of the rounds' ratios (a machine that changes speed between rounds moves both sides
// of a ratio alike).
void calibrate_concurrency(torch::nn::Sequential& model, const torch::Tensor& sample,
                           pp::ModelProfile& profile, int ranks, const pp::Plan& gpipe,
                           const Diagnostics& diagnostics) {
  std::vector<torch::nn::Sequential> copies;
  try {
    for (int r = 0; r < ranks; ++r) {
      copies.push_back(
          std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone(torch::kCPU)));
    }
  } catch (const c10::Error&) {
    warn(diagnostics,
         "plan: a layer of this model cannot be cloned; not calibrating for concurrent ranks");
    return;
  }
  auto busy_of = [&](torch::nn::Sequential& copy) {
    return measure_in_process(copy, sample, gpipe, profile.intra_op_threads, 3,
                              parse_precision(profile.precision))
        .busy_seconds_per_rank();
  };
  std::vector<double> ratios;
  for (int round = 0; round < 3; ++round) {
    const double alone = busy_of(copies[0]);
    std::vector<double> together(copies.size(), 0.0);
    std::vector<std::exception_ptr> failed(copies.size());
    std::vector<std::thread> threads;
    for (std::size_t r = 0; r < copies.size(); ++r) {
      threads.emplace_back([&, r] {
        try {
          together[r] = busy_of(copies[r]);
        } catch (...) {
          failed[r] = std::current_exception();
        }
      });
    }
    for (auto& thread : threads) thread.join();
    for (const auto& error : failed) {
      if (error) std::rethrow_exception(error);
    }
    double mean = 0;
    for (double busy : together) mean += busy / static_cast<double>(together.size());
    if (alone > 0) ratios.push_back(mean / alone);
  }
  if (!ratios.empty()) {
    profile.concurrent_compute_scale = upper_median(ratios);
    profile.concurrent_ranks = ranks;
  }
}

}  // namespace

void calibrate_in_process(torch::nn::Sequential& model, const torch::Tensor& sample,
                          pp::ModelProfile& profile, const pp::PlannerOptions& planner,
                          const Diagnostics& diagnostics) {
  int microbatches = 1;
  while (microbatches < 16 && profile.batch_size % (microbatches * 2) == 0) microbatches *= 2;
  pp::Plan one_stage;
  one_stage.ranks = 1;
  one_stage.microbatches = microbatches;
  one_stage.balance = {static_cast<int>(profile.num_layers())};
  pp::PlannerOptions single = planner;
  single.ranks = 1;
  profile.per_layer_overhead_seconds = 0;
  profile.split_backward_scale = 1;
  profile.calibrated = true;
  const pp::Plan gpipe =
      calibrate_overheads(model, sample, profile, single, one_stage, diagnostics);  // [1] [2]
  profile.concurrent_compute_scale = 1;
  profile.concurrent_ranks = 1;
  if (planner.ranks >= 2) {
    calibrate_concurrency(model, sample, profile, planner.ranks, gpipe, diagnostics);  // [3]
  }
}

// ---- K processes --------------------------------------------------------------------------------

nlohmann::json plan_to_run(const pp::Plan& plan, int threads, Precision precision) {
  nlohmann::json run = plan;  // partition::Plan's to_json
  run["threads"] = threads;
  run["precision"] = to_string(precision);
  return run;
}

nlohmann::json run_plans_on_rank(Distributed& distributed, torch::nn::Sequential& model,
                                 const torch::Tensor& sample, const nlohmann::json& runs,
                                 int steps) {
  if (!runs.is_array() || runs.empty()) {
    throw BadInput("run_plans_on_rank: give a non-empty array of plans to run");
  }
  at::set_num_threads(runs.front().at("threads").get<int>());
  const torch::Tensor target = zeros_target(model, sample);
  std::vector<std::unique_ptr<DistributedPipe>> pipes;
  std::vector<torch::optim::SGD> sgds;
  std::vector<StepRecorder> recorders;
  for (const auto& run : runs) {
    const Precision precision = parse_precision(run.value("precision", std::string("fp32")));
    pipes.push_back(std::make_unique<DistributedPipe>(
        distributed, model, pipe_options_for(run.get<pp::Plan>()).precision(precision)));
    sgds.emplace_back(pipes.back()->parameters(), torch::optim::SGDOptions(1e-4));
    recorders.emplace_back(1);
  }
  const auto seconds = timed_steps(
      sgds, steps,
      [&](std::size_t k) {
        pipes[k]->train_step(sample, target, mse);
        recorders[k].record(pipes[k]->last_events());
      },
      [&] { distributed.barrier(); });
  nlohmann::json results = nlohmann::json::array();
  for (std::size_t k = 0; k < pipes.size(); ++k) {
    nlohmann::json stashed = nlohmann::json::array();
    for (const auto& [j, accounting] : pipes[k]->stage_accounting()) {
      stashed.push_back({{"stage", j}, {"bytes", accounting.peak_stashed_bytes}});
    }
    results.push_back({{"rank", distributed.rank()},
                       {"seconds", seconds[k]},
                       {"busy_seconds", recorders[k].busy_by_rank()[0]},
                       {"span_seconds", recorders[k].span()},
                       {"stashed", stashed}});
  }
  return results;
}

nlohmann::json plans_to_run(const std::vector<pp::Plan>& plans, int threads, Precision precision) {
  nlohmann::json runs = nlohmann::json::array();
  for (const pp::Plan& plan : plans) runs.push_back(plan_to_run(plan, threads, precision));
  return runs;
}

std::vector<Measured> combine_rank_results(
    const std::vector<pp::Plan>& plans, const std::vector<std::optional<nlohmann::json>>& ranks) {
  std::vector<Measured> all;
  for (std::size_t k = 0; k < plans.size(); ++k) {
    const pp::Plan& plan = plans[k];
    std::vector<double> steps;
    Measured measured;
    measured.peak_stashed_bytes.assign(plan.balance.size(), 0);
    for (int r = 0; r < plan.ranks; ++r) {
      if (static_cast<std::size_t>(r) >= ranks.size() || !ranks[static_cast<std::size_t>(r)] ||
          ranks[static_cast<std::size_t>(r)]->size() != plans.size()) {
        throw TransportFailure("rank " + std::to_string(r) + " of a " + plan.describe() +
                               " run printed no result for it");
      }
      const nlohmann::json& result = ranks[static_cast<std::size_t>(r)]->at(k);
      const auto seconds = result.at("seconds").get<std::vector<double>>();
      if (steps.empty()) steps.assign(seconds.size(), 0.0);
      for (std::size_t s = 0; s < seconds.size() && s < steps.size(); ++s) {
        steps[s] = std::max(steps[s], seconds[s]);
      }
      measured.busy_seconds_by_rank.push_back(result.at("busy_seconds").get<double>());
      measured.span_seconds =
          std::max(measured.span_seconds, result.at("span_seconds").get<double>());
      for (const auto& stage : result.at("stashed")) {
        const auto j = stage.at("stage").get<std::size_t>();
        if (j < measured.peak_stashed_bytes.size()) {
          measured.peak_stashed_bytes[j] = stage.at("bytes").get<std::int64_t>();
        }
      }
    }
    if (steps.empty())
      throw Error(ErrorKind::Runtime, "a " + plan.describe() + " run timed no steps");
    measured.step_seconds = steps;
    measured.median_seconds = upper_median(steps);
    all.push_back(std::move(measured));
  }
  return all;
}

nlohmann::json ping_pong_on_rank(Distributed& distributed, const nlohmann::json& job) {
  if (distributed.replica() != 0 || distributed.pipeline_rank() > 1 ||
      distributed.layout().pipeline_ranks < 2) {
    return nullptr;
  }
  auto transport = distributed.make_transport({0, 1});
  const int me = distributed.pipeline_rank();
  const int trips = job.value("trips", 30);
  nlohmann::json sizes = nlohmann::json::array();
  int microbatch = 0;
  for (const auto bytes : job.at("bytes").get<std::vector<std::int64_t>>()) {
    const torch::Tensor payload = torch::ones({std::max<std::int64_t>(1, bytes / 4)});
    std::vector<double> round_trips, sends;
    for (int trip = 0; trip < 5 + trips; ++trip, ++microbatch) {
      const Envelope forward{0, 1, microbatch, Payload::kActivation};
      const Envelope backward{1, 0, microbatch, Payload::kGradient};
      const auto start = std::chrono::steady_clock::now();
      if (me == 0) {
        transport->send(forward, Bundle{{payload}, {}});
        const double sent = seconds_since(start);
        (void)transport->recv(backward);
        if (trip >= 5) {
          sends.push_back(sent);
          round_trips.push_back(seconds_since(start));
        }
      } else {
        (void)transport->recv(forward);
        transport->send(backward, Bundle{{payload}, {}});
      }
    }
    if (me == 0) {
      sizes.push_back({{"bytes", payload.numel() * 4},
                       {"round_trip_seconds", upper_median(round_trips)},
                       {"send_seconds", upper_median(sends)}});
    }
  }
  transport->flush();
  if (me != 0) return nullptr;
  return {{"sizes", sizes}};
}

nlohmann::json transfer_job(std::int64_t large) {
  return {
      {"mode", "transfer"}, {"bytes", {4, std::max<std::int64_t>(large, 1 << 16)}}, {"trips", 30}};
}

pp::TransferModel transfer_model_from(const nlohmann::json& result) {
  const auto& sizes = result.at("sizes");
  const double small_trip = sizes[0].at("round_trip_seconds").get<double>();
  const double large_trip = sizes[1].at("round_trip_seconds").get<double>();
  pp::TransferModel model;
  model.latency_seconds = small_trip / 2;
  const double extra = (large_trip - small_trip) / 2;
  const auto extra_bytes = static_cast<double>(sizes[1].at("bytes").get<std::int64_t>() - 4);
  model.bytes_per_second =
      extra > 0 ? extra_bytes / extra : std::numeric_limits<double>::infinity();
  model.message_seconds = sizes[0].at("send_seconds").get<double>();
  model.method = "2 processes, Gloo over loopback (bundle ping-pong, one way)";
  return model;
}

std::int64_t largest_boundary_bytes(const pp::ModelProfile& profile) {
  std::int64_t largest = 0;
  const std::int64_t rows = std::max<std::int64_t>(1, profile.batch_size / 4);
  for (std::int64_t l = 0; l < profile.num_layers(); ++l) {
    largest = std::max(largest, profile.layer_cost(l, rows).output_bytes);
  }
  return largest;
}

// [4a] Compute: K processes on a small machine compute slower than K threads of one process
// ([3]): each process also runs Gloo's threads, and the isolated layers of the profile do not
// scale with the micro-batch size as a chained run does. The ranks' measured compute over the
// predicted (without the message charge), at each of the two micro-batch sizes, the median over
// its runs, is the profile's process_compute_scale. The layers do not all drift alike (the CNN's
// convolutions on rank 0 measured 0.89 of their prediction where its linear layers on rank 1
// measured 1.24): each rank's ratio over the whole's, the median over the four runs, becomes
// process_layer_scale for the layers that rank held.
// [4b] Messages: a message also costs the CPU of Gloo's threads on both sides, which the send()
// call measured by the transfer does not show. The per-message cost that makes the predicted
// difference between few and many micro-batches equal the measured one (their fixed costs
// cancel), from two rounds of both.
// [4c] Step overhead: what the measured step times still exceed the predicted by (the median of
// the four runs): the loss broadcast and the step's setup, outside the simulated schedule.
namespace {

// A plan and its runs as processes.
struct PlanRuns {
  pp::Plan plan;
  std::vector<Measured> measured;
};

// [4a] The ranks' measured compute over the predicted at the two micro-batch sizes, and each
// layer's rank factor (the even balance of the two plans: stage r on rank r).
void fit_process_compute(pp::ModelProfile& profile, const pp::PlannerOptions& planner,
                         const PlanRuns& few, const PlanRuns& many) {
  pp::ModelProfile bare = profile;
  bare.transfer.message_seconds = 0;
  bare.process_compute_scale.clear();
  bare.process_layer_scale.clear();
  const auto ranks = static_cast<std::size_t>(planner.ranks);
  std::vector<std::vector<double>> relative(ranks);  // per rank: its ratio over the whole's
  auto scale_of = [&](const PlanRuns& runs) {
    const pp::Plan predicted = pp::evaluate_plan(bare, runs.plan, planner);
    double want = 0;
    for (double busy : predicted.busy_seconds_per_rank) want += busy;
    std::vector<double> ratios;
    for (const Measured& measured : runs.measured) {
      double got = 0;
      for (double busy : measured.busy_seconds_by_rank) got += busy;
      if (!(want > 0 && got > 0) || measured.busy_seconds_by_rank.size() != ranks) continue;
      ratios.push_back(got / want);
      for (std::size_t r = 0; r < ranks; ++r) {
        const double want_r = predicted.busy_seconds_per_rank.at(r);
        const double got_r = measured.busy_seconds_by_rank[r];
        if (want_r > 0 && got_r > 0) relative[r].push_back((got_r / want_r) / (got / want));
      }
    }
    return std::make_pair(predicted.microbatch_size, ratios.empty() ? 1.0 : upper_median(ratios));
  };
  profile.process_compute_scale = {scale_of(many), scale_of(few)};
  profile.process_layer_scale.clear();
  if (std::all_of(relative.begin(), relative.end(), [](const auto& r) { return !r.empty(); })) {
    for (std::size_t r = 0; r < ranks; ++r) {
      const double factor = upper_median(relative[r]);
      profile.process_layer_scale.insert(profile.process_layer_scale.end(),
                                         static_cast<std::size_t>(few.plan.balance.at(r)), factor);
    }
  }
}

// [4b] The rank time per message that makes the predicted step-time difference between the two
// equal the measured one, never below the transfer's measured send() time.
void fit_message_seconds(pp::ModelProfile& profile, const pp::PlannerOptions& planner,
                         const PlanRuns& few, const PlanRuns& many) {
  auto predicted_gap = [&](double message) {
    pp::ModelProfile trial = profile;
    trial.transfer.message_seconds = message;
    return pp::evaluate_plan(trial, many.plan, planner).predicted_step_seconds -
           pp::evaluate_plan(trial, few.plan, planner).predicted_step_seconds;
  };
  double measured_gap = 0;
  for (std::size_t k = 0; k < few.measured.size(); ++k) {
    measured_gap += (many.measured[k].median_seconds - few.measured[k].median_seconds) /
                    static_cast<double>(few.measured.size());
  }
  const double x0 = profile.transfer.message_seconds;
  const double step = 1e-3;
  const double slope = (predicted_gap(x0 + step) - predicted_gap(x0)) / step;
  if (slope > 0) {
    const double fitted = x0 + (measured_gap - predicted_gap(x0)) / slope;
    profile.transfer.message_seconds = std::max(x0, fitted);
  }
}

// [4c] What the measured step times still exceed the predicted by (median).
void fit_step_overhead(pp::ModelProfile& profile, const pp::PlannerOptions& planner,
                       const PlanRuns& few, const PlanRuns& many) {
  profile.step_overhead_seconds = 0;
  std::vector<double> residuals;
  for (const PlanRuns* runs : {&few, &many}) {
    const double predicted = pp::evaluate_plan(profile, runs->plan, planner).predicted_step_seconds;
    for (const Measured& measured : runs->measured) {
      residuals.push_back(measured.median_seconds - predicted);
    }
  }
  profile.step_overhead_seconds = std::max(0.0, upper_median(residuals));
}

}  // namespace

void calibrate_processes(pp::ModelProfile& profile, const pp::PlannerOptions& planner,
                         const RunPlans& run) {
  if (planner.ranks < 2 || profile.batch_size % 16 != 0) return;
  auto gpipe_with = [&](int microbatches) {
    PlanRuns runs{pp::default_plan(profile, planner.ranks, microbatches), {}};
    runs.plan.schedule = "gpipe";
    return runs;
  };
  PlanRuns few = gpipe_with(2);
  PlanRuns many = gpipe_with(profile.batch_size % 32 == 0 ? 32 : 16);
  for (int round = 0; round < 2; ++round) {  // the two together, in turn step by step
    std::vector<Measured> both = run({few.plan, many.plan}, 5);
    few.measured.push_back(std::move(both.at(0)));
    many.measured.push_back(std::move(both.at(1)));
  }
  fit_process_compute(profile, planner, few, many);  // [4a]
  fit_message_seconds(profile, planner, few, many);  // [4b]
  fit_step_overhead(profile, planner, few, many);    // [4c]
  profile.transfer.method +=
      "; compute by micro-batch size, rank time per message and step overhead calibrated on the "
      "processes (gpipe M=2 vs M=" +
      std::to_string(many.plan.microbatches) + ")";
}

namespace {

// Steps of a round whose one step (every plan once) takes `round` seconds: at least `min_steps`,
// at most 200, and `min_seconds` in all where that allows.
int steps_for(double round, int min_steps, double min_seconds) {
  const double wanted = round > 0 ? std::ceil(min_seconds / round) : 0.0;
  return std::max(min_steps, static_cast<int>(std::min(wanted, 200.0)));
}

}  // namespace

int steps_to_measure(const std::vector<pp::Plan>& plans, int min_steps, double min_seconds) {
  double round = 0;
  for (const pp::Plan& plan : plans) round += plan.predicted_step_seconds;
  return steps_for(round, min_steps, min_seconds);
}

void recommend_by_measurement(pp::ModelProfile& profile, const pp::PlannerOptions& planner,
                              pp::PlanReport& report, const pp::Plan* reference,
                              const RunPlans& run, int min_steps) {
  if (!report.found()) return;
  const std::vector<pp::Plan> plans = pp::plans_to_measure(report, reference, 3, 0.25);
  // The first round is `min_steps` long and sizes the others by what it measured: the
  // predictions can be far off before this step scales them (a tensor-parallel profile leaves
  // out the group's collectives and predicted a step 14x short, so a round sized by it ran 200
  // steps of 37 ms instead of 1.5 s).
  int count = min_steps;
  std::vector<std::vector<double>> steps(plans.size());
  for (int round = 0; round < kMeasuredRounds; ++round) {
    const std::vector<Measured> measured = run(plans, count);
    double measured_round = 0;
    for (std::size_t k = 0; k < plans.size(); ++k) {
      const std::vector<double>& these = measured.at(k).step_seconds;
      steps[k].insert(steps[k].end(), these.begin(), these.end());
      if (!these.empty()) measured_round += upper_median(these);
    }
    if (round == 0) count = steps_for(measured_round, min_steps, 1.5);
  }
  std::vector<double> medians;
  for (std::size_t k = 0; k < plans.size(); ++k) {
    if (steps[k].empty()) throw Error(ErrorKind::Runtime, plans[k].describe() + " timed no steps");
    medians.push_back(upper_median(steps[k]));
  }
  std::size_t default_index = plans.size();
  for (std::size_t k = 0; reference && k < plans.size(); ++k) {
    if (pp::same_plan(plans[k], *reference)) default_index = k;
  }
  pp::recommend_measured(profile, planner, report, plans, medians,
                         pp::choose_measured(steps, default_index, kKeepDefaultMargin));
}

}  // namespace pipetrain::tune
