// `pipetrain bench`: pipetrain side by side with plain LibTorch and with the Python peers, on the
// same model, batch and thread settings, in one invocation (issues #7, #15; docs/BENCHMARKS.md).
//
//   pipetrain bench [--suite mlp|small|cnn] [--json] [--steps 7] [--warmup 2] [--rounds 3]
//                   [--threads T] [--stages 2] [--chunks 8] [--checkpoint never] [--width W]
//                   [--batch N] [--no-python] [--no-memory] [--python PATH] [--peer-dir bench]
//                   [--timeline-dir DIR] [--quick]
//
// How a run is organised (each configuration in a fresh child process, so that getrusage's
// process-wide, monotonic ru_maxrss is that configuration's peak, and runs cannot disturb one
// another through allocator caches or thread pools):
//
//   parent: plan configurations --> for each: fork+exec self `bench --one ...` (or a Python peer)
//                                          |      child: build model + data, warm up, time
//                                          |      `steps` steps, print one JSON line
//           <-- parse the child's last JSON line <------+
//   parent: ratios (vs plain LibTorch, vs the Python peer), checks, table or --json
//
// One step, for every runtime: zero_grad, forward + loss + backward of the whole mini-batch,
// SGD step. Timed rows:
//   libtorch               the Sequential on the whole batch; T intra-op threads
//   libtorch-microbatched  the same M micro-batches one after another, loss weighted by rows /
//                          batch rows, gradients accumulating; T threads
//   inprocess              Pipe (runtime/pipe.h), K worker threads with max(1, T/K) threads each
//   torchgpipe             torchgpipe 0.0.7's GPipe via bench/torchgpipe_peer.py, K partitions on
//                          the CPU; torch.set_num_threads(T)
//   multiprocess           DistributedPipe (runtime/distributed_pipe.h): K ranks of this binary
//                          started by the local launcher (Gloo over loopback), each with
//                          max(1, T/K) threads; step time = the slowest rank's, per step
//   torch-pipelining       torch.distributed.pipelining (PipelineStage + its schedule of the same
//                          name) via bench/torch_pipelining.py: K ranks started by the pinned
//                          torch's torchrun, Gloo over loopback, max(1, T/K) threads each; step
//                          time = the slowest rank's, per step
//
// Efficiency of a pipelined row = the median over the timed steps of
//   replay(step) / step time,  replay = simulate(its lowered schedule, every compute action costing
//   what it measured in that step), comm 0 in-process; multi-process: comm = the shortest
//   measured receive (a message that had already arrived: the cost of taking it off the wire), a
//   lower bound.
// The replay is the step as the schedule would run it with no waits beyond its dependencies and
// no runtime cost between actions; a step's own durations (not medians over steps) keep a slow
// action on a noisy machine from counting as pipeline overhead. The step time includes zero_grad
// and the SGD step, which the replay does not: they count as overhead (multi-process rows report
// them per rank as rank_phases).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "model_registry.h"
#include "pipetrain/base/load_average.h"
#include "pipetrain/base/median.h"
#include "pipetrain/runtime/distributed.h"
#include "pipetrain/runtime/distributed_pipe.h"
#include "pipetrain/runtime/launcher.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/runtime/step.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/replay.h"
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/stage/batchnorm.h"
#include "pipetrain/stage/microbatch.h"
#include "pipetrain/train/event_log.h"
#include "synthetic.h"

namespace pipetrain::cli {
namespace {

using nlohmann::json;

// The marker of a child's result line on its stdout.
constexpr const char* kResultPrefix = "PIPETRAIN_BENCH_RESULT ";

// ---- settings and configurations ----------------------------------------------------------------

struct BenchArgs {
  std::string suite = "mlp";
  bool json_output = false;
  int steps = 7;
  int warmup = 2;
  int rounds = 0;   // 0: 3, or 1 with --quick
  int threads = 0;  // 0: hardware threads
  int stages = 2;   // K
  int chunks = 8;   // M of the main rows
  std::string checkpoint = "never";
  int width = 0;           // 0: suite default (mlp 1024 features, small 256, cnn 32 channels)
  int batch = 0;           // 0: suite default (mlp 256, small 64, cnn 128)
  bool no_python = false;  // no Python peer rows (torchgpipe, torch-pipelining)
  bool no_memory = false;
  bool no_multiprocess = false;
  bool quick = false;
  std::string python = PIPETRAIN_PYTHON;  // the venv of scripts/bootstrap (torch, torchgpipe)
  std::string peer_dir;                   // empty: bench/ found next to the sources
  std::string timeline_dir;
  double config_timeout = 600;
  // Hidden: the child mode, one configuration; and one rank of a multiprocess configuration.
  bool one = false;
  bool rank_worker = false;
  std::string runtime;
  std::string schedule = "gpipe";
  int virtual_stages = 1;
};

struct Config {
  // libtorch | libtorch-microbatched | inprocess | multiprocess | torchgpipe | torch-pipelining
  std::string runtime;
  std::string schedule = "none";
  int stages = 1;  // K: ranks (worker threads / partitions)
  int virtual_stages = 1;
  int chunks = 1;
  std::string checkpoint = "never";
  std::string purpose = "main";  // main | memory

