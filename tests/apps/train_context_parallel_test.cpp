// `pipetrain train --cp`: each sequence split over context-parallel processes (ring attention or
// Ulysses, parallel/ring_attention.h), composed with pipeline stages, tensor parallelism (with
// sequence parallelism), data-parallel replicas and ZeRO-3, against transformers' own training of
// the same model: after three AdamW steps the --save-hf output of every layout loads in
// transformers with every parameter within 1e-4 of transformers' weights. A sharded checkpoint
// written under context parallelism resumes at another layout. What context parallelism does not
// take exits 2 naming the value.
#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../helpers/cli_run.h"
#include "../helpers/hf_models.h"
#include "child_runs.h"

namespace pipetrain::train_context_parallel_test {
namespace {

using testing::CliRun;
using testing::hf_fixtures;
using testing::hf_reference;
using testing::run_pipetrain;

std::string cp_train_flags(const std::string& arch, int steps = 3) {
  const std::string dir = hf_fixtures();
  return "train --model " + dir + "/" + arch + " --data tokens --token-file " + dir +
         "/tokens.bin --seq-len 16 --batch-size 8 --steps " + std::to_string(steps) +
         " --lr 1e-2 --optimizer adamw --weight-decay 0.1 --adam-betas 0.9,0.95 --adam-eps 1e-6";
}

struct CpLayout {
  std::string name;
  std::string arch;  // qwen2: tied head, q/k/v biases, 4 heads over 2 key/value heads; llama:
                     // untied, llama3 RoPE
  std::string flags;
};

// Ring unless --cp-method ulysses. Each cp rank holds 16 / cp of every row's tokens (ring: two
// chunks of 16 / 2cp, one from each end).
const std::vector<CpLayout> kCpLayouts = {
    {"cp2", "qwen2", "--nproc 2 --cp 2 --chunks 2"},
    {"cp2_ulysses", "llama", "--nproc 2 --cp 2 --cp-method ulysses --chunks 2"},
    // Every micro-batch recomputed: the ring runs again in the replay.
    {"pp2cp2_1f1b", "qwen2",
     "--nproc 4 --pp 2 --cp 2 --chunks 4 --schedule 1f1b --checkpoint always"},
    {"cp4_ulysses", "qwen2", "--nproc 4 --cp 4 --cp-method ulysses --chunks 2"},
    {"cp2tp2_sp", "qwen2", "--nproc 4 --tp 2 --cp 2 --sequence-parallel --chunks 2"},
    {"dp2cp2_zero3", "llama", "--nproc 4 --dp 2 --cp 2 --zero 3 --chunks 2"},
    {"pp2cp2tp2_zbv", "qwen2", "--nproc 8 --pp 2 --tp 2 --cp 2 --chunks 4 --schedule zb-v"},
    // Rank 0 profiles a cp rank's mirror on its columns; the timed steps run the ring.
    {"pp2cp2_auto", "qwen2", "--nproc 4 --pp 2 --cp 2 --schedule auto"},
};

TEST(TrainContextParallel, WeightsAfterAdamWEqualTransformersTrainingInEveryLayout) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string dir = testing::scratch_dir("train-cp");
  std::ofstream batch(dir + "/compare.txt");
  for (const std::string arch : {"qwen2", "llama"}) {
    batch << "train " << hf_fixtures() << "/" << arch << " " << hf_fixtures() << "/tokens.bin "
          << dir << "/" << arch << "_reference --seq-len 16 --batch-size 8 --steps 3 --lr 1e-2 "
          << "--betas 0.9,0.95 --eps 1e-6 --weight-decay 0.1\n";
  }
  for (const CpLayout& layout : kCpLayouts) {
    const std::string out = dir + "/" + layout.name;
    const CliRun run =
        run_pipetrain(cp_train_flags(layout.arch) + " " + layout.flags + " --save-hf " + out);
    ASSERT_EQ(run.exit_code, 0) << layout.name << "\n" << run.output;
    EXPECT_NE(run.output.find("context-parallel"), std::string::npos) << run.output;
    if (layout.name == "pp2cp2_auto") {
      EXPECT_NE(run.output.find("auto plan: measured"), std::string::npos) << run.output;
    }
    if (layout.name == "pp2cp2_1f1b") {
      // What crosses the stage boundary: each cp rank's [2, 8, 16] fp32 per micro-batch and
      // direction, 4 micro-batches: half of the whole sequence's 196608 bytes.
      EXPECT_NE(run.output.find("transport: 98304 tensor bytes"), std::string::npos) << run.output;
    }
    batch << "compare " << out << " " << dir << "/" << layout.arch << "_reference --rtol 1e-4\n";
  }
  // A sharded checkpoint of dp2 x cp2 (ZeRO-1, each shard over the 4 replicas) after 2 steps,
  // resumed for the third at pp2 x cp2 Ulysses: transformers' three steps again.
  const std::string ckpt = dir + "/ckpt";
  const CliRun saved = run_pipetrain(cp_train_flags("qwen2", 2) +
                                     " --nproc 4 --dp 2 --cp 2 --zero 1 --chunks 2 "
                                     "--checkpoint-dir " +
                                     ckpt + " --checkpoint-format sharded --save-every 2");
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const CliRun resumed = run_pipetrain(cp_train_flags("qwen2") +
                                       " --nproc 4 --pp 2 --cp 2 --cp-method ulysses --chunks 2 "
                                       "--resume " +
                                       ckpt + "/step-2 --save-hf " + dir + "/resumed");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  batch << "compare " << dir << "/resumed " << dir << "/qwen2_reference --rtol 1e-4\n";
  batch.close();
  const CliRun compare = hf_reference("batch " + dir + "/compare.txt");
  const std::vector<double> errors = testing::worst_relative_errors(compare.output);
  ASSERT_EQ(errors.size(), kCpLayouts.size() + 1) << compare.output;
  for (size_t l = 0; l < errors.size(); ++l) {
    EXPECT_LE(errors[l], 1e-4) << (l < kCpLayouts.size() ? kCpLayouts[l].name : "resumed") << "\n"
                               << compare.output;
  }
  EXPECT_EQ(compare.exit_code, 0) << compare.output;
}

// Activation memory falls with cp: at 256 tokens a row, the largest rank's activations at cp 4
// (ring) are at most 0.35 of one process's, predicted and measured (each rank holds 64 tokens of
// every row; measured 0.306 and predicted 0.284 on 2026-12-07). The memory check profiles a
// context-parallel rank as it runs (a mirror group: its ring buffers, its repeated key/value
// heads), so a --memory-limit that one process's activations pass is one cp 4 trains within.
TEST(TrainContextParallel, ActivationMemoryFallsWithCpAndALimitOneRankPassesTrainsAtCp4) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string flags =
      testing::replace_all(cp_train_flags("qwen2", 2), "--seq-len 16", "--seq-len 256") +
      " --chunks 2 --report-memory";
  const CliRun one = run_pipetrain(flags);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const CliRun cp4 = run_pipetrain(flags + " --nproc 4 --cp 4 --memory-limit 4MiB");
  ASSERT_EQ(cp4.exit_code, 0) << cp4.output;
  const auto [one_predicted, one_measured] = bench::largest_activations(one.output);
  const auto [cp_predicted, cp_measured] = bench::largest_activations(cp4.output);
  ASSERT_GT(one_predicted, 0) << one.output;
  ASSERT_GT(one_measured, 0) << one.output;
  EXPECT_LE(cp_predicted / one_predicted, 0.35) << one.output << cp4.output;
  EXPECT_LE(cp_measured / one_measured, 0.35) << one.output << cp4.output;
  const CliRun refused = run_pipetrain(flags + " --memory-limit 4MiB");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("pass the --memory-limit of 4.00 MiB per rank"), std::string::npos)
      << refused.output;
}

