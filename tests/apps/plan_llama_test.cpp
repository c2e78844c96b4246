// The memory model of Hugging Face models: `plan --model DIR --memory` plans a
// Llama-3.2-1B-shaped config over 4 ranks from a profile of one decoder layer, never building the
// whole model, and `train --report-memory` on the bench suite's config measures what the model
// predicts, per category.
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "../helpers/cli_run.h"
#include "../helpers/hf_models.h"
#include "bench_options.h"
#include "pipetrain/models/llama_config.h"

namespace pipetrain::plan_llama_test {
namespace {

using testing::CliRun;
using testing::run_pipetrain;
namespace fs = std::filesystem;

// Llama-3.2-1B's config.json as published (its shape: 16 layers of 2048, 32 heads, 8 KV heads,
// a 128256-id vocabulary tied to the head, llama3 RoPE).
const char* kLlama32OneB = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

TEST(PlanLlama, ALlama32OneBShapedConfigPlansOverFourRanksWithoutBuildingTheWholeModel) {
  const std::string dir = testing::scratch_dir("plan-llama/llama-3.2-1b");
  std::ofstream(dir + "/config.json") << kLlama32OneB;
  const models::LlamaConfig config = models::read_llama_config(dir);
  const int64_t whole_bytes = config.parameter_count() * 4;  // float32 weights alone
  ASSERT_GT(whole_bytes, int64_t{4'900'000'000});
  const CliRun run =
      run_pipetrain("plan --model " + dir +
                        " --sample-shape 1,32 --stages 4 --memory --optimizer adam --format json "
                        // One timed trial per figure: what is checked is memory, not time.
                        "--profile-repeats 1 --profile-warmup 0",
                    testing::CliOptions().without_stderr());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // The largest process this test waited for (pipetrain, under sh and timeout) stayed below the
  // whole model's float32 weights, let alone their gradients and Adam's state (4x that).
  struct rusage children {};
  getrusage(RUSAGE_CHILDREN, &children);
  EXPECT_LT(static_cast<int64_t>(children.ru_maxrss) * 1024, whole_bytes);

  const nlohmann::json plan = nlohmann::json::parse(run.output);
  const auto& ranks = plan.at("memory_per_rank");
  ASSERT_EQ(ranks.size(), 4u) << run.output;
  // Every rank's parameters, summed: the model's, with the tied table once on each of the two
  // ranks that hold an end of it (first and last stage).
  int64_t parameters = 0;
  for (const auto& rank : ranks) {
    parameters += rank.at("parameters").get<int64_t>();
    EXPECT_EQ(rank.at("gradients"), rank.at("parameters"));
    EXPECT_EQ(rank.at("optimizer_state").get<int64_t>(), 2 * rank.at("parameters").get<int64_t>());
  }
  const int64_t table = config.vocab_size * config.hidden_size * 4;
  EXPECT_EQ(parameters, whole_bytes + table);
}

// The "meas/pred" column of --report-memory's rows, for every category with bytes (a row of
// nothing ends in "=").
std::vector<double> measured_over_predicted(const std::string& output) {
  static const std::regex row(
      R"(memory: +\d+ +\d+ +[a-z ]+ +\S+ \S?i?B +\S+ \S?i?B +([0-9.]+)\s*$)");
  std::vector<double> ratios;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::smatch match;
    if (std::regex_search(line, match, row)) ratios.push_back(std::stod(match[1].str()));
  }
  return ratios;
}

// The bench suite's config and 20,000 random ids under `dir` (model/, tokens.bin).
void write_bench_model(const std::string& dir) {
  fs::create_directories(dir + "/model");
  std::ofstream(dir + "/model/config.json") << bench::llama_bench_config(256).dump(2);
  torch::manual_seed(0);
  const torch::Tensor ids = torch::randint(4096, {20000}, torch::kInt64).to(torch::kInt16);
  std::ofstream(dir + "/tokens.bin", std::ios::binary)
      .write(static_cast<const char*>(ids.data_ptr()), ids.numel() * 2);
}

TEST(PlanLlama, ReportMemoryOnTheBenchConfigAgreesWithTheModelPerCategory) {
  const std::string dir = testing::scratch_dir("plan-llama/bench-config");
  write_bench_model(dir);
  // Tensor-parallel ranks are predicted from a copy of the model split over a mirror group
  // (transport/c10d.h): a tp rank's slices, and under sequence parallelism its share of the
  // sequence, with ZeRO over the data-parallel group of each pipeline x tp coordinate (ZeRO-3:
  // the shard, and the gathered stages' peak).
  for (const std::string layout :
       {"--stages 2", "--nproc 2", "--nproc 4 --pp 2 --tp 2",
        "--nproc 4 --pp 2 --tp 2 --sequence-parallel --schedule zb-h1 --checkpoint always",
        "--nproc 8 --pp 2 --tp 2 --dp 2 --zero 1",
        "--nproc 8 --pp 2 --tp 2 --dp 2 --zero 3 --schedule interleaved-1f1b --virtual 2"}) {
    const CliRun run = run_pipetrain(
        "train --model " + dir + "/model --init random --data tokens --token-file " + dir +
        "/tokens.bin --seq-len 128 --batch-size 8 --steps 2 --chunks 4 --optimizer adamw "
        "--report-memory " +
        layout + (layout.find("--schedule") == std::string::npos ? " --schedule 1f1b" : ""));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const std::vector<double> ratios = measured_over_predicted(run.output);
    ASSERT_GE(ratios.size(), 8u) << run.output;  // 2 ranks x parameters..activations
    for (double ratio : ratios) EXPECT_NEAR(ratio, 1.0, 0.1) << layout << "\n" << run.output;
  }
}

// Every rank's measured bytes in --report-memory's rows, summed over the categories a device
// holds (everything but "offloaded to host"), by rank.
std::map<int, double> measured_totals(const std::string& output) {
  static const std::regex row(
      R"(memory: +(\d+) +\d+ +([a-z ]+?) +([0-9.]+) (\S?i?B) +([0-9.]+) (\S?i?B))");
  auto bytes = [](const std::string& number, const std::string& unit) {
    const double scale = unit == "GiB"   ? 1 << 30
                         : unit == "MiB" ? 1 << 20
                         : unit == "KiB" ? 1 << 10
                                         : 1;
    return std::stod(number) * scale;
  };
  std::map<int, double> totals;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, row) || m[2].str() == "offloaded to host") continue;
    totals[std::stoi(m[1].str())] += bytes(m[5].str(), m[6].str());
  }
  return totals;
}

