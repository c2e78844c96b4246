// `pipetrain train` with the mixtures of experts transformers makes (tests/helpers/hf_models.h:
// Qwen2-MoE with a shared expert and a dense layer, Qwen3-MoE with its q/k norms, Mixtral), checked
// against transformers' own training: the weights --save-hf writes after three AdamW steps equal
// it, each architecture in other layouts, so that the runs cover the layouts between them (with
// expert parallelism, tensor parallelism, ZeRO 1 and 3, checkpoints across layouts).
//
// Routing decisions: the fixtures draw their routers with std 1 (hf_reference.py), so a token's
// router logits differ by far more than the two implementations' roundings, before and after the
// steps at lr 1e-2: no top-k choice flips, and equality within 1e-4 is meaningful (a flipped
// choice would move a token's output by a whole expert's).
//
// Adam's eps is 1e-4 here, not the dense tests' 1e-6: Adam turns a gradient element far below
// eps' scale into a full-size update whatever its rounding, and the mixtures have many such
// elements (Qwen3-MoE's k_proj under its per-head norm, experts and embedding rows that see few
// tokens). Measured against transformers after three steps in one process: Qwen3-MoE 1.06e-4 at
// eps 1e-6, 3.2e-5 at 1e-5, 4.3e-6 at 1e-4; Qwen2-MoE 3.9e-5, 9.5e-5, 2.1e-6 (the experts'
// products are the same sums in another blocking: transformers multiplies gate and up as one
// fused [2I, H] matrix).
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../helpers/cli_run.h"
#include "../helpers/hf_models.h"
#include "../helpers/params_file.h"
#include "pipetrain/io/safetensors.h"