// plan --world N --cp C ranks layouts with context parallelism up to C: each profiled as one cp
// rank runs (its tokens of each row, its ring over a mirror group), its ring passes costed. At
// 256 tokens a row, pp1 x cp4's activations (peak minus model state) are at most 0.35 of one
// process's (measured 0.291 on 2026-12-07).
TEST(TrainContextParallel, PlanWorldRanksContextParallelLayouts) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string plan = "plan --model " + hf_fixtures() +
                           "/qwen2 --sample-shape 2,256 --format json --profile-repeats 1 "
                           "--profile-warmup 0 --world ";
  auto activations = [](const nlohmann::json& layouts, int cp) -> int64_t {
    for (const nlohmann::json& l : layouts) {
      if (l.at("pp") == 1 && l.at("tp") == 1 && l.at("dp") == 1 && l.at("cp") == cp) {
        return l.at("peak_memory_bytes").get<int64_t>() - l.at("model_state_bytes").get<int64_t>();
      }
    }
    return -1;
  };
  const CliRun one = run_pipetrain(plan + "1", testing::CliOptions().without_stderr());
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const CliRun four = run_pipetrain(plan + "4 --cp 4", testing::CliOptions().without_stderr());
  ASSERT_EQ(four.exit_code, 0) << four.output;
  const nlohmann::json ranked = nlohmann::json::parse(four.output).at("ranked");
  std::set<int> sizes;
  for (const nlohmann::json& l : ranked) {
    const int cp = l.at("cp").get<int>();
    sizes.insert(cp);
    EXPECT_EQ(l.at("cp_seconds").get<double>() > 0, cp > 1) << l.dump();
  }
  EXPECT_EQ(sizes, (std::set<int>{1, 2, 4})) << four.output;
  const int64_t whole = activations(nlohmann::json::parse(one.output).at("ranked"), 1);
  const int64_t split = activations(ranked, 4);
  ASSERT_GT(whole, 0) << one.output;
  ASSERT_GT(split, 0) << four.output;
  EXPECT_LE(static_cast<double>(split) / static_cast<double>(whole), 0.35);
  const CliRun alone =
      run_pipetrain("plan --model " + hf_fixtures() + "/qwen2 --sample-shape 2,256 --cp 2");
  EXPECT_EQ(alone.exit_code, 2) << alone.output;
  EXPECT_NE(alone.output.find("--cp 2 with plan: give --world N"), std::string::npos)
      << alone.output;
}

