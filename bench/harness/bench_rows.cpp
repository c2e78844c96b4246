// The child side of the bench: one configuration timed (bench_rows.h).
#include "bench_rows.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/base/median.h"
#include "pipetrain/examples/model_registry.h"
#include "pipetrain/examples/synthetic.h"
#include "pipetrain/models/llama.h"
#include "pipetrain/runtime/distributed.h"
#include "pipetrain/runtime/distributed_pipe.h"
#include "pipetrain/runtime/launcher.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/runtime/step.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/replay.h"
#include "pipetrain/stage/batchnorm.h"
#include "pipetrain/stage/microbatch.h"
#include "pipetrain/stage/precision.h"
#include "pipetrain/train/event_log.h"

namespace pipetrain::bench {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// The suite's model, one mini-batch and its loss. The Python peers build the same.
struct Workload {
  torch::nn::Sequential model;
  torch::Tensor inputs;
  torch::Tensor targets;
  LossFn loss;
};

// `tp`: the tensor-parallel group of a tp row's rank (the llama suites only; default: none).
Workload make_workload(const BenchOptions& a, const parallel::TensorParallel& tp = {}) {
  torch::manual_seed(0);
  Workload w;
  if (a.suite == "mlp" || a.suite == "small") {
    // mlp: 8 x (Linear(width, width) + ReLU), MSE against random targets; small: 16 of them at
    // width 256, where the runtime's cost per action matters.
    const int blocks = a.suite == "mlp" ? 8 : 16;
    for (int l = 0; l < blocks; ++l) {
      w.model->push_back(torch::nn::Linear(a.width, a.width));
      w.model->push_back(torch::nn::ReLU());
    }
    auto data = examples::make_synthetic_regression(a.batch, {a.width}, {a.width}, 1);
    w.inputs = data.inputs;
    w.targets = data.targets;
    w.loss = [](const torch::Tensor& out, const torch::Tensor& y) {
      return torch::mse_loss(out, y);
    };
  } else if (is_llama_suite(a.suite)) {
    // bench_options.h's config, drawn as transformers draws a new model (a tp rank keeps its
    // slices of those values); random ids.
    const models::LlamaConfig config = models::parse_llama_config(llama_bench_config(a.width));
    models::LlamaModel llama =
        models::make_llama(config, models::LlamaBuildOptions().tensor_parallel(tp));
    models::init_llama_random(llama, 0);
    w.model = llama.sequential;
    w.inputs = torch::randint(config.vocab_size, {a.batch, kLlamaSeqLen}, torch::kInt64);
    w.targets = torch::randint(config.vocab_size, {a.batch, kLlamaSeqLen}, torch::kInt64);
    w.loss = models::causal_lm_loss;
    if (tp.split()) {
      w.loss = [tp](const torch::Tensor& logits, const torch::Tensor& targets) {
        return models::vocab_parallel_causal_lm_loss(logits, targets, tp);
      };
    }
  } else {
    examples::ExampleModel m = examples::make_model("cnn", {{"width", a.width}});
    w.model = m.sequential;
    auto data = examples::make_synthetic_classification(a.batch, {1, 28, 28}, 10, 1);
    w.inputs = data.inputs;
    w.targets = data.targets;
    w.loss = m.loss;
  }
  return w;
}

PipeOptions pipe_options_of(const Config& c) {
  return PipeOptions()
      .stages(c.stages * c.virtual_stages)
      .virtual_stages(c.virtual_stages)
      .chunks(c.chunks)
      .schedule(c.schedule)
      .checkpoint(parse_checkpoint(c.checkpoint))
      .precision(parse_precision(c.precision));
}

int64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

void write_timeline(const BenchOptions& a, const Config& c,
                    const std::vector<ActionEvent>& events) {
  train::EventLog log;
  log.add(0, 0, events);
  const std::string path = a.timeline_dir + "/" + a.suite + "-" + c.schedule + ".svg";
  log.write_timeline_svg(path, c.stages,
                         a.suite + " " + c.schedule + ", K=" + std::to_string(c.stages) +
                             " M=" + std::to_string(c.chunks) + " checkpoint " + c.checkpoint,
                         0);
  if (a.log) a.log("bench: wrote " + path);
}

// The compute actions of one step and their durations (us).
schedule::MeasuredDurations compute_durations(const std::vector<ActionEvent>& events) {
  schedule::MeasuredDurations durations;
  for (const ActionEvent& e : events) {
    if (schedule::is_compute(e.action.op)) durations.add(e.action, e.end_us - e.start_us);
  }
  return durations;
}

// ---- in this process ----------------------------------------------------------------------------

// The step of an in-process row (without zero_grad and the optimizer step).
std::function<void()> in_process_step(const Config& c, Workload& w, torch::nn::Sequential& model,
                                      std::optional<Pipe>& pipe, int rank_threads) {
  if (c.runtime == "libtorch") {
    return [&w, model]() mutable { w.loss(model->forward(w.inputs), w.targets).backward(); };
  }
  if (c.runtime == "libtorch-microbatched") {
    const auto sizes = microbatch_sizes(w.inputs.size(0), c.chunks);
    const auto xs = split_microbatches({w.inputs}, sizes);
    const auto ys = split_microbatches({w.targets}, sizes);
    const double rows = static_cast<double>(w.inputs.size(0));
    return [&w, model, sizes, xs, ys, rows]() mutable {
      for (size_t i = 0; i < sizes.size(); ++i) {
        (w.loss(model->forward(xs[i][0]), ys[i][0]) * (sizes[i] / rows)).backward();
      }
    };
  }
  if (c.runtime == "inprocess") {
    pipe.emplace(model, pipe_options_of(c).threads_per_stage(rank_threads));
    return [&w, &pipe] { (*pipe)->train_step(w.inputs, w.targets, w.loss); };
  }
  throw BadInput("unknown --runtime '" + c.runtime +
                 "' (valid: libtorch, libtorch-microbatched, inprocess, multiprocess)");
}

json run_in_process(const BenchOptions& a, const Config& c) {
  at::set_num_threads(a.threads);
  Workload w = make_workload(a);
  std::optional<Pipe> pipe;
  torch::nn::Sequential model = w.model;
  const int rank_threads = c.runtime == "inprocess" ? threads_per_rank(a, c) : a.threads;
  if (c.runtime == "inprocess" && a.suite == "cnn") {
    model = convert_deferred_batch_norm(model, c.chunks);
  }
  const std::function<void()> step = in_process_step(c, w, model, pipe, rank_threads);

  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01));
  std::vector<double> seconds;
  std::vector<schedule::MeasuredDurations> step_durations;
  for (int k = 0; k < a.warmup + a.steps; ++k) {
    const auto start = Clock::now();
    sgd.zero_grad();
    step();
    sgd.step();
    const double elapsed = seconds_between(start, Clock::now());
    if (k < a.warmup) continue;
    seconds.push_back(elapsed);
    if (pipe) step_durations.push_back(compute_durations((*pipe)->last_events()));
  }

  json result = to_json(c);
  result["step_seconds"] = median(seconds);
  result["step_seconds_all"] = seconds;
  result["steps"] = static_cast<int>(seconds.size());
  result["threads"] = {{"ranks", pipe ? c.stages : 1}, {"per_rank", rank_threads}};
  json stashed = json::array();
  json stashed_microbatches = json::array();
  if (pipe) {
    for (const StageAccounting& s : (*pipe)->stage_accounting()) {
      stashed.push_back(s.peak_stashed_bytes);
      stashed_microbatches.push_back(s.peak_stashed_microbatches);
    }
    const schedule::ReplayEfficiency replay =
        schedule::replay_efficiency((*pipe)->schedule(), step_durations, seconds);
    result["simulated_seconds"] = replay.replayed_seconds;
    result["efficiency"] = replay.efficiency;
    if (!a.timeline_dir.empty() && c.purpose == "main" && c.stages > 1) {
      write_timeline(a, c, (*pipe)->last_events());
    }
  }
  result["peak_stashed_bytes"] = stashed;
  result["peak_stashed_microbatches"] = stashed_microbatches;
  result["peak_rss_bytes"] = peak_rss_bytes();
  return result;
}