namespace pipetrain::train_moe_test {
namespace {

using testing::CliRun;
using testing::hf_fixtures;
using testing::hf_reference;
using testing::run_pipetrain;

struct Case {
  std::string arch, saved, layout;
};

// hf_reference's comparisons ("A B --rtol R": A's weights against B's), run as one batch from
// dir/compare.txt after the commands `first` (transformers' reference trainings: one Python
// process for all): the worst relative error of each, in order (the batch stops at the first
// comparison over its bound).
std::vector<double> compare_all(const std::string& dir, const std::vector<std::string>& pairs,
                                std::string* output, const std::vector<std::string>& first = {}) {
  std::ofstream batch(dir + "/compare.txt");
  for (const std::string& line : first) batch << line << "\n";
  for (const std::string& pair : pairs) batch << "compare " << pair << "\n";
  batch.close();
  const CliRun compare = hf_reference("batch " + dir + "/compare.txt");
  *output = compare.output;
  return testing::worst_relative_errors(compare.output);
}

// The layouts: a pipeline in one process, pp2 x dp2 under ZeRO-1 (two processes under zb-v run
// in TheLoadBalancingTerm... below), and expert
// parallelism (parallel/expert_parallel.h): ep2 over dp2 (Qwen2-MoE, its shared expert local;
// with --ep-overlap, 1F1B's B0 beside F1 on two lanes, each with its ep group's own copy),
// pp2 x ep2 under dualpipev with every micro-batch recomputed and ZeRO-3 (Qwen3-MoE: the dispatch
// and combine run again in the replay, and in a split backward's I; the experts gathered over no
// other replica, the dense layers over two), ep2 within dp4 under ZeRO-1 (Mixtral: two
// expert-parallel groups, each expert's gradient reduce-scattered over the two replicas holding
// it), pp2 x tp2 x ep2 with sequence parallelism, 8 processes (Qwen3-MoE: attention split by
// tp, its per-head q/k norms' gradients summed over the group in the backward, the experts whole
// on each tp rank over its slice of the sequence), and pp2 x ep2 under dualpipev with
// --ep-overlap (its overlapped F&B pairs, schedule/overlap.h, on two lanes).
TEST(TrainMoe, WeightsAfterAdamWEqualTransformersTrainingInEveryLayout) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string dir = testing::scratch_dir("train-moe");
  const std::vector<Case> cases = {
      {"qwen2_moe", "Qwen2MoeForCausalLM", "--stages 2 --chunks 4 --schedule 1f1b"},
      {"mixtral", "MixtralForCausalLM",
       "--nproc 4 --dp 2 --zero 1 --chunks 2 --schedule 1f1b --checkpoint always "
       "--report-routing --log-every 1 --trace TRACE"},
      {"qwen2_moe", "Qwen2MoeForCausalLM",
       "--nproc 2 --dp 2 --ep 2 --chunks 2 --checkpoint never --ep-overlap --save-params PARAMS"},
      {"qwen3_moe", "Qwen3MoeForCausalLM",
       "--nproc 4 --dp 2 --ep 2 --chunks 4 --schedule dualpipev --checkpoint always --zero 3"},
      {"mixtral", "MixtralForCausalLM",
       "--nproc 4 --dp 4 --ep 2 --zero 1 --chunks 2 --schedule zb-h1 --report-memory"},
      {"qwen3_moe", "Qwen3MoeForCausalLM",
       "--nproc 8 --tp 2 --dp 2 --ep 2 --sequence-parallel --chunks 2 --schedule zb-h1"},
      {"qwen3_moe", "Qwen3MoeForCausalLM",
       "--nproc 4 --dp 2 --ep 2 --zero 1 --chunks 4 --schedule dualpipev --checkpoint never "
       "--ep-overlap --trace TRACE"}};
  std::vector<std::string> pairs, references;
  std::set<std::string> referenced;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::string model = hf_fixtures() + "/" + c.arch;
    const std::string reference = dir + "/" + c.arch + "_reference";
    if (referenced.insert(c.arch).second) {
      references.push_back("train " + model + " " + hf_fixtures() + "/tokens.bin " + reference +
                           " --seq-len 16 --batch-size 8 --steps 3 --lr 1e-2 "
                           "--betas 0.9,0.95 --eps 1e-4 --weight-decay 0.1");
    }
    const std::string out = dir + "/" + c.arch + "_" + std::to_string(i);
    std::string layout = c.layout;
    const std::string trace = out + "-trace.json";
    if (layout.find("TRACE") != std::string::npos) layout.replace(layout.find("TRACE"), 5, trace);
    const std::string params = out + "-params.pt";
    if (layout.find("PARAMS") != std::string::npos)
      layout.replace(layout.find("PARAMS"), 6, params);
    const CliRun run = run_pipetrain(
        "train --model " + model + " --data tokens --token-file " + hf_fixtures() +
        "/tokens.bin --seq-len 16 --batch-size 8 --steps 3 --lr 1e-2 --optimizer adamw "
        "--weight-decay 0.1 --adam-betas 0.9,0.95 --adam-eps 1e-4 " +
        layout + " --save-hf " + out);
    ASSERT_EQ(run.exit_code, 0) << c.arch << "\n" << run.output;
    EXPECT_NE(run.output.find("saved " + c.saved), std::string::npos) << run.output;
    if (c.layout.find("--report-routing") != std::string::npos) {
      // --report-routing, summed over the 4 ranks: each of the 2 layers (one per pipeline rank)
      // saw 3 steps x 8 x 16 tokens x 2 choices, recomputed micro-batches counted once.
      for (const std::string layer : {"0", "1"}) {
        const size_t at = run.output.find("routing: layer " + layer + ": mean ");
        ASSERT_NE(at, std::string::npos) << run.output;
        const size_t list = run.output.find("over the run:", at);
        std::istringstream counts(
            run.output.substr(list + 13, run.output.find('\n', list) - list - 13));
        int64_t sum = 0, count = 0, n = 0;
        while (counts >> count) {
          sum += count;
          ++n;
        }
        EXPECT_EQ(n, 4) << run.output;
        EXPECT_EQ(sum, 3 * 8 * 16 * 2) << layer << "\n" << run.output;
      }
      for (const char* step : {"routing: step 1: layer 0 ", "routing: step 3: layer 0 "}) {
        EXPECT_NE(run.output.find(step), std::string::npos) << step << "\n" << run.output;
      }
      // The trace's counter tracks: per rank, layer and step, its tokens per expert; over the
      // ranks each layer's step sums to 8 x 16 tokens x 2 choices.
      const nlohmann::json events = nlohmann::json::parse(std::ifstream(trace))["traceEvents"];
      std::map<std::string, std::vector<int64_t>> sums;  // layer -> per step (in order per rank)
      std::map<std::string, int> seen;                   // track -> samples so far
      for (const auto& e : events) {
        if (e["ph"] != "C") continue;
        const std::string name = e["name"];
        const std::string layer = name.substr(name.find(" layer ") + 7, 1);
        const size_t step = static_cast<size_t>(seen[name]++);
        int64_t total = 0;
        for (const auto& [series, value] : e["args"].items()) total += value.get<int64_t>();
        sums[layer].resize(std::max(sums[layer].size(), step + 1));
        sums[layer][step] += total;
      }
      ASSERT_EQ(sums.size(), 2u) << trace;
      for (const auto& [layer, per_step] : sums) {
        EXPECT_EQ(per_step, std::vector<int64_t>(3, 8 * 16 * 2)) << layer;
      }
    }
    if (c.layout.find("--ep-overlap") != std::string::npos) {
      EXPECT_NE(run.output.find(" ms of it exposed (no compute beside it"), std::string::npos)
          << run.output;
    }
    if (c.layout.find("PARAMS") != std::string::npos) {
      // --save-params holds every expert, the other rank's too (the main rank's model registers
      // its own only): Qwen2-MoE's layer 0 has 4 (layer 1 is mlp_only).
      const auto saved = testing::load_params(params);
      for (int e = 0; e < 4; ++e) {
        for (const char* projection : {"gate_proj", "up_proj", "down_proj"}) {
          const std::string name =
              "1.mlp.experts." + std::to_string(e) + "." + projection + ".weight";
          EXPECT_TRUE(saved.count(name)) << name;
        }
      }
    }
    if (c.layout.find("--ep-overlap --trace") != std::string::npos) {
      // The backwards run beside a forward are on each rank's "lane 1" row.
      const nlohmann::json events = nlohmann::json::parse(std::ifstream(trace))["traceEvents"];
      std::map<int, std::string> rows;
      std::map<std::string, int> actions;  // row name -> its actions
      for (const auto& e : events) {
        if (e["name"] == "thread_name") rows[e["tid"].get<int>()] = e["args"]["name"];
      }
      for (const auto& e : events) {
        if (e["ph"] == "X" && e.contains("cat") && e["cat"] != "collective") {
          ++actions[rows[e["tid"].get<int>()]];
        }
      }
      for (const char* row : {"rank 0 lane 1", "rank 1 lane 1", "rank 2 lane 1", "rank 3 lane 1"}) {
        EXPECT_GT(actions[row], 0) << row << "\n" << trace;
      }
    }
    if (c.layout.find("--report-memory") != std::string::npos) {
      // The memory model knows the experts: 1/ep of them per rank, their ZeRO shards over the
      // dp / ep replicas holding them, their gradient buffers apart from the others'.
      std::istringstream lines(run.output);
      int checked = 0;
      for (std::string line; std::getline(lines, line);) {
        for (const char* category :
             {"parameters", "gradients", "optimizer state", "reduce buffers"}) {
          if (line.find(std::string("  ") + category + " ") == std::string::npos) continue;
          EXPECT_NE(line.find(" 1.000"), std::string::npos) << line;
          ++checked;
        }
      }
      EXPECT_EQ(checked, 16) << run.output;  // 4 ranks, 4 categories
    }
    pairs.push_back(out + " " + reference + " --rtol 1e-4");
  }
  std::string output;
  const std::vector<double> errors = compare_all(dir, pairs, &output, references);
  ASSERT_EQ(errors.size(), cases.size()) << output;
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_LE(errors[i], 1e-4) << cases[i].arch << " " << cases[i].layout << "\n" << output;
  }
}