// bf16 (autocast): the ring's flash kernel takes q, k and v in autocast's dtype, as sdpa does.
// Three AdamW steps at cp2 ring and at cp2 Ulysses end at one process's loss within bf16's
// rounding (measured 4.215940 and 4.215549 against 4.215671 on 2026-12-07).
TEST(TrainContextParallel, Bf16TrainsAsOneProcessWithinItsRounding) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string flags = cp_train_flags("qwen2") + " --precision bf16 --chunks 2 ";
  auto last_loss = [](const CliRun& run) {
    const size_t at = run.output.rfind(" -> ");
    return at == std::string::npos ? 0.0 : std::stod(run.output.substr(at + 4));
  };
  const CliRun one = run_pipetrain(flags + "--stages 2");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  for (const std::string method : {"ring", "ulysses"}) {
    const CliRun cp = run_pipetrain(flags + "--nproc 2 --cp 2 --cp-method " + method);
    ASSERT_EQ(cp.exit_code, 0) << cp.output;
    EXPECT_NEAR(last_loss(cp), last_loss(one), 2e-3 * last_loss(one)) << method << "\n"
                                                                      << one.output << cp.output;
  }
}

TEST(TrainContextParallel, WhatItCannotSplitExitsTwoNamingTheValue) {
  const std::string flags = cp_train_flags("qwen2", 1);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--nproc 2 --cp 2 --seq-len 18",
       "--cp 2 (ring) cuts each sample's --seq-len 18 ids into 4 parts; give a --seq-len "
       "divisible by it"},
      {"--nproc 8 --cp 8 --cp-method ulysses",
       "--cp 8 (ulysses) gives each rank the whole sequence for 1/8 of the attention heads, and "
       "num_attention_heads (4) does not divide by it; use --cp-method ring"},
      {"--nproc 8 --tp 2 --cp 4 --cp-method ulysses",
       "each tensor-parallel rank's 2 heads do not divide by it"},
      {"--nproc 3 --cp 2", "--cp 2 does not divide the world of 3 processes"},
      {"--cp 2", "--pp/--tp/--dp/--cp describe a multi-process run: give --nproc 2"},
      {"--cp-method ulysses", "--cp-method ulysses says how --cp splits attention, and --cp is 1"},
      {"--nproc 2 --cp 2 --device cuda",
       "--cp 2 (ring) on CUDA stages: the ring runs LibTorch's flash attention for the CPU"},
  };
  for (const auto& [extra, message] : cases) {
    std::string args = flags + " " + extra;
    if (extra.find("--seq-len") != std::string::npos) {
      args = testing::replace_all(args, "--seq-len 16 ", "");
    }
    const CliRun run = run_pipetrain(args);
    EXPECT_EQ(run.exit_code, 2) << extra << "\n" << run.output;
    EXPECT_NE(run.output.find(message), std::string::npos) << extra << "\n" << run.output;
  }
  const CliRun mlp = run_pipetrain("train --model mlp --data synthetic --steps 1 --nproc 2 --cp 2");
  EXPECT_EQ(mlp.exit_code, 2) << mlp.output;
  EXPECT_NE(mlp.output.find("--cp 2 splits the attention of a Llama-family model, and --model mlp "
                            "has none that can be split"),
            std::string::npos)
      << mlp.output;
}

}  // namespace
}  // namespace pipetrain::train_context_parallel_test
