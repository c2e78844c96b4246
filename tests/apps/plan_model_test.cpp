// `pipetrain plan --model`: profile, search and recommend, end to end through build/pipetrain.
#include <gtest/gtest.h>

#include "../helpers/cli_run.h"
#include "../helpers/hf_models.h"
#include "../helpers/python.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

using CliRun = pipetrain::testing::CliRun;

CliRun plan(const std::string& arguments) {
  return pipetrain::testing::run_pipetrain("plan " + arguments);
}

TEST(PlanModelCli, JsonRecommendsAPlanThatCoversTheModel) {
  const CliRun run = plan("--model mlp --sample-shape 32,784 --stages 2 --format json --top 3");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto json = nlohmann::json::parse(run.output);
  const auto& recommended = json["recommended"];
  for (const char* key : {"schedule", "chunks", "balance", "checkpoint", "virtual_stages",
                          "predicted_step_seconds", "peak_memory_bytes"}) {
    ASSERT_TRUE(recommended.contains(key)) << key << " missing in " << recommended.dump();
  }
  int layers = 0;
  for (int n : recommended["balance"]) layers += n;
  EXPECT_EQ(layers, static_cast<int>(json["profile"]["layers"].size()));
  EXPECT_EQ(recommended["balance"].size(), 2u * recommended["virtual_stages"].get<unsigned>());
  EXPECT_EQ(32 % recommended["chunks"].get<int>(), 0);
  EXPECT_LE(json["ranked"].size(), 3u);
  EXPECT_LE(recommended["predicted_step_seconds"].get<double>(),
            json["default"]["predicted_step_seconds"].get<double>());
}

// Real processes over loopback Gloo: the transfer measurement, the message calibration and both
// plans as 2 ranks each. Figures are not asserted (they are what the run measured), only that
// every part ran and reported.
TEST(PlanModelCli, VerifyWithProcessesRunsBothPlansAsTwoRanks) {
  const CliRun run = plan(
      "--model mlp --sample-shape 32,784 --stages 2 --format json --verify --processes "
      "--verify-steps 1 --verify-rounds 2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto json = nlohmann::json::parse(run.output.substr(run.output.find('{')));
  const auto& transfer = json["profile"]["transfer"];
  EXPECT_NE(transfer["method"].get<std::string>().find("Gloo"), std::string::npos)
      << transfer.dump();
  EXPECT_GT(transfer["latency_seconds"].get<double>(), 0);
  EXPECT_GT(transfer["message_seconds"].get<double>(), 0);
  ASSERT_EQ(json["verify"].size(), 2u) << json["verify"].dump();
  for (const auto& measured : json["verify"]) {
    EXPECT_EQ(measured["measured_step_seconds_per_round"].size(), 2u) << measured.dump();
    EXPECT_GT(measured["measured_step_seconds"].get<double>(), 0) << measured.dump();
    EXPECT_GT(measured["measured_compute_seconds_per_rank"].get<double>(), 0) << measured.dump();
  }
  EXPECT_GT(json["verify_recommended_over_default"].get<double>(), 0);
}

TEST(PlanModelCli, ATinyLimitExitsOneAndNamesTheSmallestLimitThatWorks) {
  const CliRun run = plan("--model mlp --sample-shape 32,784 --stages 2 --memory-limit 1KiB");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("smallest limit that works"), std::string::npos) << run.output;

  const CliRun json = plan(
      "--model mlp --sample-shape 32,784 --stages 2 --memory-limit 1KiB "
      "--format json");
  ASSERT_EQ(json.exit_code, 1) << json.output;
  const auto report = nlohmann::json::parse(json.output);
  const long long smallest = report["smallest_fitting_limit_bytes"];
  // Planning again with exactly that limit finds a plan that fits it.
  const CliRun again = plan(
      "--model mlp --sample-shape 32,784 --stages 2 --format json "
      "--memory-limit " +
      std::to_string(smallest));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_LE(
      nlohmann::json::parse(again.output)["recommended"]["peak_memory_bytes"].get<long long>(),
      smallest);
}