// plan --world 4 lists every pipeline x tensor x data layout the model allows (tp 1, 2 and 4;
// 2 and 4 with and without sequence parallelism), ranks those that fit by predicted step, and the
// pp2 x tp2 layout's predicted peak per rank is what `train --report-memory` then measures.
TEST(PlanLlama, WorldSearchRanksEveryLayoutAndItsTensorParallelPeakIsMeasured) {
  const std::string dir = testing::scratch_dir("plan-llama/world");
  write_bench_model(dir);
  const CliRun run = run_pipetrain("plan --model " + dir +
                                       "/model --sample-shape 8,128 --world 4 --optimizer adam "
                                       "--memory-limit 60MiB --schedules 1f1b,gpipe --format json "
                                       "--profile-repeats 1 --profile-warmup 0",
                                   testing::CliOptions().without_stderr());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json plan = nlohmann::json::parse(run.output);
  std::set<std::string> layouts;
  const nlohmann::json* pp2_tp2 = nullptr;
  double previous = 0;
  for (const auto& layout : plan["ranked"]) {
    EXPECT_LE(layout["peak_memory_bytes"].get<int64_t>(), int64_t{60} << 20) << layout.dump();
    EXPECT_GE(layout["step_seconds"].get<double>(), previous);
    previous = layout["step_seconds"].get<double>();
    EXPECT_DOUBLE_EQ(
        layout["step_seconds"].get<double>(),
        layout["pipeline_seconds"].get<double>() + layout["dp_reduce_seconds"].get<double>());
    EXPECT_EQ(layout["tp_collective_seconds"].get<double>() > 0, layout["tp"].get<int>() > 1);
    if (layout["pp"] == 2 && layout["tp"] == 2 && !layout["sequence_parallel"].get<bool>()) {
      pp2_tp2 = &layout;
    }
  }
  for (const char* list : {"ranked", "rejected"}) {
    for (const auto& l : plan[list]) {
      layouts.insert(std::to_string(l["pp"].get<int>()) + "x" + std::to_string(l["tp"].get<int>()) +
                     "x" + std::to_string(l["dp"].get<int>()) +
                     (l["sequence_parallel"].get<bool>() ? "sp" : ""));
    }
  }
  EXPECT_EQ(layouts, (std::set<std::string>{"4x1x1", "2x1x2", "1x1x4", "2x2x1", "2x2x1sp", "1x2x2",
                                            "1x2x2sp", "1x4x1", "1x4x1sp"}))
      << run.output;
  ASSERT_NE(pp2_tp2, nullptr) << run.output;
  const nlohmann::json& p = (*pp2_tp2)["plan"];
  std::string balance;
  for (const auto& count : p["balance"]) {
    balance += (balance.empty() ? "" : ",") + std::to_string(count.get<int>());
  }
  const CliRun train = run_pipetrain(
      "train --model " + dir + "/model --init random --data tokens --token-file " + dir +
      "/tokens.bin --seq-len 128 --batch-size 8 --steps 2 --optimizer adamw --report-memory "
      "--nproc 4 --pp 2 --tp 2 --schedule " +
      p["schedule"].get<std::string>() + " --chunks " + std::to_string(p["chunks"].get<int>()) +
      " --checkpoint " + p["checkpoint"].get<std::string>() + " --balance " + balance);
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const std::map<int, double> totals = measured_totals(train.output);
  ASSERT_EQ(totals.size(), 4u) << train.output;
  double peak = 0;
  for (const auto& [rank, bytes] : totals) peak = std::max(peak, bytes);
  EXPECT_NEAR(peak / (*pp2_tp2)["peak_memory_bytes"].get<double>(), 1.0, 0.1) << p.dump() << "\n"
                                                                              << train.output;
}

TEST(PlanLlama, WorldSearchRefusesWhatItDecidesItselfAndModelsItCannotSplit) {
  const std::string dir = testing::scratch_dir("plan-llama/world-refusals");
  write_bench_model(dir);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--model " + dir + "/model --sample-shape 8,128 --world 4 --stages 2",
       "--stages with --world"},
      {"--model mlp --sample-shape 8,784 --world 4", "give --model DIR"},
      {"--model " + dir + "/model --sample-shape 3,128 --world 8 --zero 1",
       "--world 8 has no pp x tp x dp layout"},
  };
  for (const auto& [flags, want] : cases) {
    const CliRun run = run_pipetrain("plan " + flags);
    EXPECT_EQ(run.exit_code, 2) << flags << "\n" << run.output;
    EXPECT_NE(run.output.find(want), std::string::npos) << flags << "\n" << run.output;
  }
}

}  // namespace
}  // namespace pipetrain::plan_llama_test
