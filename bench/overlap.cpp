// bench_overlap: the data-parallel gradient sum overlapped with the pipeline
// (PipeOptions::overlap_gradient_reduction, runtime/gradient_reducer.h) against the blocking sum
// after the step, in one invocation; and the same for the ZeRO-1 optimizer's reduce-scatter (one
// segment per local stage, started when the stage's last backward ends: exposed is then what
// ShardedOptimizer::reduce_gradients waits after the step). The mlp suite's model (8 x
// (Linear(1024) + ReLU), batch 256, MSE against random targets), pp 2 x dp 2 = 4 processes of 1
// intra-op thread over loopback Gloo, 8 micro-batches, for each schedule in turn without and with
// the overlap; and ZeRO-3 (each stage's parameters all-gathered around its actions, kept to its
// last backward or resharded after every action) beside ZeRO-1, under zb-v:
//
//   exposed   what the gradient sum kept the rank waiting after the schedule's last action
//             (DistributedPipe::last_exposed_reduce_seconds): the whole all-reduce without the
//             overlap, what the overlap left with it; per step the largest rank's
//   step      zero_grad + DistributedPipe::train_step (the loss collective included; ZeRO-3's
//             gathers), and for the ZeRO rows the reduce-scatter's wait and the optimizer's step
//             (ZeRO-1's all-gather of the updated shards included), ranks started together by a
//             barrier; per step the slowest rank's
//   schedule  from train_step's start until the rank's last action ended (its events), per step
//             the slowest rank's: the pipeline alone, without the sum after it. Where the overlap
//             lengthens it, the overlap delays the pipeline itself (a send held back by a pack)
//
// Each row is its own 4-process job (runtime/launcher.h): 2 warm-up steps, then timed steps; a
// row's figure is the median over its steps, and the ratios divide by the row without overlap of
// the same schedule and round. Every round runs every row, so that a slow minute of the machine
// falls on all of them, and odd rounds run them in reverse order, so that neither row of a pair
// always runs first.
//
// The bf16 rows run ZeRO-3 under autocast, once gathering the linears' weights in bf16 (the
// default) and once in float32; "step vs fp32 gather" divides the first by the second.
//
// Run: bench_overlap [rounds (3)] [timed steps (8)] [only the rows whose name contains this].
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "pipetrain/base/median.h"
#include "pipetrain/examples/synthetic.h"
#include "pipetrain/runtime/distributed.h"
#include "pipetrain/runtime/distributed_pipe.h"
#include "pipetrain/runtime/launcher.h"
#include "pipetrain/train/sharded_optimizer.h"

using namespace pipetrain;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kWorld = 4;
constexpr int kPipeline = 2;
constexpr int kChunks = 8;
constexpr int kWarmup = 2;
constexpr int kBatch = 256;
constexpr int kWidth = 1024;
const char* const kPrefix = "OVERLAP_BENCH ";

struct Row {
  std::string schedule;
  int virtual_stages;
  bool overlap;
  int zero = 0;             // 1, 3: the ZeRO optimizer reduce-scatters (train/sharded_optimizer.h)
  bool reshard = false;     // ZeRO-3's --reshard-after-forward
  bool bf16 = false;        // under autocast; ZeRO-3 then gathers the linears' weights in bf16...
  bool cast_gather = true;  // ...unless this is false (ZeroOptions::cast_gather)
  std::string name() const {
    return schedule + (zero ? " zero" + std::to_string(zero) : "") + (reshard ? " reshard" : "") +
           (bf16 ? (cast_gather ? " bf16 gather-bf16" : " bf16 gather-fp32") : "") +
           (overlap ? " overlap" : " blocking");
  }
  // The same row without the overlap (the "vs off" columns' baseline).
  Row blocking() const {
    Row r = *this;
    r.overlap = false;
    return r;
  }
};

const std::vector<Row> kRows = {{"1f1b", 1, false},
                                {"1f1b", 1, true},
                                {"interleaved-1f1b", 2, false},
                                {"interleaved-1f1b", 2, true},
                                {"zb-v", 2, false},
                                {"zb-v", 2, true},
                                {"zb-v", 2, false, 1},
                                {"zb-v", 2, true, 1},
                                {"zb-v", 2, false, 3},
                                {"zb-v", 2, true, 3},
                                {"zb-v", 2, false, 3, true},
                                {"zb-v", 2, true, 3, true},
                                // bf16: the ZeRO-3 gathers' bytes halved against the same run
                                // gathering float32 (docs/DISTRIBUTED.md, "ZeRO-3")
                                {"zb-v", 2, false, 3, false, true, true},
                                {"zb-v", 2, false, 3, false, true, false},
                                {"zb-v", 2, false, 3, true, true, true},
                                {"zb-v", 2, false, 3, true, true, false}};