// --zero-ladder: DeepSpeed's ladder on a Llama whose model states dwarf its activations (6.3 M
// parameters, 8 tokens): every rung named with its figures or why it was skipped, ZeRO-Infinity's
// files the first that fits 56 MiB a rank; none without a limit.
TEST(PlanModelCli, ZeroLadderNamesEveryRungAndChoosesTheFirstThatFits) {
  const std::string dir = pipetrain::testing::scratch_dir("plan-zero-ladder");
  std::ofstream(dir + "/config.json") << R"({"architectures": ["LlamaForCausalLM"],
      "model_type": "llama", "hidden_size": 256, "intermediate_size": 1024,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": 8192, "rms_norm_eps": 1e-5, "tie_word_embeddings": false})";
  const std::string flags = "--model " + dir +
                            " --sample-shape 2,4 --stages 2 --dp 2 --optimizer adamw "
                            "--profile-repeats 1 --profile-warmup 0 --zero-ladder";
  const CliRun run = plan(flags + " --memory-limit 56MiB --offload-buffer-bytes 16KiB");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (const char* line :
       {"ZeRO ladder (DeepSpeed's), within 56.0 MiB a rank:", "  ZeRO 0  (--zero 0)  needs ",
        "  ZeRO 1  (--zero 1)  needs ", "  ZeRO 2  (--zero 2)  needs ",
        "  ZeRO 2 + optimizer offload  (--zero 2 --offload-optimizer cpu)  needs ",
        "  ZeRO 3  (--zero 3)  needs ",
        "  ZeRO 3 + parameter offload  (--zero 3 --offload-optimizer cpu --offload-params cpu)  "
        "skipped: on CPU stages",
        "fits: the fastest plan within the limit at this rung",
        "chosen: ZeRO 3 + NVMe (--zero 3 --offload-optimizer nvme --offload-params nvme "
        "--offload-dir DIR), "}) {
    EXPECT_NE(run.output.find(line), std::string::npos) << line << "\n" << run.output;
  }
  const CliRun none = plan(flags);
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_NE(
      none.output.find("--zero-ladder climbs until the run fits a limit: give --memory-limit"),
      std::string::npos)
      << none.output;
}

// --memory: the recommended plan's categories per rank; ZeRO 1 over 2 replicas halves the
// optimizer state (Adam: 2 x the parameters, then 2 x the half-shard), and plans for processes
// add the transport's buffers, which one process does not have; the offload moves the state.
TEST(PlanModelCli, MemoryPrintsEveryRanksCategoriesAndZeroShardsTheOptimizerState) {
  const std::string common =
      "--model mlp --sample-shape 32,784 --stages 2 --format json --optimizer adam --memory "
      "--schedules 1f1b ";
  const CliRun plain = plan(common);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const auto one = nlohmann::json::parse(plain.output)["memory_per_rank"];
  ASSERT_EQ(one.size(), 2u) << plain.output;
  const CliRun sharded = plan(common + "--zero 1 --dp 2 --processes");
  ASSERT_EQ(sharded.exit_code, 0) << sharded.output;
  const auto json = nlohmann::json::parse(sharded.output);
  const auto two = json["memory_per_rank"];
  ASSERT_EQ(two.size(), 2u);
  // Each run is checked against its own plan's parameters (the planner times the layers, so two
  // runs may balance differently), and the model's total against the plain run's.
  long long total_one = 0, total_two = 0;
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_GT(one[r]["parameters"].get<long long>(), 0);
    EXPECT_EQ(one[r]["optimizer_state"].get<long long>(),
              2 * one[r]["parameters"].get<long long>());
    EXPECT_EQ(one[r]["receive_buffers"].get<long long>() + one[r]["send_buffers"].get<long long>(),
              0);
    const auto params = two[r]["parameters"].get<long long>();
    total_one += one[r]["parameters"].get<long long>();
    total_two += params;
    const long long shard = (params / 4 + 1) / 2 * 4;  // float32 elements over 2, rounded up
    EXPECT_EQ(two[r]["optimizer_state"].get<long long>(), 2 * shard);
    // ZeRO 1 writes the reduced sums into the slices of .grad() it steps: no shard of its own.
    EXPECT_EQ(two[r]["gradients"].get<long long>(), params);
    // The reduce-scatter's buffer (one bucket here: the stage's gradients padded to both
    // replicas' shards) and the piece it receives; none without replicas.
    EXPECT_EQ(two[r]["reduce_buffers"].get<long long>(), 2 * shard + shard);
    EXPECT_EQ(one[r]["reduce_buffers"].get<long long>(), 0);
    EXPECT_GT(two[r]["receive_buffers"].get<long long>(), 0);
    EXPECT_GT(two[r]["send_buffers"].get<long long>(), 0);
  }
  EXPECT_EQ(total_two, total_one);
  // adamw, as `train --optimizer adamw` names it, keeps Adam's two moments. The recommended plan
  // is chosen by measured times, so its balance and micro-batches (hence activations) may differ
  // from the adam run's: compare the state with the run's own parameters, and the model's total.
  const CliRun adamw = plan(
      "--model mlp --sample-shape 32,784 --stages 2 --format json --optimizer adamw --memory "
      "--schedules 1f1b");
  ASSERT_EQ(adamw.exit_code, 0) << adamw.output;
  const auto adamw_ranks = nlohmann::json::parse(adamw.output)["memory_per_rank"];
  ASSERT_EQ(adamw_ranks.size(), 2u) << adamw.output;
  long long adamw_params = 0;
  for (size_t r = 0; r < 2; ++r) {
    const auto params = adamw_ranks[r]["parameters"].get<long long>();
    EXPECT_EQ(adamw_ranks[r]["optimizer_state"].get<long long>(), 2 * params);
    adamw_params += params;
  }
  EXPECT_EQ(adamw_params, total_one);
  // The plan's peak is the largest rank total of the same model.
  long long largest = 0;
  for (const auto& rank : two) largest = std::max(largest, rank["total"].get<long long>());
  EXPECT_EQ(json["recommended"]["peak_memory_bytes"].get<long long>(), largest);
  const CliRun no_replicas = plan(common + "--zero 1");
  EXPECT_EQ(no_replicas.exit_code, 2) << no_replicas.output;
  EXPECT_NE(no_replicas.output.find("--dp 2 or more"), std::string::npos) << no_replicas.output;

  // --offload-optimizer: the shard, its gradient and the state go to host memory ("offloaded",
  // not in the total); at one replica the shard is everything, so it needs no --dp, and the
  // reduction's flat gradient is built there too.
  const CliRun offloaded = plan(common + "--zero 1 --offload-optimizer");
  ASSERT_EQ(offloaded.exit_code, 0) << offloaded.output;
  const auto host = nlohmann::json::parse(offloaded.output)["memory_per_rank"];
  ASSERT_EQ(host.size(), 2u);
  for (size_t r = 0; r < 2; ++r) {
    const auto params = host[r]["parameters"].get<long long>();
    EXPECT_EQ(host[r]["optimizer_state"].get<long long>(), 0);
    EXPECT_EQ(host[r]["gradients"].get<long long>(), params);
    EXPECT_EQ(host[r]["offloaded"].get<long long>(), 2 * params + 2 * params + params);
    EXPECT_EQ(host[r]["reduce_buffers"].get<long long>(), 0);
  }
  const CliRun unsharded = plan(common + "--offload-optimizer");
  EXPECT_EQ(unsharded.exit_code, 2) << unsharded.output;
  EXPECT_NE(unsharded.output.find("needs --zero 1, 2 or 3"), std::string::npos) << unsharded.output;
}