// A checkpoint written at one expert-parallel layout resumes at another: sharded, ep2 within dp4
// under ZeRO-2 (each expert and its optimizer state written by the two replicas holding it) into
// dp2 without ep (at step 2), and dp2 without ep into ep2 within dp2 (at step 1; each rank reads
// its own experts): both end where three steps in one run end. Clipped at a norm every step
// exceeds, so the global norm must count each expert once in every layout.
TEST(TrainMoe, ACheckpointResumesAtAnotherExpertParallelLayout) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string dir = testing::scratch_dir("train-moe-resume");
  const std::string common = "train --model " + hf_fixtures() +
                             "/mixtral --data tokens --token-file " + hf_fixtures() +
                             "/tokens.bin --seq-len 16 --batch-size 8 --lr 1e-2 --optimizer "
                             "adamw --adam-eps 1e-4 --chunks 2 --checkpoint-format sharded "
                             "--clip-grad-norm 0.05 ";
  auto run = [&](const std::string& flags) {
    const CliRun r = run_pipetrain(common + flags);
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
  };
  run("--steps 3 --nproc 2 --dp 2 --save-hf " + dir + "/straight");
  run("--steps 2 --nproc 4 --dp 4 --ep 2 --zero 2 --checkpoint-dir " + dir + "/ep2 --save-every 2");
  run("--steps 3 --nproc 2 --dp 2 --resume " + dir + "/ep2 --save-hf " + dir + "/from_ep2");
  run("--steps 1 --nproc 2 --dp 2 --checkpoint-dir " + dir + "/ep1 --save-every 1");
  run("--steps 3 --nproc 2 --dp 2 --ep 2 --resume " + dir + "/ep1 --save-hf " + dir + "/into_ep2");
  std::string output;
  const std::vector<double> errors =
      compare_all(dir,
                  {dir + "/from_ep2 " + dir + "/straight --rtol 1e-5",
                   dir + "/into_ep2 " + dir + "/straight --rtol 1e-5"},
                  &output);
  ASSERT_EQ(errors.size(), 2u) << output;
  EXPECT_LE(errors[0], 1e-5) << output;
  EXPECT_LE(errors[1], 1e-5) << output;
}