// ---- one rank of a multiprocess row -------------------------------------------------------------

bool is_receive(schedule::Op op) {
  return op == schedule::Op::kRecvActivation || op == schedule::Op::kRecvGradient;
}

// Where a rank's step time goes: zero_grad + SGD step; the schedule from the step's start to the
// rank's last action's end; what train_step spends after it (the loss collective). Also every
// compute action's duration per timed step and the shortest receive.
struct RankTimes {
  std::vector<double> seconds, optimizer_seconds, schedule_seconds, after_schedule_seconds;
  json actions = json::array();  // per timed step: [stage, op, micro-batch, us] per action
  double min_receive_us = -1;

  void add_step(Clock::time_point start, Clock::time_point step_start, Clock::time_point step_end,
                Clock::time_point end, const std::vector<ActionEvent>& events) {
    seconds.push_back(seconds_between(start, end));
    optimizer_seconds.push_back(seconds_between(start, step_start) +
                                seconds_between(step_end, end));
    double last_end_us = 0;
    json& step_actions = actions.emplace_back(json::array());
    for (const ActionEvent& e : events) {
      last_end_us = std::max(last_end_us, e.end_us);
      const double us = e.end_us - e.start_us;
      if (schedule::is_compute(e.action.op)) {
        step_actions.push_back(
            {e.action.stage, static_cast<int>(e.action.op), e.action.microbatch, us});
      }
      if (is_receive(e.action.op) && (min_receive_us < 0 || us < min_receive_us)) {
        min_receive_us = us;
      }
    }
    schedule_seconds.push_back(last_end_us * 1e-6);
    after_schedule_seconds.push_back(seconds_between(step_start, step_end) - last_end_us * 1e-6);
  }
};