// ZeRO-3 by stage under bf16 all-gathers the linears' weights and biases (all of mlp's
// parameters) in bf16: a rank's gather buffer is its stage's elements padded to dp at 2 bytes each,
// plus the bf16 copy of its own piece; in float32 the padded elements at 4 bytes. train
// --report-memory sizes them from the same per-layer figures (LayerProfile::cast_parameter_bytes).
TEST(PlanModelCli, ZeroThreeUnderBf16SizesTheGatherBuffersInBf16) {
  const std::string common =
      "--model mlp --sample-shape 32,784 --stages 2 --format json --memory --schedules 1f1b "
      "--zero 3 --zero3-unit stage --dp 2 ";
  for (const bool bf16 : {false, true}) {
    const CliRun run = plan(common + (bf16 ? "--precision bf16" : ""));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const auto json = nlohmann::json::parse(run.output);
    const auto& balance = json["recommended"]["balance"];
    const auto& layers = json["profile"]["layers"];
    ASSERT_EQ(balance.size(), 2u) << run.output;
    size_t first = 0;
    for (size_t r = 0; r < 2; ++r) {
      long long bytes = 0;
      const size_t end = first + balance[r].get<size_t>();
      for (size_t l = first; l < end; ++l) bytes += layers[l]["parameter_bytes"].get<long long>();
      first = end;
      const long long piece = (bytes / 4 + 1) / 2;  // float32 elements over 2, rounded up
      const long long expected = bf16 ? 2 * piece * 2 + piece * 2 : 2 * piece * 4;
      EXPECT_EQ(json["memory_per_rank"][r]["gather_buffers"].get<long long>(), expected)
          << (bf16 ? "bf16" : "fp32") << ", rank " << r << "\n"
          << run.output;
    }
  }
}