// What expert parallelism does not run exits 2 before any rank starts, naming the value.
TEST(TrainMoe, WhatExpertParallelismCannotRunExitsTwoNamingTheValue) {
  const std::string base = "train --model " + hf_fixtures() +
                           "/qwen3_moe --data tokens --token-file " + hf_fixtures() +
                           "/tokens.bin --seq-len 16 --steps 1 ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--nproc 3 --dp 3 --ep 3",
       "--ep 3 does not divide the model's 4 experts per layer; --ep 1 divides them and --dp 3"},
      {"--nproc 4 --stages 2 --dp 2 --ep 4",
       "--ep 4 carves expert-parallel groups out of the data-parallel replicas and does not "
       "divide --dp 2"},
      {"--ep 2", "--ep 2 splits the experts over data-parallel replicas, and --dp 1 has one"},
      {"--nproc 2 --dp 2 --ep 2 --zero 3 --zero-quantized-weights",
       "--ep with ZeRO++: not built yet"},
      // --ep-overlap (PipeOptions::overlap_expert_exchanges says why each).
      {"--nproc 2 --dp 2 --checkpoint never --ep-overlap",
       "--ep-overlap hides the expert all-to-alls of --ep 2 or more, and --ep is 1"},
      {"--nproc 2 --dp 2 --ep 2 --ep-overlap",
       "--ep-overlap needs --checkpoint never (got "
       "except_last)"},
      {"--nproc 4 --dp 2 --tp 2 --ep 2 --checkpoint never --ep-overlap",
       "--ep-overlap with --tp 2"},
      {"--nproc 2 --dp 2 --ep 2 --zero 2 --checkpoint never --ep-overlap",
       "--ep-overlap with --zero 2"},
      // 4 experts, 2 a token, ep 2: a rank can get both choices of every token, twice its share.
      {"--nproc 2 --dp 2 --ep 2 --routing-imbalance 3",
       "--routing-imbalance 3 is outside 1..2, what routing can reach at --ep 2"},
      {"--nproc 2 --dp 2 --routing-imbalance 1.5",
       "--routing-imbalance 1.5 plans for the rows routing sends to the busiest expert-parallel "
       "rank: give a mixture with --ep 2 or more"}};
  for (const auto& [flags, message] : cases) {
    const CliRun r = run_pipetrain(base + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << flags << "\n" << r.output;
  }
  // A checkpoint missing an expert: the rank holding it names the tensor (the launcher's check
  // first, before any rank starts).
  const std::string dir = testing::scratch_dir("train-moe-missing");
  std::filesystem::copy(hf_fixtures() + "/qwen3_moe", dir + "/model");
  {
    const auto checkpoint = io::SafetensorsCheckpoint::open(dir + "/model");
    io::NamedTensorList tensors;
    for (const std::string& name : checkpoint.names()) {
      if (name.find("layers.1.mlp.experts.3.") != std::string::npos) continue;
      tensors.emplace_back(name, checkpoint.load(name, torch::kFloat32));
    }
    io::write_safetensors_checkpoint(dir + "/model", tensors);
  }
  const CliRun missing =
      run_pipetrain("train --model " + dir + "/model --data tokens --token-file " + hf_fixtures() +
                    "/tokens.bin --seq-len 16 --steps 1 --nproc 2 --dp 2 --ep 2");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("tensor 'model.layers.1.mlp.experts.3."), std::string::npos)
      << missing.output;
  const CliRun dense =
      run_pipetrain("train --model " + hf_fixtures() + "/llama --data tokens --token-file " +
                    hf_fixtures() + "/tokens.bin --seq-len 16 --nproc 2 --dp 2 --ep 2");
  EXPECT_EQ(dense.exit_code, 2) << dense.output;
  EXPECT_NE(dense.output.find("--ep 2 splits a mixture's experts, and --model"), std::string::npos)
      << dense.output;
}

