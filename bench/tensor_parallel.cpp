// bench_tensor_parallel: what tensor parallelism costs and buys on this machine, at one world
// size. The llama suite's model (bench_options.h: 8 decoder layers of 256, 8 heads, 4 key/value
// heads, vocabulary 4096, 16 sequences of 128 ids), 1f1b with 8 micro-batches, 4 processes of 1
// intra-op thread each over loopback Gloo, one invocation, every layout in turn per round:
//
//   pp4          4 pipeline ranks (the baseline)
//   pp2 x tp2    2 pipeline ranks, each split over 2 tensor-parallel processes
//   pp2 x tp2 sp the same with sequence parallelism
//   tp4          one stage split over 4 processes
//
// Each layout runs as its own 4-process job (runtime/launcher.h): 2 warm-up steps, then timed
// steps (zero_grad + DistributedPipe::train_step, with sequence parallelism the replicated
// tensors' gradient sum over the tp group, ranks started together by a barrier); a step's
// time is the slowest rank's, a layout's the median over its steps, and the ratios divide by
// pp4's median of the same round. Rounds alternate the layouts so that a slow minute of the
// machine falls on all of them. Also printed: tensor bytes sent between stages per rank and step.
//
// Run: bench_tensor_parallel [rounds (3)] [timed steps (6)].
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
#include "pipetrain/models/llama.h"
#include "pipetrain/runtime/distributed.h"
#include "pipetrain/runtime/distributed_pipe.h"
#include "pipetrain/runtime/launcher.h"

using namespace pipetrain;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kWorld = 4;
constexpr int kChunks = 8;
constexpr int kWarmup = 2;
constexpr int kBatch = 16;
constexpr int kSeqLen = 128;
const char* const kPrefix = "TP_BENCH ";

struct Layout {
  std::string name;
  int pp, tp;
  bool sp;
};

const std::vector<Layout> kLayouts = {{"pp4", 4, 1, false},
                                      {"pp2 x tp2", 2, 2, false},
                                      {"pp2 x tp2 sp", 2, 2, true},
                                      {"tp4", 1, 4, false}};

// The llama suite's config (bench/harness/bench_options.cpp), built here for independence.
models::LlamaConfig bench_config() {
  models::LlamaConfig c = models::llama_config(4096, 256, 688, 8, 8, 4);
  c.max_position_embeddings = 2048;
  return c;
}

// One rank: prints kPrefix {"seconds": [...], "bytes": per step}.
int run_rank(const Layout& layout, int steps) {
  torch::set_num_threads(1);
  DistributedOptions options;
  options.pipeline_ranks(layout.pp).tensor_parallel(layout.tp).timeout(std::chrono::seconds(300));
  return run_distributed(options, [&](Distributed& d) {
    const parallel::TensorParallel tp{d.tensor_parallel_group(), layout.sp};
    const models::LlamaConfig config = bench_config();
    models::LlamaModel llama =
        models::make_llama(config, models::LlamaBuildOptions().tensor_parallel(tp));
    models::init_llama_random(llama, 0);
    torch::manual_seed(1);
    const torch::Tensor ids = torch::randint(config.vocab_size, {kBatch, kSeqLen}, torch::kInt64);
    const torch::Tensor targets =
        torch::randint(config.vocab_size, {kBatch, kSeqLen}, torch::kInt64);
    LossFn loss = models::causal_lm_loss;
    if (tp.split()) {
      loss = [tp](const torch::Tensor& logits, const torch::Tensor& y) {
        return models::vocab_parallel_causal_lm_loss(logits, y, tp);
      };
    }
    // Under sequence parallelism the whole (replicated) tensors' gradients are each rank's
    // sequence share: summed over the tp group after the backward, as the trainer does
    // (train/step_runner.h), and timed as part of the step.
    std::vector<torch::Tensor> sequence_shared;
    DistributedPipe pipe(d, llama.sequential,
                         PipeOptions()
                             .stages(layout.pp)
                             .chunks(kChunks)
                             .schedule("1f1b")
                             .checkpoint(Checkpoint::kNever)
                             .threads_per_stage(1));
    if (layout.sp) {
      sequence_shared =
          models::tensor_parallel_whole_parameters(pipe.named_parameters(), config, layout.tp);
    }
    std::vector<double> seconds;
    int64_t bytes_before = 0;
    for (int k = 0; k < kWarmup + steps; ++k) {
      if (k == kWarmup) bytes_before = pipe.transport_stats().data_bytes_sent;
      d.barrier();
      const auto start = Clock::now();
      for (auto& p : pipe.parameters()) p.mutable_grad() = torch::Tensor();
      pipe.train_step(ids, targets, loss);
      d.allreduce_tensor_parallel_gradients(sequence_shared);
      if (k >= kWarmup) {
        seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      }
    }
    const double bytes =
        static_cast<double>(pipe.transport_stats().data_bytes_sent - bytes_before) / steps;
    std::cout << kPrefix << nlohmann::json{{"seconds", seconds}, {"bytes", bytes}}.dump()
              << std::endl;
  });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--rank") {
    const Layout& layout = kLayouts.at(static_cast<size_t>(std::stoi(argv[2])));
    return run_rank(layout, std::stoi(argv[3]));
  }
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  const int steps = argc > 2 ? std::max(1, std::atoi(argv[2])) : 6;
  std::printf(
      "bench_tensor_parallel: llama 8 x 256 (8 heads, 4 kv), vocab 4096, %d x %d ids, "
      "1f1b x %d micro-batches, %d processes x 1 thread (%u cores), %d rounds x %d steps\n",
      kBatch, kSeqLen, kChunks, kWorld, std::thread::hardware_concurrency(), rounds, steps);
  std::map<std::string, std::vector<double>> ratios, medians;
  std::map<std::string, double> bytes;
  for (int round = 0; round < rounds; ++round) {
    std::map<std::string, double> median_of;
    for (size_t l = 0; l < kLayouts.size(); ++l) {
      const CollectedRun run = launch_self_collecting(
          kWorld, {"--rank", std::to_string(l), std::to_string(steps)}, kPrefix);
      if (run.launched.exit_code != 0) {
        std::fprintf(stderr, "%s: rank %d exited with %d\n", kLayouts[l].name.c_str(),
                     run.launched.first_failed_rank, run.launched.exit_code);
        return 1;
      }
      std::vector<double> slowest(static_cast<size_t>(steps), 0.0);
      double sent = 0;
      for (const auto& line : run.results) {
        if (!line) continue;
        const nlohmann::json result = nlohmann::json::parse(*line);
        const auto seconds = result["seconds"].get<std::vector<double>>();
        for (size_t k = 0; k < seconds.size() && k < slowest.size(); ++k) {
          slowest[k] = std::max(slowest[k], seconds[k]);
        }
        sent = std::max(sent, result["bytes"].get<double>());
      }
      median_of[kLayouts[l].name] = median(slowest);
      medians[kLayouts[l].name].push_back(median(slowest));
      bytes[kLayouts[l].name] = sent;
    }
    for (const Layout& layout : kLayouts) {
      ratios[layout.name].push_back(median_of[layout.name] / median_of["pp4"]);
    }
  }
  std::printf("%-14s %12s %14s %22s\n", "layout", "step (ms)", "vs pp4", "stage bytes/rank/step");
  for (const Layout& layout : kLayouts) {
    std::printf("%-14s %12.1f %14.3f %22.0f\n", layout.name.c_str(),
                1e3 * median(medians[layout.name]), median(ratios[layout.name]),
                bytes[layout.name]);
  }
  return 0;
}