json rank_result(Distributed& distributed, const DistributedPipe& pipe, const RankTimes& t,
                 int threads, double bytes_sent_per_step) {
  json stashes = json::array();
  for (const auto& [j, accounting] : pipe.stage_accounting()) {
    stashes.push_back({{"stage", j},
                       {"peak_stashed_bytes", accounting.peak_stashed_bytes},
                       {"peak_stashed_microbatches", accounting.peak_stashed_microbatches}});
  }
  return {{"rank", distributed.rank()},
          {"tp_rank", distributed.tp_rank()},
          {"step_seconds_all", t.seconds},
          {"optimizer_seconds", median(t.optimizer_seconds)},
          {"schedule_seconds", median(t.schedule_seconds)},
          {"after_schedule_seconds", median(t.after_schedule_seconds)},
          {"actions", t.actions},
          {"stashes", stashes},
          {"min_receive_us", std::max(0.0, t.min_receive_us)},
          {"threads", threads},
          {"bytes_sent_per_step", bytes_sent_per_step},
          {"peak_rss_bytes", peak_rss_bytes()}};
}

// ---- a multiprocess row: its ranks' results merged
// ------------------------------------------------

[[noreturn]] void row_failed(const Config& c, const std::string& why) {
  throw PeerFailed("multiprocess " + c.label() + ": " + why);
}

// The ranks' results as one row: per step the slowest rank's time, every rank's compute actions
// for the replay, the shortest receive, the largest RSS, each stage's stash from its rank.
struct MergedRanks {
  std::vector<double> seconds;
  std::vector<schedule::MeasuredDurations> step_durations;
  double comm_us = -1;
  int64_t rss = 0;
  double bytes_sent_per_step = 0;  // every rank's tensor bytes, summed
  json threads = json::array();
  json phases = json::array();
  std::vector<std::optional<std::pair<int64_t, int64_t>>> stashes;  // per stage j

  void add_rank(const Config& c, int r, const json& result) {
    const auto steps = result["step_seconds_all"].get<std::vector<double>>();
    if (seconds.empty()) seconds.assign(steps.size(), 0.0);
    for (size_t k = 0; k < steps.size() && k < seconds.size(); ++k) {
      seconds[k] = std::max(seconds[k], steps[k]);
    }
    // The tp ranks of a stage run the same actions: its replay takes tp rank 0's.
    const json& actions = result["actions"];
    if (step_durations.empty()) step_durations.resize(actions.size());
    for (size_t k = 0;
         k < actions.size() && k < step_durations.size() && result.value("tp_rank", 0) == 0; ++k) {
      for (const json& action : actions[k]) {
        step_durations[k].add(
            schedule::Action{action[0].get<int>(), static_cast<schedule::Op>(action[1].get<int>()),
                             action[2].get<int>()},
            action[3].get<double>());
      }
    }
    const double receive = result["min_receive_us"].get<double>();
    if (comm_us < 0 || receive < comm_us) comm_us = receive;
    rss = std::max(rss, result["peak_rss_bytes"].get<int64_t>());
    bytes_sent_per_step += result.value("bytes_sent_per_step", 0.0);
    threads.push_back(result["threads"]);
    phases.push_back({{"rank", r},
                      {"optimizer_seconds", result["optimizer_seconds"]},
                      {"schedule_seconds", result["schedule_seconds"]},
                      {"after_schedule_seconds", result["after_schedule_seconds"]}});
    for (const json& stash : result["stashes"]) {
      const int j = stash["stage"].get<int>();
      if (j < 0 || j >= static_cast<int>(stashes.size())) {
        row_failed(c, "rank " + std::to_string(r) + " reported stage " + std::to_string(j) +
                          " of " + std::to_string(stashes.size()));
      }
      stashes[static_cast<size_t>(j)] =
          std::make_pair(stash["peak_stashed_bytes"].get<int64_t>(),
                         stash["peak_stashed_microbatches"].get<int64_t>());
    }
  }
};