// output_router_logits: each MoE layer's load-balancing term, per micro-batch, weighted by its
// share of the loss. Qwen2-MoE's fixture has one MoE layer, so with the whole batch as one
// micro-batch the term is transformers' own (one term over all layers' router logits), and the
// weights equal its training with the auxiliary loss; at 4 micro-batches a pipeline of 2 stages
// (--nproc 2, zb-v: the term's gradient reaches the router through the split backward) ends with
// the weights of one process at the same 4 micro-batches, and not with those of the run without
// the term.
TEST(TrainMoe, TheLoadBalancingTermTrainsAsTransformersAndEqualsOneProcessAtTheSameMicroBatches) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string dir = testing::scratch_dir("train-moe-aux");
  const std::string model = dir + "/qwen2_moe";
  std::filesystem::copy(hf_fixtures() + "/qwen2_moe", model);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(model + "/config.json"));
  config["output_router_logits"] = true;
  config["router_aux_loss_coef"] = 0.5;  // large, so that the term moves the weights visibly
  std::ofstream(model + "/config.json") << config.dump(2);
  const std::string steps =
      " --seq-len 16 --batch-size 8 --steps 3 --lr 1e-2 --optimizer adamw --weight-decay 0.1 "
      "--adam-betas 0.9,0.95 --adam-eps 1e-4 ";
  const std::string reference = "train " + model + " " + hf_fixtures() + "/tokens.bin " + dir +
                                "/reference --seq-len 16 --batch-size 8 --steps 3 --lr 1e-2 "
                                "--betas 0.9,0.95 --eps 1e-4 --weight-decay 0.1";
  auto run = [&](const std::string& name, const std::string& flags, const std::string& from) {
    const CliRun r =
        run_pipetrain("train --model " + from + " --data tokens --token-file " + hf_fixtures() +
                      "/tokens.bin" + steps + flags + " --save-hf " + dir + "/" + name);
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.output;
  };
  run("whole", "", model);
  run("one_process", "--chunks 4", model);
  run("pipelined", "--nproc 2 --chunks 4 --schedule zb-v", model);
  run("without", "--chunks 4", hf_fixtures() + "/qwen2_moe");
  // dp2 with ep2: each replica's 2 micro-batches are the one-process run's 4, each replica's
  // term over its own micro-batches' tokens.
  run("expert_parallel", "--nproc 2 --dp 2 --ep 2 --chunks 2", model);
  std::string output;
  const std::vector<double> errors =
      compare_all(dir,
                  {dir + "/whole " + dir + "/reference --rtol 1e-4",
                   dir + "/pipelined " + dir + "/one_process --rtol 1e-4",
                   dir + "/expert_parallel " + dir + "/one_process --rtol 1e-4",
                   dir + "/without " + dir + "/one_process --rtol 1"},  // last: over its bound
                  &output, {reference});
  ASSERT_EQ(errors.size(), 4u) << output;
  EXPECT_LE(errors[0], 1e-4) << output;
  EXPECT_LE(errors[1], 1e-4) << output;
  EXPECT_LE(errors[2], 1e-4) << output;
  EXPECT_GT(errors[3], 1e-3) << output;  // the term changes the router's training
  // Under sequence parallelism a tp rank would take the term over its slice of the sequence.
  const CliRun sliced =
      run_pipetrain("train --model " + model + " --data tokens --token-file " + hf_fixtures() +
                    "/tokens.bin" + steps + "--nproc 2 --tp 2 --sequence-parallel");
  EXPECT_EQ(sliced.exit_code, 2) << sliced.output;
  EXPECT_NE(sliced.output.find("--sequence-parallel with a mixture whose config.json sets "
                               "output_router_logits"),
            std::string::npos)
      << sliced.output;
}