// --precision bf16: the profile runs under autocast, so what crosses a boundary is bfloat16 (half
// of fp32's bytes, layer by layer) and the transport's buffers hold such messages; parameters,
// gradients and optimizer state stay float32. (The two runs may pick different plans: the
// planner times the layers, so each is checked against its own plan.)
TEST(PlanModelCli, Bf16PlansWithBfloat16MessagesAndFloat32Weights) {
  const std::string common =
      "--model mlp --sample-shape 32,784 --stages 2 --format json --optimizer adam --memory "
      "--schedules 1f1b --processes ";
  const CliRun fp32 = plan(common);
  const CliRun bf16 = plan(common + "--precision bf16");
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  const auto wide = nlohmann::json::parse(fp32.output);
  const auto half = nlohmann::json::parse(bf16.output);
  EXPECT_EQ(half["precision"], "bf16");
  EXPECT_EQ(half["profile"]["precision"], "bf16");
  EXPECT_EQ(wide["profile"]["precision"], "fp32");
  const auto& layers = half["profile"]["layers"];
  ASSERT_EQ(layers.size(), wide["profile"]["layers"].size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto& costs = layers[l]["costs"];
    for (size_t k = 0; k < costs.size(); ++k) {
      EXPECT_EQ(2 * costs[k]["output_bytes"].get<long long>(),
                wide["profile"]["layers"][l]["costs"][k]["output_bytes"].get<long long>())
          << "layer " << l << ", micro-batch size index " << k;
    }
  }
  long long parameters_bf16 = 0, parameters_fp32 = 0;
  for (size_t r = 0; r < 2; ++r) {
    const auto& rank = half["memory_per_rank"][r];
    parameters_bf16 += rank["parameters"].get<long long>();
    parameters_fp32 += wide["memory_per_rank"][r]["parameters"].get<long long>();
    EXPECT_EQ(rank["gradients"], rank["parameters"]) << "rank " << r;
    EXPECT_EQ(rank["optimizer_state"].get<long long>(), 2 * rank["parameters"].get<long long>());
  }
  EXPECT_EQ(parameters_bf16, parameters_fp32);
  // Both ranks post up to two receives of the one boundary's message (activations on rank 1, their
  // gradients on rank 0; one per micro-batch): 256-byte header + the bfloat16 data, 64-byte
  // aligned.
  const auto& plan_bf16 = half["recommended"];
  const long long boundary = plan_bf16["balance"][0].get<long long>() - 1;
  const long long size = plan_bf16["microbatch_size"].get<long long>();
  const auto sizes = half["profile"]["microbatch_sizes"].get<std::vector<long long>>();
  const auto at = std::find(sizes.begin(), sizes.end(), size) - sizes.begin();
  ASSERT_LT(static_cast<size_t>(at), sizes.size()) << bf16.output;
  const long long data = layers[boundary]["costs"][at]["output_bytes"].get<long long>();
  const long long message = 256 + (data + 63) / 64 * 64;
  const long long posted = std::min<long long>(2, plan_bf16["chunks"].get<long long>());
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(half["memory_per_rank"][r]["receive_buffers"].get<long long>(), posted * message)
        << "rank " << r << "\n"
        << bf16.output;
  }
  const CliRun fp16 = plan(common + "--precision fp16");
  EXPECT_EQ(fp16.exit_code, 2) << fp16.output;
  EXPECT_NE(fp16.output.find("--precision bf16"), std::string::npos) << fp16.output;
}

TEST(PlanModelCli, BadInputExitsTwoWithAMessage) {
  CliRun run = plan("--model mlp --sample-shape 32,x");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--sample-shape"), std::string::npos) << run.output;
  run = plan("--model no-such-model --sample-shape 4,784");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  run = plan("--model mlp --sample-shape 4,784 --memory-limit lots");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  run = plan("--model mlp --sample-shape 4,784 --stages 100");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  // The message lists every schedule the planner takes, not only the first four.
  run = plan("--model mlp --sample-shape 4,784 --schedules 1f1b,zb-w");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("unknown schedule 'zb-w'"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("dualpipev"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("zb-auto"), std::string::npos) << run.output;
  run = plan("--model mlp --sample-shape 4,784 --profile-repeats 0");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--profile-repeats must be 1 or more (got 0)"), std::string::npos)
      << run.output;
  run = plan("--model mlp --sample-shape 4,784 --profile-warmup -1");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--profile-warmup must be 0 or more (got -1)"), std::string::npos)
      << run.output;
}

TEST(PlanModelCli, PlansATorchScriptFile) {
  const std::string dir = ::testing::TempDir() + "/plan_model_ts";
  const std::string make = pipetrain::testing::kPython + " " + std::string(PIPETRAIN_SOURCE_DIR) +
                           "/tests/apps/make_models.py mlp " + dir + " > /dev/null 2>&1";
  if (std::system(make.c_str()) != 0) GTEST_SKIP() << pipetrain::testing::no_python_torch_message();
  const CliRun run =
      plan("--model " + dir + "/mlp.pt --sample-shape 16,8 --stages 2 --format json");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto json = nlohmann::json::parse(run.output);
  EXPECT_EQ(json["profile"]["layers"].size(), 5u);
}

}  // namespace