json run_multiprocess(const BenchOptions& a, const Config& c) {
  std::vector<std::string> args = a.child_arguments;
  args.push_back("--rank-worker");
  for (const auto& flag : config_flags(a, c)) args.push_back(flag);
  const int ranks = c.stages * c.tp;
  const CollectedRun run = launch_self_collecting(ranks, args, kResultPrefix);
  if (run.launched.exit_code != 0) {
    row_failed(c, "rank " + std::to_string(run.launched.first_failed_rank) + " exited with " +
                      std::to_string(run.launched.exit_code) + " (its stderr is above)");
  }
  const int num_stages = c.stages * c.virtual_stages;
  MergedRanks merged;
  merged.stashes.resize(static_cast<size_t>(num_stages));
  for (int r = 0; r < ranks; ++r) {
    const auto& line = run.results.at(static_cast<size_t>(r));
    if (!line) row_failed(c, "rank " + std::to_string(r) + " printed no result");
    merged.add_rank(c, r, json::parse(*line));
  }
  json stashed = json::array();
  json stashed_microbatches = json::array();
  for (int j = 0; j < num_stages; ++j) {
    const auto& stash = merged.stashes[static_cast<size_t>(j)];
    if (!stash)
      row_failed(c, "no rank reported stage " + std::to_string(j) + "'s stash accounting");
    stashed.push_back(stash->first);
    stashed_microbatches.push_back(stash->second);
  }
  const schedule::Schedule lowered =
      schedule::lower(schedule::make_schedule(c.schedule, c.stages, c.chunks, c.virtual_stages));
  const double comm_us = std::max(0.0, merged.comm_us);
  const schedule::ReplayEfficiency replay =
      schedule::replay_efficiency(lowered, merged.step_durations, merged.seconds, comm_us);
  json row = to_json(c);
  row["step_seconds"] = median(merged.seconds);
  row["step_seconds_all"] = merged.seconds;
  row["steps"] = static_cast<int>(merged.seconds.size());
  row["threads"] = {{"ranks", ranks}, {"per_rank", merged.threads[0]}};
  row["comm_seconds"] = comm_us * 1e-6;
  row["rank_phases"] = merged.phases;
  row["simulated_seconds"] = replay.replayed_seconds;
  row["efficiency"] = replay.efficiency;
  row["peak_stashed_bytes"] = stashed;
  row["peak_stashed_microbatches"] = stashed_microbatches;
  row["peak_rss_bytes"] = merged.rss;
  row["transport_bytes_per_step"] = merged.bytes_sent_per_step;
  return row;
}

}  // namespace

json run_config_here(const BenchOptions& a, const Config& c) {
  if (c.runtime == "multiprocess") return run_multiprocess(a, c);
  return run_in_process(a, c);
}

int run_rank(const BenchOptions& a, const Config& c) {
  DistributedOptions options;
  options.pipeline_ranks(c.stages).tensor_parallel(c.tp).timeout(std::chrono::seconds(120));
  return run_distributed(options, [&](Distributed& distributed) {
    const int threads = threads_per_rank(a, c);
    at::set_num_threads(threads);
    Workload w = make_workload(
        a, parallel::TensorParallel{distributed.tensor_parallel_group(), c.sequence_parallel});
    torch::nn::Sequential model = w.model;
    if (a.suite == "cnn") model = convert_deferred_batch_norm(model, c.chunks);
    DistributedPipe pipe(distributed, model, pipe_options_of(c));
    // Under sequence parallelism the whole (replicated) tensors' gradients are summed over the tp
    // group after the backward, as the trainer does (train/step_runner.h): part of the step.
    std::vector<torch::Tensor> sequence_shared;
    if (c.sequence_parallel) {
      sequence_shared = models::tensor_parallel_whole_parameters(
          pipe.named_parameters(), models::parse_llama_config(llama_bench_config(a.width)), c.tp);
    }
    torch::optim::SGD sgd(pipe.parameters(), torch::optim::SGDOptions(0.01));
    RankTimes times;
    int64_t sent_before = 0;
    for (int k = 0; k < a.warmup + a.steps; ++k) {
      if (k == a.warmup) sent_before = pipe.transport_stats().data_bytes_sent;
      distributed.barrier();  // every rank starts the step together; not timed
      const auto start = Clock::now();
      sgd.zero_grad();
      const auto step_start = Clock::now();
      pipe.train_step(w.inputs, w.targets, w.loss);  // ends with the loss collective
      distributed.allreduce_tensor_parallel_gradients(sequence_shared);
      const auto step_end = Clock::now();
      sgd.step();
      const auto end = Clock::now();
      if (k >= a.warmup) times.add_step(start, step_start, step_end, end, pipe.last_events());
    }
    const double sent_per_step =
        static_cast<double>(pipe.transport_stats().data_bytes_sent - sent_before) / a.steps;
    std::cout << kResultPrefix
              << rank_result(distributed, pipe, times, threads, sent_per_step).dump() << std::endl;
  });
}

}  // namespace pipetrain::bench