// One rank: prints kPrefix {"seconds": [...], "exposed": [...], "schedule": [...], "buckets": n}.
int run_rank(const Row& row, int steps) {
  torch::set_num_threads(1);
  DistributedOptions options;
  options.pipeline_ranks(kPipeline).timeout(std::chrono::seconds(300));
  return run_distributed(options, [&](Distributed& d) {
    torch::manual_seed(0);
    torch::nn::Sequential model;
    for (int l = 0; l < 8; ++l) {
      model->push_back(torch::nn::Linear(kWidth, kWidth));
      model->push_back(torch::nn::ReLU());
    }
    const auto data = examples::make_synthetic_regression(kBatch, {kWidth}, {kWidth}, 1);
    const LossFn loss = [](const torch::Tensor& out, const torch::Tensor& y) {
      return torch::mse_loss(out, y);
    };
    DistributedPipe pipe(d, model,
                         PipeOptions()
                             .stages(kPipeline * row.virtual_stages)
                             .virtual_stages(row.virtual_stages)
                             .chunks(kChunks)
                             .schedule(row.schedule)
                             .checkpoint(Checkpoint::kNever)
                             .threads_per_stage(1)
                             .precision(row.bf16 ? Precision::kBFloat16 : Precision::kFloat32)
                             .overlap_gradient_reduction(row.overlap));
    // ZeRO: the sharded optimizer reduce-scatters after the step, or, overlapped, one segment
    // per local stage as soon as the stage's last backward ends; ZeRO-3 also gathers each stage's
    // parameters around its actions (as the trainer wires it).
    std::unique_ptr<train::ShardedOptimizer> zero;
    if (row.zero > 0) {
      zero = train::make_pipe_sharded_optimizer(d, pipe, pipe.parameters(), "sgd",
                                                train::OptimizerOptions().lr(0.01).momentum(0),
                                                train::ZeroOptions()
                                                    .stage(row.zero)
                                                    .reshard_after_forward(row.reshard)
                                                    .cast_gather(row.cast_gather),
                                                row.overlap);
    }
    std::vector<double> seconds, exposed, schedule;
    for (int k = 0; k < kWarmup + steps; ++k) {
      d.barrier();
      const auto start = Clock::now();
      if (zero) {
        zero->zero_grad();
      } else {
        for (auto& p : pipe.parameters()) p.mutable_grad() = torch::Tensor();
      }
      pipe.train_step(data.inputs, data.targets, loss);
      const double span_us = pipe.last_events().empty() ? 0 : pipe.last_events().back().end_us;
      double reduce = pipe.last_exposed_reduce_seconds();
      if (zero) {  // what the reduce-scatter leaves after the step, then the optimizer's step
        const auto before = Clock::now();
        zero->reduce_gradients();
        reduce = std::chrono::duration<double>(Clock::now() - before).count();
        zero->step();
      }
      if (k >= kWarmup) {
        seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
        exposed.push_back(reduce);
        schedule.push_back(span_us * 1e-6);
      }
    }
    std::cout << kPrefix
              << nlohmann::json{{"seconds", seconds},
                                {"exposed", exposed},
                                {"schedule", schedule},
                                {"buckets", pipe.last_reduce_buckets()}}
                     .dump()
              << std::endl;
  });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 4 && std::string(argv[1]) == "--rank") {
    return run_rank(kRows.at(static_cast<size_t>(std::stoi(argv[2]))), std::stoi(argv[3]));
  }
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  const int steps = argc > 2 ? std::max(1, std::atoi(argv[2])) : 8;
  const std::string only = argc > 3 ? argv[3] : "";
  auto wanted = [&](const Row& row) { return row.name().find(only) != std::string::npos; };
  std::printf(
      "bench_overlap: mlp 8 x Linear(%d), batch %d, pp %d x dp %d = %d processes x 1 thread (%u "
      "cores), %d micro-batches, %d rounds x %d steps\n",
      kWidth, kBatch, kPipeline, kWorld / kPipeline, kWorld, std::thread::hardware_concurrency(),
      kChunks, rounds, steps);
  std::map<std::string, std::vector<double>> step_ms, exposed_ms, step_ratio, exposed_ratio,
      schedule_ms, schedule_ratio, vs_zero1, vs_fp32_gather;
  std::map<std::string, int> buckets;
  for (int round = 0; round < rounds; ++round) {
    std::map<std::string, double> step_of, exposed_of, schedule_of;
    // Odd rounds run the rows in reverse, so that within each pair the blocking row and the
    // overlapped one each run first in half the rounds (a machine drifting over a minute would
    // otherwise favour one of them in every round).
    for (size_t n = 0; n < kRows.size(); ++n) {
      const size_t r = round % 2 == 0 ? n : kRows.size() - 1 - n;
      if (!wanted(kRows[r])) continue;
      const CollectedRun run = launch_self_collecting(
          kWorld, {"--rank", std::to_string(r), std::to_string(steps)}, kPrefix);
      if (run.launched.exit_code != 0) {
        std::fprintf(stderr, "%s: rank %d exited with %d\n", kRows[r].name().c_str(),
                     run.launched.first_failed_rank, run.launched.exit_code);
        return 1;
      }
      std::vector<double> slowest(static_cast<size_t>(steps), 0.0);
      std::vector<double> most_exposed(static_cast<size_t>(steps), 0.0);
      std::vector<double> longest_schedule(static_cast<size_t>(steps), 0.0);
      for (const auto& line : run.results) {
        if (!line) continue;
        const nlohmann::json result = nlohmann::json::parse(*line);
        const auto seconds = result["seconds"].get<std::vector<double>>();
        const auto exposed = result["exposed"].get<std::vector<double>>();
        const auto schedule = result["schedule"].get<std::vector<double>>();
        for (size_t k = 0; k < seconds.size() && k < slowest.size(); ++k) {
          slowest[k] = std::max(slowest[k], seconds[k]);
          most_exposed[k] = std::max(most_exposed[k], exposed[k]);
          longest_schedule[k] = std::max(longest_schedule[k], schedule[k]);
        }
        buckets[kRows[r].name()] = std::max(buckets[kRows[r].name()], result["buckets"].get<int>());
      }
      step_of[kRows[r].name()] = median(slowest);
      exposed_of[kRows[r].name()] = median(most_exposed);
      schedule_of[kRows[r].name()] = median(longest_schedule);
      schedule_ms[kRows[r].name()].push_back(1e3 * median(longest_schedule));
      step_ms[kRows[r].name()].push_back(1e3 * median(slowest));
      exposed_ms[kRows[r].name()].push_back(1e3 * median(most_exposed));
    }
    for (const Row& row : kRows) {
      if (!step_of.count(row.name())) continue;
      const std::string base = row.blocking().name();
      step_ratio[row.name()].push_back(step_of[row.name()] / step_of[base]);
      schedule_ratio[row.name()].push_back(schedule_of[row.name()] / schedule_of[base]);
      if (row.zero == 3 && !row.bf16) {  // what sharding costs: against ZeRO-1 (fp32), same sum
        const std::string one = Row{row.schedule, row.virtual_stages, row.overlap, 1}.name();
        if (step_of.count(one)) vs_zero1[row.name()].push_back(step_of[row.name()] / step_of[one]);
      }
      if (row.bf16 && row.cast_gather) {  // what gathering in bf16 saves: same row, fp32 gathers
        Row wide = row;
        wide.cast_gather = false;
        if (step_of.count(wide.name())) {
          vs_fp32_gather[row.name()].push_back(step_of[row.name()] / step_of[wide.name()]);
        }
      }
      if (exposed_of[base] > 0) {
        exposed_ratio[row.name()].push_back(exposed_of[row.name()] / exposed_of[base]);
      }
    }
  }
  std::printf("%-44s %10s %13s %12s %14s %10s %9s %8s %12s %18s\n", "row", "step (ms)",
              "step vs off", "exposed (ms)", "exposed vs off", "sched (ms)", "vs off", "buckets",
              "step vs zero1", "step vs fp32 gather");
  auto ratio_text = [](const std::vector<double>& ratios) {
    char text[32] = "";
    if (!ratios.empty()) std::snprintf(text, sizeof text, "%.3f", median(ratios));
    return std::string(text);
  };
  for (const Row& row : kRows) {
    const std::string name = row.name();
    if (!step_ms.count(name)) continue;
    std::printf("%-44s %10.1f %13.3f %12.2f %14.3f %10.1f %9.3f %8d %12s %18s\n", name.c_str(),
                median(step_ms[name]), median(step_ratio[name]), median(exposed_ms[name]),
                exposed_ratio[name].empty() ? 0.0 : median(exposed_ratio[name]),
                median(schedule_ms[name]), median(schedule_ratio[name]), buckets[name],
                ratio_text(vs_zero1[name]).c_str(), ratio_text(vs_fp32_gather[name]).c_str());
  }
  return 0;
}