  std::string label() const {
    std::ostringstream out;
    out << runtime;
    if (schedule != "none") out << " " << schedule;
    out << " K=" << stages;
    if (virtual_stages > 1) out << " V=" << virtual_stages;
    out << " M=" << chunks << " ckpt=" << checkpoint;
    return out.str();
  }
};

json to_json(const Config& c) {
  return {{"runtime", c.runtime}, {"schedule", c.schedule},
          {"stages", c.stages},   {"virtual_stages", c.virtual_stages},
          {"chunks", c.chunks},   {"checkpoint", c.checkpoint},
          {"purpose", c.purpose}};
}

void resolve_defaults(BenchArgs& a) {
  if (a.suite != "mlp" && a.suite != "small" && a.suite != "cnn") {
    throw UsageError("--suite must be mlp, small or cnn (got '" + a.suite + "')");
  }
  if (a.quick) {
    if (a.width == 0) a.width = a.suite == "cnn" ? 8 : 64;
    if (a.batch == 0) a.batch = 32;
  }
  if (a.width == 0) a.width = a.suite == "mlp" ? 1024 : a.suite == "small" ? 256 : 32;
  if (a.batch == 0) a.batch = a.suite == "mlp" ? 256 : a.suite == "small" ? 64 : 128;
  if (a.threads == 0) a.threads = std::max(1u, std::thread::hardware_concurrency());
  if (a.steps < 1) throw UsageError("--steps must be >= 1 (got " + std::to_string(a.steps) + ")");
  if (a.rounds < 0)
    throw UsageError("--rounds must be >= 1 (got " + std::to_string(a.rounds) + ")");
  if (a.rounds == 0) a.rounds = a.quick ? 1 : 3;
  if (a.warmup < 0) throw UsageError("--warmup must be >= 0");
  if (a.stages < 1 || a.chunks < 1) throw UsageError("--stages and --chunks must be >= 1");
  if (a.batch < a.chunks * 2) {
    throw UsageError("--batch " + std::to_string(a.batch) + " is too small for --chunks " +
                     std::to_string(a.chunks) +
                     " and the M=2x memory rows; use >= " + std::to_string(2 * a.chunks));
  }
  if (a.checkpoint != "never" && a.checkpoint != "except_last" && a.checkpoint != "always") {
    throw UsageError("--checkpoint must be always, except_last or never (got '" + a.checkpoint +
                     "')");
  }
}

// The schedules both pipetrain and torch.distributed.pipelining have under the same name (torch
// has no V = 1 zero-bubble schedule, so no zb-h1 peer): each gets a multiprocess row and a
// torch-pipelining row, and the first has a ratio_vs_torch.
constexpr const char* kPeerSchedules[] = {
    "gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-v", "interleaved-zb", "dualpipev"};
// The ones issue #15 set step-time targets for (evaluate_checks).
constexpr const char* kTargetSchedules[] = {"gpipe", "1f1b", "interleaved-1f1b"};

// Stages per rank of the pipelined rows: 2 for interleaved-1f1b and the families that need two
// (schedule::default_virtual_stages), else 1.
int virtual_stages_of(const std::string& schedule) {
  return schedule == "interleaved-1f1b" ? 2 : schedule::default_virtual_stages(schedule);
}

// Whether the schedule takes K ranks and M micro-batches (dualpipev: an even K and M >= 2K).
bool fits(const std::string& schedule, int K, int M) {
  return schedule::shape_error(schedule, K, M, virtual_stages_of(schedule)).empty();
}

// Intra-op threads of each of a pipelined row's K ranks (T split over them, at least 1).
int threads_per_rank(const BenchArgs& a, const Config& c) {
  return std::max(1, a.threads / c.stages);
}

std::vector<Config> plan_configs(const BenchArgs& a) {
  std::vector<Config> configs;
  const int K = a.stages;
  const int M = a.chunks;
  configs.push_back({"libtorch", "none", 1, 1, 1, "never", "main"});
  configs.push_back({"libtorch-microbatched", "none", 1, 1, M, "never", "main"});
  configs.push_back({"inprocess", "gpipe", 1, 1, 1, "never", "main"});
  for (const char* schedule : {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1"}) {
    const int V = virtual_stages_of(schedule);
    configs.push_back({"inprocess", schedule, K, V, M, a.checkpoint, "main"});
  }
  if (!a.no_memory) {
    for (int m : {M, 2 * M}) {
      for (const char* schedule : {"gpipe", "1f1b"}) {
        for (const char* mode : {"never", "except_last", "always"}) {
          Config c{"inprocess", schedule, K, 1, m, mode, "memory"};
          const bool duplicate = std::any_of(configs.begin(), configs.end(), [&](const Config& o) {
            return o.label() == c.label();
          });
          if (!duplicate) configs.push_back(c);
        }
      }
    }
  }
  if (!a.no_multiprocess && K > 1) {
    std::vector<std::string> schedules = {"zb-h1"};
    schedules.insert(schedules.begin(), std::begin(kPeerSchedules), std::end(kPeerSchedules));
    for (const auto& schedule : schedules) {
      if (!fits(schedule, K, M)) continue;
      const int V = virtual_stages_of(schedule);
      configs.push_back({"multiprocess", schedule, K, V, M, a.checkpoint, "main"});
    }
  }
  if (!a.no_python) {
    configs.push_back({"torchgpipe", "gpipe", K, 1, M, a.checkpoint, "main"});
    if (!a.no_multiprocess && K > 1 && a.suite != "cnn") {
      for (const char* schedule : kPeerSchedules) {
        if (!fits(schedule, K, M)) continue;
        const int V = virtual_stages_of(schedule);
        configs.push_back({"torch-pipelining", schedule, K, V, M, a.checkpoint, "main"});
      }
    }
  }
  return configs;
}

// ---- the child: one configuration ---------------------------------------------------------------

struct Workload {
  torch::nn::Sequential model;
  torch::Tensor inputs;
  torch::Tensor targets;
  LossFn loss;
};

Workload make_workload(const BenchArgs& a) {
  torch::manual_seed(0);
  Workload w;
  if (a.suite == "mlp" || a.suite == "small") {
    // mlp: 8 x (Linear(width, width) + ReLU), MSE against random targets; small: 16 of them at
    // width 256, where the runtime's cost per action matters (the Python peers build the same).
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

int64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

void write_timeline(const BenchArgs& a, const Config& c, const std::vector<ActionEvent>& events) {
  train::EventLog log;
  log.add(0, 0, events);
  const std::string path = a.timeline_dir + "/" + a.suite + "-" + c.schedule + ".svg";
  log.write_timeline_svg(path, c.stages,
                         a.suite + " " + c.schedule + ", K=" + std::to_string(c.stages) +
                             " M=" + std::to_string(c.chunks) + " checkpoint " + c.checkpoint,
                         0);
  std::cerr << "bench: wrote " << path << "\n";
}

json run_multiprocess(const BenchArgs& a, const Config& c);

json run_one(const BenchArgs& a, const Config& c) {
  if (c.runtime == "multiprocess") return run_multiprocess(a, c);
  at::set_num_threads(a.threads);
  Workload w = make_workload(a);
  std::function<void()> step;
  std::optional<Pipe> pipe;
  torch::nn::Sequential model = w.model;
  int rank_threads = a.threads;

  if (c.runtime == "libtorch") {
    step = [&] { w.loss(model->forward(w.inputs), w.targets).backward(); };
  } else if (c.runtime == "libtorch-microbatched") {
    const auto sizes = microbatch_sizes(w.inputs.size(0), c.chunks);
    const auto xs = split_microbatches({w.inputs}, sizes);
    const auto ys = split_microbatches({w.targets}, sizes);
    const double rows = static_cast<double>(w.inputs.size(0));
    step = [&, sizes, xs, ys, rows] {
      for (size_t i = 0; i < sizes.size(); ++i) {
        (w.loss(model->forward(xs[i][0]), ys[i][0]) * (sizes[i] / rows)).backward();
      }
    };
  } else if (c.runtime == "inprocess") {
    rank_threads = threads_per_rank(a, c);
    if (a.suite == "cnn") model = convert_deferred_batch_norm(model, c.chunks);
    pipe.emplace(model, PipeOptions()
                            .stages(c.stages * c.virtual_stages)
                            .virtual_stages(c.virtual_stages)
                            .chunks(c.chunks)
                            .schedule(c.schedule)
                            .checkpoint(parse_checkpoint(c.checkpoint))
                            .threads_per_stage(rank_threads));
    step = [&] { (*pipe)->train_step(w.inputs, w.targets, w.loss); };
  } else {
    throw UsageError("unknown --runtime '" + c.runtime +
                     "' (valid: libtorch, libtorch-microbatched, inprocess, multiprocess)");
  }

  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01));
  std::vector<double> seconds;
  std::vector<schedule::MeasuredDurations> step_durations;
  for (int k = 0; k < a.warmup + a.steps; ++k) {
    const auto start = std::chrono::steady_clock::now();
    sgd.zero_grad();
    step();
    sgd.step();
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (k < a.warmup) continue;
    seconds.push_back(elapsed);
    if (pipe) {
      schedule::MeasuredDurations& step_us = step_durations.emplace_back();
      for (const ActionEvent& e : (*pipe)->last_events()) {
        if (schedule::is_compute(e.action.op)) step_us.add(e.action, e.end_us - e.start_us);
      }
    }
  }

  json result = to_json(c);
  result["step_seconds"] = median(seconds);
  result["step_seconds_all"] = seconds;
  result["steps"] = static_cast<int>(seconds.size());
  result["threads"] = pipe ? json{{"ranks", c.stages}, {"per_rank", rank_threads}}
                           : json{{"ranks", 1}, {"per_rank", rank_threads}};
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

// ---- multiprocess: one rank, and the child that launches the K ranks ---------------------------

bool is_receive(schedule::Op op) {
  return op == schedule::Op::kRecvActivation || op == schedule::Op::kRecvGradient;
}

// One rank of a multiprocess configuration (started by launch_local with the torchrun
// environment). Prints one result line: its step times and their parts, every compute action's
// duration per timed step, the shortest receive, its stages' stash accounting of the last step and
// its peak RSS.
int run_rank(const BenchArgs& a, const Config& c) {
  DistributedOptions options;
  options.pipeline_ranks(c.stages).timeout(std::chrono::seconds(120));
  return run_distributed(options, [&](Distributed& distributed) {
    const int threads = threads_per_rank(a, c);
    at::set_num_threads(threads);
    Workload w = make_workload(a);
    torch::nn::Sequential model = w.model;
    if (a.suite == "cnn") model = convert_deferred_batch_norm(model, c.chunks);
    DistributedPipe pipe(distributed, model,
                         PipeOptions()
                             .stages(c.stages * c.virtual_stages)
                             .virtual_stages(c.virtual_stages)
                             .chunks(c.chunks)
                             .schedule(c.schedule)
                             .checkpoint(parse_checkpoint(c.checkpoint)));
    torch::optim::SGD sgd(pipe.parameters(), torch::optim::SGDOptions(0.01));
    std::vector<double> seconds;
    // Where a step's time goes on this rank: zero_grad + SGD step; the schedule from the step's
    // start to this rank's last action's end; what train_step spends after it (collectives).
    std::vector<double> optimizer_seconds, schedule_seconds, after_schedule_seconds;
    json actions = json::array();  // per timed step: [stage, op, micro-batch, us] per action
    double min_receive_us = -1;
    using Clock = std::chrono::steady_clock;
    auto seconds_between = [](Clock::time_point from, Clock::time_point to) {
      return std::chrono::duration<double>(to - from).count();
    };
    for (int k = 0; k < a.warmup + a.steps; ++k) {
      distributed.barrier();  // every rank starts the step together; not timed
      const auto start = Clock::now();
      sgd.zero_grad();
      const auto step_start = Clock::now();
      pipe.train_step(w.inputs, w.targets, w.loss);  // ends with the loss collective
      const auto step_end = Clock::now();
      sgd.step();
      const auto end = Clock::now();
      if (k < a.warmup) continue;
      seconds.push_back(seconds_between(start, end));
      optimizer_seconds.push_back(seconds_between(start, step_start) +
                                  seconds_between(step_end, end));
      double last_end_us = 0;
      json& step_actions = actions.emplace_back(json::array());
      for (const ActionEvent& e : pipe.last_events()) {
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
    json stashes = json::array();
    for (const auto& [j, accounting] : pipe.stage_accounting()) {
      stashes.push_back({{"stage", j},
                         {"peak_stashed_bytes", accounting.peak_stashed_bytes},
                         {"peak_stashed_microbatches", accounting.peak_stashed_microbatches}});
    }
    json result = {{"rank", distributed.rank()},
                   {"step_seconds_all", seconds},
                   {"optimizer_seconds", median(optimizer_seconds)},
                   {"schedule_seconds", median(schedule_seconds)},
                   {"after_schedule_seconds", median(after_schedule_seconds)},
                   {"actions", actions},
                   {"stashes", stashes},
                   {"min_receive_us", std::max(0.0, min_receive_us)},
                   {"threads", threads},
                   {"peak_rss_bytes", peak_rss_bytes()}};
    std::cout << kResultPrefix << result.dump() << std::endl;
  });
}

std::vector<std::string> config_flags(const BenchArgs& a, const Config& c);

// The `--one` child of a multiprocess configuration: launches K ranks of this binary and merges
// their result lines into one row.
json run_multiprocess(const BenchArgs& a, const Config& c) {
  std::vector<std::string> args = config_flags(a, c);
  args.insert(args.begin(), {"bench", "--rank-worker"});
  const CollectedRun run = launch_self_collecting(c.stages, args, kResultPrefix);
  if (run.launched.exit_code != 0) {
    throw std::runtime_error("multiprocess " + c.label() + ": rank " +
                             std::to_string(run.launched.first_failed_rank) + " exited with " +
                             std::to_string(run.launched.exit_code) + " (its stderr is above)");
  }
  std::vector<std::optional<json>> ranks;
  for (const auto& line : run.results) {
    ranks.push_back(line ? std::optional<json>(json::parse(*line)) : std::nullopt);
  }
  std::vector<double> seconds;                              // per step: the slowest rank
  std::vector<schedule::MeasuredDurations> step_durations;  // per timed step, every rank's
  double comm_us = -1;
  int64_t rss = 0;
  json threads = json::array();
  json phases = json::array();  // per rank: medians of the step's parts
  // Per stage j, from the rank that holds it (virtual stages: several per rank).
  const int num_stages = c.stages * c.virtual_stages;
  std::vector<std::optional<std::pair<int64_t, int64_t>>> stashes(static_cast<size_t>(num_stages));
  for (int r = 0; r < c.stages; ++r) {
    const auto& result = ranks[static_cast<size_t>(r)];
    if (!result)
      throw std::runtime_error("multiprocess: rank " + std::to_string(r) + " printed no result");
    const auto steps = (*result)["step_seconds_all"].get<std::vector<double>>();
    if (seconds.empty()) seconds.assign(steps.size(), 0.0);
    for (size_t k = 0; k < steps.size() && k < seconds.size(); ++k) {
      seconds[k] = std::max(seconds[k], steps[k]);
    }
    const json& actions = (*result)["actions"];
    if (step_durations.empty()) step_durations.resize(actions.size());
    for (size_t k = 0; k < actions.size() && k < step_durations.size(); ++k) {
      for (const json& action : actions[k]) {
        step_durations[k].add(
            schedule::Action{action[0].get<int>(), static_cast<schedule::Op>(action[1].get<int>()),
                             action[2].get<int>()},
            action[3].get<double>());
      }
    }
    const double receive = (*result)["min_receive_us"].get<double>();
    if (comm_us < 0 || receive < comm_us) comm_us = receive;
    rss = std::max(rss, (*result)["peak_rss_bytes"].get<int64_t>());
    threads.push_back((*result)["threads"]);
    phases.push_back({{"rank", r},
                      {"optimizer_seconds", (*result)["optimizer_seconds"]},
                      {"schedule_seconds", (*result)["schedule_seconds"]},
                      {"after_schedule_seconds", (*result)["after_schedule_seconds"]}});
    for (const json& stash : (*result)["stashes"]) {
      const int j = stash["stage"].get<int>();
      if (j < 0 || j >= num_stages) {
        throw std::runtime_error("multiprocess: rank " + std::to_string(r) + " reported stage " +
                                 std::to_string(j) + " of " + std::to_string(num_stages));
      }
      stashes[static_cast<size_t>(j)] =
          std::make_pair(stash["peak_stashed_bytes"].get<int64_t>(),
                         stash["peak_stashed_microbatches"].get<int64_t>());
    }
  }
  json stashed = json::array();
  json stashed_microbatches = json::array();
  for (int j = 0; j < num_stages; ++j) {
    const auto& stash = stashes[static_cast<size_t>(j)];
    if (!stash) {
      throw std::runtime_error("multiprocess " + c.label() + ": no rank reported stage " +
                               std::to_string(j) + "'s stash accounting");
    }
    stashed.push_back(stash->first);
    stashed_microbatches.push_back(stash->second);
  }
  const schedule::Schedule lowered =
      schedule::lower(schedule::make_schedule(c.schedule, c.stages, c.chunks, c.virtual_stages));
  json row = to_json(c);
  row["step_seconds"] = median(seconds);
  row["step_seconds_all"] = seconds;
  row["steps"] = static_cast<int>(seconds.size());
  row["threads"] = {{"ranks", c.stages}, {"per_rank", threads[0]}};
  row["comm_seconds"] = std::max(0.0, comm_us) * 1e-6;
  row["rank_phases"] = phases;
  const schedule::ReplayEfficiency replay =
      schedule::replay_efficiency(lowered, step_durations, seconds, std::max(0.0, comm_us));
  row["simulated_seconds"] = replay.replayed_seconds;
  row["efficiency"] = replay.efficiency;
  row["peak_stashed_bytes"] = stashed;
  row["peak_stashed_microbatches"] = stashed_microbatches;
  row["peak_rss_bytes"] = rss;
  return row;
}

// ---- the parent: children, ratios, checks, output -----------------------------------------------

bool file_exists(const std::string& path) {
  return std::ifstream(path).good();
}

// The directory of the Python peers (bench/torchgpipe_peer.py, bench/torch_pipelining.py).
std::string find_peer_dir(const BenchArgs& a) {
  if (!a.peer_dir.empty()) return a.peer_dir;
  std::vector<std::string> candidates;
#ifdef PIPETRAIN_SOURCE_DIR
  candidates.push_back(std::string(PIPETRAIN_SOURCE_DIR) + "/bench");
#endif
  const std::string exe = self_executable();
  const std::string dir = exe.substr(0, exe.rfind('/'));
  candidates.push_back(dir + "/../bench");  // build/pipetrain in the source tree
  candidates.push_back(dir + "/bench");
  for (const auto& c : candidates) {
    if (file_exists(c + "/torch_pipelining.py")) return c;
  }
  return candidates.front();
}

// torchrun of the interpreter's venv (the pinned torch's own launcher).
std::string torchrun_of(const std::string& python) {
  return python.substr(0, python.rfind('/') + 1) + "torchrun";
}

struct ChildOutput {
  int exit_code = -1;
  bool timed_out = false;
  std::string out;
};

// Runs argv[0] with argv (the library's launcher, as one plain program), stdout captured, stderr
// passed through; killed after `timeout` s.
ChildOutput run_child(const std::vector<std::string>& argv, double timeout) {
  LaunchOptions options;
  options.program = argv.at(0);
  options.args.assign(argv.begin() + 1, argv.end());
  options.rank_environment = false;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout * 1e3));
  ChildOutput result;
  options.on_line = [&result](int, bool is_stderr, const std::string& line) {
    if (is_stderr) {
      std::cerr << line << std::endl;
    } else {
      result.out += line + "\n";
    }
  };
  const LaunchResult launched = launch_local(options);
  result.exit_code = launched.exit_code;
  result.timed_out = launched.timed_out;
  return result;
}

// The last line of `out` that parses as a JSON object (after the result prefix, if any).
std::optional<json> last_json_line(const std::string& out) {
  std::istringstream lines(out);
  std::string line;
  std::optional<json> found;
  while (std::getline(lines, line)) {
    if (line.rfind(kResultPrefix, 0) == 0) line = line.substr(std::strlen(kResultPrefix));
    if (line.empty() || line[0] != '{') continue;
    try {
      found = json::parse(line);
    } catch (const json::exception&) {
    }
  }
  return found;
}

std::vector<std::string> common_child_flags(const BenchArgs& a) {
  return {"--suite",   a.suite,
          "--width",   std::to_string(a.width),
          "--batch",   std::to_string(a.batch),
          "--threads", std::to_string(a.threads),
          "--steps",   std::to_string(a.steps),
          "--warmup",  std::to_string(a.warmup)};
}

// The flags that describe configuration `c` to a child (`bench --one` or a rank).
std::vector<std::string> config_flags(const BenchArgs& a, const Config& c) {
  std::vector<std::string> flags = {"--runtime",    c.runtime,
                                    "--schedule",   c.schedule,
                                    "--stages",     std::to_string(c.stages),
                                    "--virtual",    std::to_string(c.virtual_stages),
                                    "--chunks",     std::to_string(c.chunks),
                                    "--checkpoint", c.checkpoint};
  for (const auto& flag : common_child_flags(a)) flags.push_back(flag);
  return flags;
}

// The command line of a Python peer's configuration.
std::vector<std::string> peer_argv(const BenchArgs& a, const Config& c, const std::string& dir) {
  std::vector<std::string> argv;
  if (c.runtime == "torchgpipe") {
    argv = {a.python,   dir + "/torchgpipe_peer.py", "--stages",     std::to_string(c.stages),
            "--chunks", std::to_string(c.chunks),    "--checkpoint", c.checkpoint};
    for (const auto& flag : common_child_flags(a)) argv.push_back(flag);
    return argv;
  }
  // torch-pipelining: K ranks under torchrun, each with pipetrain's per-rank thread count, Gloo on
  // loopback as pipetrain's own ranks (unless GLOO_SOCKET_IFNAME says otherwise). "--" ends
  // torchrun's options: it would take the script's --virtual for its --virtual-local-rank.
  const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
  argv = {"/usr/bin/env",
          std::string("GLOO_SOCKET_IFNAME=") + (interface && *interface ? interface : "lo"),
          torchrun_of(a.python),
          "--nproc-per-node",
          std::to_string(c.stages),
          "--master-addr",
          "127.0.0.1",
          "--master-port",
          std::to_string(find_free_port()),
          "--",
          dir + "/torch_pipelining.py",
          "--suite",
          a.suite,
          "--width",
          std::to_string(a.width),
          "--batch",
          std::to_string(a.batch),
          "--threads",
          std::to_string(threads_per_rank(a, c)),
          "--steps",
          std::to_string(a.steps),
          "--warmup",
          std::to_string(a.warmup),
          "--schedule",
          c.schedule,
          "--virtual",
          std::to_string(c.virtual_stages),
          "--chunks",
          std::to_string(c.chunks)};
  return argv;
}

bool is_peer(const std::string& runtime) {
  return runtime == "torchgpipe" || runtime == "torch-pipelining";
}

json run_config(const BenchArgs& a, const Config& c, const std::string& peer_dir) {
  std::vector<std::string> argv;
  if (is_peer(c.runtime)) {
    argv = peer_argv(a, c, peer_dir);
  } else {
    argv = {self_executable(), "bench", "--one"};
    for (const auto& flag : config_flags(a, c)) argv.push_back(flag);
    if (!a.timeline_dir.empty() && c.purpose == "main" && c.stages > 1 &&
        c.runtime == "inprocess") {
      argv.push_back("--timeline-dir");
      argv.push_back(a.timeline_dir);
    }
  }
  const ChildOutput out = run_child(argv, a.config_timeout);
  json row = to_json(c);
  if (out.timed_out) {
    row["error"] = "timed out after " + std::to_string(a.config_timeout) + " s (--config-timeout)";
    return row;
  }
  auto parsed = last_json_line(out.out);
  if (out.exit_code != 0 || !parsed) {
    row["error"] = "exit code " + std::to_string(out.exit_code) +
                   (parsed ? "" : ", no result line") + " (its stderr is above)";
    return row;
  }
  json merged = *parsed;
  for (auto& [key, value] : row.items()) {
    if (!merged.contains(key)) merged[key] = value;
  }
  merged["purpose"] = c.purpose;
  if (c.runtime == "torchgpipe") {
    merged["threads"] = {{"ranks", 1}, {"per_rank", a.threads}};
  } else if (c.runtime == "torch-pipelining") {
    merged["threads"] = {{"ranks", c.stages}, {"per_rank", threads_per_rank(a, c)}};
  }
  if (is_peer(c.runtime)) merged["peak_stashed_bytes"] = json::array();  // not accounted there
  return merged;
}

bool ok(const json& row) {
  return !row.contains("error") && row.contains("step_seconds");
}

const json* find_row(const json& rows, const std::function<bool(const json&)>& match) {
  for (const json& row : rows) {
    if (ok(row) && match(row)) return &row;
  }
  return nullptr;
}

void add_ratios(json& rows) {
  const json* libtorch = find_row(rows, [](const json& r) { return r["runtime"] == "libtorch"; });
  for (json& row : rows) {
    if (!ok(row)) continue;
    if (libtorch)
      row["ratio_vs_libtorch"] =
          row["step_seconds"].get<double>() / (*libtorch)["step_seconds"].get<double>();
    if (is_peer(row["runtime"])) continue;
    // In-process gpipe rows against torchgpipe with the same stages and chunks (the same
    // checkpoint mode preferred).
    if (row["runtime"] == "inprocess" && row["schedule"] == "gpipe" && row["virtual_stages"] == 1) {
      auto same = [&](const json& r, bool checkpoint) {
        return r["runtime"] == "torchgpipe" && r["stages"] == row["stages"] &&
               r["chunks"] == row["chunks"] &&
               (!checkpoint || r["checkpoint"] == row["checkpoint"]);
      };
      const json* peer = find_row(rows, [&](const json& r) { return same(r, true); });
      if (!peer) peer = find_row(rows, [&](const json& r) { return same(r, false); });
      if (peer) {
        row["ratio_vs_torchgpipe"] =
            row["step_seconds"].get<double>() / (*peer)["step_seconds"].get<double>();
        row["torchgpipe_checkpoint"] = (*peer)["checkpoint"];
      }
    }
    // Multi-process rows against torch.distributed.pipelining's schedule of the same name.
    if (row["runtime"] == "multiprocess") {
      const json* peer = find_row(rows, [&](const json& r) {
        return r["runtime"] == "torch-pipelining" && r["schedule"] == row["schedule"] &&
               r["stages"] == row["stages"] && r["virtual_stages"] == row["virtual_stages"] &&
               r["chunks"] == row["chunks"];
      });
      if (peer) {
        row["ratio_vs_torch"] =
            row["step_seconds"].get<double>() / (*peer)["step_seconds"].get<double>();
      }
    }
  }
}

json make_check(const std::string& name, const std::string& target_text,
                std::optional<double> measured, double target, bool at_least,
                const std::string& detail) {
  json check = {{"name", name},
                {"target", target_text},
                {"target_value", target},
                {"comparison", at_least ? ">=" : "<="},
                {"detail", detail}};
  if (measured) {
    check["measured"] = *measured;
    check["pass"] = at_least ? *measured >= target : *measured <= target;
  } else {
    check["measured"] = nullptr;
    check["pass"] = nullptr;  // not measured in this run
  }
  return check;
}

json evaluate_checks(const BenchArgs& a, const json& rows) {
  json checks = json::array();
  const int K = a.stages;
  const int M = a.chunks;
  auto inprocess = [&](const std::string& schedule, int stages, int chunks,
                       const std::string& checkpoint) {
    return find_row(rows, [&](const json& r) {
      return r["runtime"] == "inprocess" && r["schedule"] == schedule && r["stages"] == stages &&
             r["chunks"] == chunks && r["checkpoint"] == checkpoint && r["virtual_stages"] == 1;
    });
  };
  // [0] multi-process vs torch.distributed.pipelining, schedule by schedule (issue #15: at most
  // 0.9x its step time on mlp, 0.5x on small; no target for cnn).
  if (a.suite != "cnn") {
    const double target = a.suite == "mlp" ? 0.9 : 0.5;
    for (const char* schedule : kTargetSchedules) {
      const json* ours = find_row(rows, [&](const json& r) {
        return r["runtime"] == "multiprocess" && r["schedule"] == schedule && r["stages"] == K &&
               r["chunks"] == M;
      });
      std::optional<double> ratio;
      std::string detail =
          "torch-pipelining or multiprocess row missing (--no-python, "
          "--no-multiprocess, K = 1, or one failed)";
      if (ours && ours->contains("ratio_vs_torch")) {
        ratio = (*ours)["ratio_vs_torch"].get<double>();
        detail = "multiprocess step time / torch.distributed.pipelining step time, " +
                 std::string(schedule) + ", K=" + std::to_string(K) + " M=" + std::to_string(M);
      }
      std::ostringstream text;
      text << "<= " << target << " x torch.distributed.pipelining";
      checks.push_back(make_check("multiprocess_vs_torch_" + std::string(schedule), text.str(),
                                  ratio, target, false, detail));
    }
  }
  {  // [1] in-process vs torchgpipe, same partitions and chunks
    const json* ours = inprocess("gpipe", K, M, a.checkpoint);
    std::optional<double> speedup;
    std::string detail = "torchgpipe row missing (--no-python or it failed)";
    if (ours && ours->contains("ratio_vs_torchgpipe")) {
      speedup = 1.0 / (*ours)["ratio_vs_torchgpipe"].get<double>();
      detail = "torchgpipe step time / inprocess gpipe step time, K=" + std::to_string(K) +
               " M=" + std::to_string(M) + ", checkpoint " + a.checkpoint + " (torchgpipe " +
               (*ours)["torchgpipe_checkpoint"].get<std::string>() + ")";
    }
    checks.push_back(make_check("inprocess_vs_torchgpipe_speedup", ">= 1.5x faster than torchgpipe",
                                speedup, 1.5, true, detail));
  }
  {  // [2] one stage, one chunk vs plain LibTorch
    const json* ours = inprocess("gpipe", 1, 1, "never");
    std::optional<double> ratio;
    if (ours && ours->contains("ratio_vs_libtorch"))
      ratio = (*ours)["ratio_vs_libtorch"].get<double>();
    checks.push_back(make_check("one_stage_overhead_vs_libtorch", "<= 1.03 x plain LibTorch", ratio,
                                1.03, false, "inprocess K=1 M=1 step time / libtorch step time"));
  }
  {  // [3] multi-process 1F1B efficiency
    const json* row = find_row(rows, [&](const json& r) {
      return r["runtime"] == "multiprocess" && r["schedule"] == "1f1b" && r["stages"] == K &&
             r["chunks"] == M;
    });
    std::optional<double> efficiency;
    std::string detail = "multiprocess rows not run (--no-multiprocess, K = 1, or they failed)";
    if (row && row->contains("efficiency")) {
      efficiency = (*row)["efficiency"].get<double>();
      detail =
          "median over steps of the step replayed from its measured action durations (comm = "
          "shortest receive) / measured step, K=" +
          std::to_string(K) + " M=" + std::to_string(M);
    }
    checks.push_back(make_check("multiprocess_1f1b_efficiency", ">= 0.87 (2 ranks, 1f1b, M=8)",
                                efficiency, 0.87, true, detail));
  }
  for (int m : {M, 2 * M}) {  // [4] 1F1B's stash bound
    const json* gpipe = inprocess("gpipe", K, m, "never");
    const json* ofob = inprocess("1f1b", K, m, "never");
    std::optional<double> fraction;
    if (gpipe && ofob && !(*gpipe)["peak_stashed_bytes"].empty() &&
        (*gpipe)["peak_stashed_bytes"][0].get<double>() > 0) {
      fraction = (*ofob)["peak_stashed_bytes"][0].get<double>() /
                 (*gpipe)["peak_stashed_bytes"][0].get<double>();
    }
    const double bound = static_cast<double>(K) / m + 0.05;
    std::ostringstream target;
    target << "<= K/M + 0.05 = " << bound << " of gpipe's";
    checks.push_back(make_check("1f1b_stage0_stash_fraction_M" + std::to_string(m), target.str(),
                                fraction, bound, false,
                                "1f1b / gpipe peak stashed bytes on stage 0, checkpoint never"));
  }
  {  // [5] except_last checkpointing
    const json* never = inprocess("gpipe", K, M, "never");
    const json* except_last = inprocess("gpipe", K, M, "except_last");
    std::optional<double> cut;
    if (never && except_last && !(*never)["peak_stashed_bytes"].empty() &&
        (*never)["peak_stashed_bytes"][0].get<double>() > 0) {
      cut = 1.0 - (*except_last)["peak_stashed_bytes"][0].get<double>() /
                      (*never)["peak_stashed_bytes"][0].get<double>();
    }
    checks.push_back(make_check("except_last_stash_cut", ">= 50% less than checkpoint never", cut,
                                0.5, true,
                                "1 - gpipe except_last / gpipe never peak stashed bytes, stage 0"));
  }
  return checks;
}

std::string format_bytes(double bytes) {
  char text[32];
  if (bytes >= 1 << 20) {
    std::snprintf(text, sizeof text, "%.1fM", bytes / (1 << 20));
  } else {
    std::snprintf(text, sizeof text, "%.0fK", bytes / 1024);
  }
  return text;
}

std::string number(const json& row, const char* key, const char* format) {
  if (!row.contains(key) || !row[key].is_number()) return "-";
  char text[32];
  std::snprintf(text, sizeof text, format, row[key].get<double>());
  return text;
}

void print_text(const json& report) {
  std::printf(
      "pipetrain bench --suite %s: %s, batch %d, %d threads, median of %d steps after %d "
      "warm-up, medians over %d rounds; load average %s -> %s\n",
      report["suite"].get<std::string>().c_str(), report["model"].get<std::string>().c_str(),
      report["batch"].get<int>(), report["threads"].get<int>(), report["steps"].get<int>(),
      report["warmup"].get<int>(), report["rounds"].get<int>(),
      report["load_average_start"].get<std::string>().c_str(),
      report["load_average_end"].get<std::string>().c_str());
  std::printf("%-22s %-16s %2s %2s %3s %-11s %9s %7s %7s %6s %8s  %s\n", "runtime", "schedule", "K",
              "V", "M", "checkpoint", "step ms", "/libt", "/peer", "eff", "rss",
              "peak stash/stage");
  for (const json& row : report["configs"]) {
    std::string stash;
    if (row.contains("peak_stashed_bytes")) {
      for (const json& b : row["peak_stashed_bytes"]) {
        stash += (stash.empty() ? "" : " ") + format_bytes(b.get<double>());
      }
    }
    if (row.contains("error")) stash = "ERROR: " + row["error"].get<std::string>();
    const double ms = row.contains("step_seconds") ? row["step_seconds"].get<double>() * 1e3 : 0;
    std::printf(
        "%-22s %-16s %2d %2d %3d %-11s %9.1f %7s %7s %6s %8s  %s\n",
        row["runtime"].get<std::string>().c_str(), row["schedule"].get<std::string>().c_str(),
        row["stages"].get<int>(), row["virtual_stages"].get<int>(), row["chunks"].get<int>(),
        row["checkpoint"].get<std::string>().c_str(), ms,
        number(row, "ratio_vs_libtorch", "%.3f").c_str(),
        number(row, row.contains("ratio_vs_torch") ? "ratio_vs_torch" : "ratio_vs_torchgpipe",
               "%.3f")
            .c_str(),
        number(row, "efficiency", "%.2f").c_str(),
        row.contains("peak_rss_bytes") ? format_bytes(row["peak_rss_bytes"].get<double>()).c_str()
                                       : "-",
        stash.c_str());
  }
  std::printf("\nchecks (targets of issues #7 and #15, evaluated on this run):\n");
  for (const json& check : report["checks"]) {
    const char* verdict = check["pass"].is_null()     ? "NOT RUN"
                          : check["pass"].get<bool>() ? "PASS"
                                                      : "FAIL";
    std::printf("  %-7s %-34s measured %-8s target %s\n           %s\n", verdict,
                check["name"].get<std::string>().c_str(),
                check["measured"].is_null() ? "-" : number(check, "measured", "%.3f").c_str(),
                check["target"].get<std::string>().c_str(),
                check["detail"].get<std::string>().c_str());
  }
  for (const json& note : report["notes"])
    std::printf("note: %s\n", note.get<std::string>().c_str());
}

// One row per configuration from its rows of every round: step_seconds, simulated_seconds,
// efficiency and the ratios are medians over the rounds (each ratio taken within its round),
// step_seconds_all holds every timed step, peak_rss_bytes the largest; the rest (stash
// accounting) comes from the first round. A configuration that failed in any round keeps that
// round's error.
json merge_rounds(const std::vector<json>& rounds) {
  json merged = json::array();
  for (size_t n = 0; n < rounds.front().size(); ++n) {
    const json* failed = nullptr;
    for (const json& rows : rounds) {
      if (!ok(rows[n])) failed = &rows[n];
    }
    if (failed) {
      merged.push_back(*failed);
      continue;
    }
    json row = rounds.front()[n];
    std::vector<double> all;
    json per_round = json::array();
    for (const char* key : {"step_seconds", "simulated_seconds", "efficiency", "ratio_vs_libtorch",
                            "ratio_vs_torchgpipe", "ratio_vs_torch"}) {
      std::vector<double> values;
      for (const json& rows : rounds) {
        if (rows[n].contains(key)) values.push_back(rows[n][key].get<double>());
      }
      if (values.size() == rounds.size()) row[key] = median(values);
    }
    int64_t rss = 0;
    for (const json& rows : rounds) {
      for (double t : rows[n]["step_seconds_all"]) all.push_back(t);
      per_round.push_back(rows[n]["step_seconds"]);
      rss = std::max(rss, rows[n]["peak_rss_bytes"].get<int64_t>());
    }
    row["step_seconds_all"] = all;
    row["round_step_seconds"] = per_round;
    row["steps"] = static_cast<int>(all.size());
    row["peak_rss_bytes"] = rss;
    merged.push_back(row);
  }
  return merged;
}

int run_bench(BenchArgs a) {
  resolve_defaults(a);
  if (a.rank_worker) {
    const Config c{a.runtime, a.schedule,   a.stages, a.virtual_stages,
                   a.chunks,  a.checkpoint, "main"};
    return run_rank(a, c);
  }
  if (a.one) {
    const Config c{a.runtime, a.schedule,   a.stages, a.virtual_stages,
                   a.chunks,  a.checkpoint, "main"};
    const json result = run_one(a, c);
    std::cout << kResultPrefix << result.dump() << std::endl;
    return 0;
  }
  const std::string peer_dir = find_peer_dir(a);
  if (!a.no_python) {
    for (const char* script : {"torchgpipe_peer.py", "torch_pipelining.py"}) {
      if (!file_exists(peer_dir + "/" + script)) {
        throw UsageError("the Python peer " + peer_dir + "/" + script +
                         " does not exist; pass --peer-dir DIR or --no-python");
      }
    }
    if (!file_exists(a.python)) {
      throw UsageError("the Python interpreter " + a.python +
                       " does not exist; run scripts/bootstrap, pass --python PATH or --no-python");
    }
  }
  const std::vector<Config> configs = plan_configs(a);
  json report;
  report["suite"] = a.suite;
  report["model"] = a.suite == "cnn" ? "examples cnn (width " + std::to_string(a.width) +
                                           ", 1 block), cross-entropy"
                                     : std::string(a.suite == "mlp" ? "8" : "16") + " x (Linear(" +
                                           std::to_string(a.width) + ") + ReLU), MSE";
  report["batch"] = a.batch;
  report["threads"] = a.threads;
  report["steps"] = a.steps;
  report["warmup"] = a.warmup;
  report["hardware_threads"] = std::thread::hardware_concurrency();
  report["load_average_start"] = read_load_average().to_string();
  report["rounds"] = a.rounds;
  // Every configuration once per round, round after round: a machine whose speed drifts over
  // minutes then drifts under all of them alike, and each ratio is taken within a round.
  std::vector<json> rounds;
  for (int r = 0; r < a.rounds; ++r) {
    json rows = json::array();
    for (size_t n = 0; n < configs.size(); ++n) {
      const Config& c = configs[n];
      std::cerr << "bench: round " << r + 1 << "/" << a.rounds << " [" << n + 1 << "/"
                << configs.size() << "] " << c.label() << " ..." << std::endl;
      json row = run_config(a, c, peer_dir);
      if (ok(row)) {
        std::cerr << "bench:   " << row["step_seconds"].get<double>() * 1e3 << " ms/step"
                  << std::endl;
      } else {
        std::cerr << "bench:   failed: " << row["error"].get<std::string>() << std::endl;
      }
      rows.push_back(row);
    }
    add_ratios(rows);
    rounds.push_back(std::move(rows));
  }
  json rows = merge_rounds(rounds);
  report["configs"] = rows;
  report["checks"] = evaluate_checks(a, rows);
  report["load_average_end"] = read_load_average().to_string();
  json notes = json::array();
  notes.push_back("multiprocess rows: peak_rss_bytes is the largest rank's");
  notes.push_back("ratios are step time / baseline step time (< 1: faster than the baseline)");
  notes.push_back("threads: libtorch rows " + std::to_string(a.threads) +
                  " intra-op threads; inprocess rows K workers x max(1, T/K); torchgpipe "
                  "torch.set_num_threads(T); multiprocess and torch-pipelining rows K ranks x "
                  "max(1, T/K)");
  notes.push_back(
      "/peer: multiprocess rows / torch-pipelining (same schedule), inprocess gpipe "
      "rows / torchgpipe");
  if (a.suite == "cnn") {
    notes.push_back(
        "cnn: pipelined rows use DeferredBatchNorm (torchgpipe: deferred_batch_norm=True); "
        "torch-pipelining has no cnn (skip connections across its stages)");
  }
  report["notes"] = notes;
  if (a.json_output) {
    std::cout << report.dump(2) << std::endl;
  } else {
    print_text(report);
  }
  const bool any_error =
      std::any_of(rows.begin(), rows.end(), [](const json& r) { return !ok(r); });
  return any_error ? 1 : 0;
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<BenchArgs>();
  auto* c = app.add_subcommand(
      "bench",
      "pipetrain vs plain LibTorch, torch.distributed.pipelining and torchgpipe on one model "
      "(docs/BENCHMARKS.md)");
  c->add_option("--suite", args->suite,
                "model suite: mlp (8 x Linear(1024)+ReLU), small (16 x Linear(256)+ReLU, batch 64) "
                "or cnn (examples' CNN)");
  c->add_flag("--json", args->json_output, "print one JSON object instead of a table");
  c->add_option("--steps", args->steps, "timed steps per configuration (median reported)");
  c->add_option("--warmup", args->warmup, "untimed steps before timing");
  c->add_option("--rounds", args->rounds,
                "run every configuration this many times, round-robin; medians over rounds "
                "(default 3, 1 with --quick)");
  c->add_option("--threads", args->threads, "total intra-op threads T (0: hardware threads)");
  c->add_option("--stages", args->stages, "pipeline ranks K of the pipelined rows");
  c->add_option("--chunks", args->chunks, "micro-batches M of the main rows (memory rows: M, 2M)");
  c->add_option("--checkpoint", args->checkpoint, "checkpoint mode of the main pipelined rows");
  c->add_option("--width", args->width,
                "mlp/small features, cnn channels (0: mlp 1024, small 256, cnn 32)");
  c->add_option("--batch", args->batch, "mini-batch rows (0: mlp 256, small 64, cnn 128)");
  c->add_flag("--no-python", args->no_python,
              "skip the Python peers (torch-pipelining, torchgpipe)");
  c->add_flag("--no-memory", args->no_memory, "skip the checkpoint/memory comparison rows");
  c->add_flag("--quick", args->quick, "small model and batch (for smoke tests)");
  c->add_option("--python", args->python,
                "Python interpreter with torch and torchgpipe (default: the venv of "
                "scripts/bootstrap); its torchrun launches the torch-pipelining rows");
  c->add_option("--peer-dir", args->peer_dir,
                "directory of torchgpipe_peer.py and torch_pipelining.py (default: bench/)");
  c->add_option("--timeline-dir", args->timeline_dir,
                "write measured SVG timelines of the pipelined main rows here");
  c->add_option("--config-timeout", args->config_timeout, "seconds one configuration may take");
  // The child mode: one configuration, one JSON result line.
  c->add_flag("--no-multiprocess", args->no_multiprocess, "skip the multi-process rows");
  c->add_flag("--one", args->one)->group("");
  c->add_flag("--rank-worker", args->rank_worker)->group("");
  c->add_option("--runtime", args->runtime)->group("");
  c->add_option("--schedule", args->schedule)->group("");
  c->add_option("--virtual", args->virtual_stages)->group("");
  c->callback([args, &exit_code] { exit_code = run_bench(*args); });
}

}  // namespace pipetrain::cli