// plan --world 4 ranks a mixture's layouts with expert parallelism: every ep dividing dp and the
// 4 experts, each with the expert all-to-alls added to its MoE layers and fewer experts' bytes per
// rank (dp4: ep1 holds 4 experts a layer, ep4 one).
TEST(TrainMoe, PlanWorldRanksLayoutsWithExpertParallelism) {
  const CliRun run = run_pipetrain("plan --model " + hf_fixtures() +
                                   "/qwen3_moe --world 4 --sample-shape 8,16 --profile-repeats 1 "
                                   "--profile-warmup 0 --format json");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json plan = nlohmann::json::parse(run.output.substr(run.output.find('{')));
  // (pp, dp, ep) -> the largest rank's parameters, gradients and optimizer state: the peak
  // itself also holds the activations of whichever micro-batches and checkpointing the plan
  // picked by measured times.
  std::map<std::tuple<int, int, int>, int64_t> state;
  for (const auto& layout : plan["ranked"]) {
    state[{layout["pp"].get<int>(), layout["dp"].get<int>(), layout["ep"].get<int>()}] =
        layout["model_state_bytes"].get<int64_t>();
    EXPECT_GT(layout["peak_memory_bytes"].get<int64_t>(),
              layout["model_state_bytes"].get<int64_t>());
  }
  for (const auto& shape : {std::make_tuple(2, 2, 2), std::make_tuple(1, 4, 2),
                            std::make_tuple(1, 4, 4), std::make_tuple(1, 4, 1)}) {
    EXPECT_TRUE(state.count(shape))
        << std::get<0>(shape) << " " << std::get<1>(shape) << " " << std::get<2>(shape) << "\n"
        << run.output;
  }
  EXPECT_LT(state[std::make_tuple(1, 4, 4)], state[std::make_tuple(1, 4, 2)]) << run.output;
  EXPECT_LT(state[std::make_tuple(1, 4, 2)], state[std::make_tuple(1, 4, 1)]) << run.output;
  EXPECT_NE(run.output.find("expert all-to-alls"), std::string::npos) << run.output;
}

TEST(TrainMoe, ReportRoutingOfADenseModelExitsTwo) {
  const CliRun run =
      run_pipetrain("train --model " + hf_fixtures() + "/llama --data tokens --token-file " +
                    hf_fixtures() + "/tokens.bin --seq-len 16 --report-routing");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--report-routing reports a mixture of experts' routing"),
            std::string::npos)
      << run.output;
}

}  // namespace
}  // namespace pipetrain::train_moe_test
