// `pipetrain train|eval|generate|export-hf` with Hugging Face models made by transformers
// (tests/helpers/hf_models.h), checked against transformers itself: the weights --save-hf writes
// after AdamW steps pipelined every way equal transformers' own training (and from_pretrained
// loads them), eval's loss, generate's ids, bf16's losses, and exit 2 naming the file, tensor,
// key or offset for each bad input.
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/cli_run.h"
#include "../helpers/hf_models.h"
#include "pipetrain/io/safetensors.h"

namespace pipetrain::train_llama_test {
namespace {

using testing::CliRun;
using testing::hf_fixtures;
using testing::hf_reference;
using testing::run_pipetrain;
namespace fs = std::filesystem;

// Three AdamW steps on 8 samples of 16 ids. Betas and eps differ from the defaults so that the
// flags are exercised; eps 1e-6 rather than 1e-8 because Adam turns a gradient element far below
// eps' scale into a full-size update whatever its rounding: Qwen2's k_proj bias has elements of
// 1e-8, where transformers' own sdpa and eager attention disagree by 4.3e-4 after three steps at
// eps 1e-8 (docs/MODELS.md).
const std::string kSteps = "--seq-len 16 --batch-size 8 --steps 3 --lr 1e-2";
const std::string kAdam =
    "--optimizer adamw --weight-decay 0.1 --adam-betas 0.9,0.95 --adam-eps 1e-6";

std::string train_flags(const std::string& arch) {
  const std::string dir = hf_fixtures();
  return "train --model " + dir + "/" + arch + " --data tokens --token-file " + dir +
         "/tokens.bin " + kSteps + " " + kAdam;
}

// `flags` with --steps set to `steps`.
std::string replace_steps(const std::string& flags, int steps) {
  return testing::replace_all(flags, "--steps 3", "--steps " + std::to_string(steps));
}

struct Layout {
  std::string name;
  std::string flags;
};

const std::vector<Layout> kLayouts = {
    {"gpipe", "--stages 2 --chunks 4 --schedule gpipe"},
    {"1f1b", "--stages 2 --chunks 4 --schedule 1f1b"},
    {"interleaved", "--stages 2 --virtual 2 --chunks 4 --schedule interleaved-1f1b"},
    {"zbv", "--stages 2 --chunks 4 --schedule zb-v"},
    {"nproc2", "--nproc 2 --chunks 4 --schedule 1f1b"},
    {"nproc4_dp2_zero1", "--nproc 4 --dp 2 --zero 1 --chunks 2 --schedule 1f1b"},
};

class TrainLlama : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainLlama, WeightsAfterAdamWEqualTransformersTrainingInEveryLayout) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string arch = GetParam();
  const std::string dir = testing::scratch_dir("train-llama/" + arch);
  // transformers' training first, in the Python process that compares (one process for both).
  std::ofstream batch(dir + "/compare.txt");
  batch << "train " << hf_fixtures() << "/" << arch << " " << hf_fixtures() << "/tokens.bin " << dir
        << "/reference --seq-len 16 --batch-size 8 --steps 3 --lr 1e-2 --betas 0.9,0.95 --eps "
           "1e-6 --weight-decay 0.1\n";
  for (const Layout& layout : kLayouts) {
    const std::string out = dir + "/" + layout.name;
    const CliRun run = run_pipetrain(train_flags(arch) + " " + layout.flags + " --save-hf " + out);
    ASSERT_EQ(run.exit_code, 0) << layout.name << "\n" << run.output;
    EXPECT_NE(run.output.find("saved " + std::string(arch == "llama"   ? "LlamaForCausalLM"
                                                     : arch == "qwen2" ? "Qwen2ForCausalLM"
                                                                       : "MistralForCausalLM")),
              std::string::npos)
        << run.output;
    batch << "compare " << out << " " << dir << "/reference --rtol 1e-4\n";
  }
  batch.close();
  // from_pretrained loads each output; every parameter within 1e-4 of transformers' training.
  const CliRun compare = hf_reference("batch " + dir + "/compare.txt");
  const std::vector<double> errors = testing::worst_relative_errors(compare.output);
  ASSERT_EQ(errors.size(), kLayouts.size()) << compare.output;
  for (size_t l = 0; l < kLayouts.size(); ++l) {
    EXPECT_LE(errors[l], 1e-4) << arch << " " << kLayouts[l].name << "\n" << compare.output;
  }
  EXPECT_EQ(compare.exit_code, 0) << compare.output;
}

INSTANTIATE_TEST_SUITE_P(Architectures, TrainLlama, ::testing::Values("llama", "qwen2", "mistral"));

TEST(TrainLlama, ExportHfOfACheckpointEqualsSaveHfOfTheSameRun) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string dir = testing::scratch_dir("train-llama/export");
  const CliRun run = run_pipetrain(train_flags("qwen2") +
                                   " --stages 2 --checkpoint-format file --checkpoint-dir " + dir +
                                   "/ck --save-hf " + dir + "/saved");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const CliRun exported =
      run_pipetrain("export-hf " + dir + "/ck/checkpoint.pt " + dir + "/exported");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_NE(exported.output.find("exported step 3"), std::string::npos) << exported.output;
  std::string why;
  EXPECT_TRUE(testing::same_checkpoints(dir + "/saved", dir + "/exported", why)) << why;
  const CliRun bf16 =
      run_pipetrain("export-hf " + dir + "/ck/checkpoint.pt " + dir + "/bf16 --dtype bfloat16");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  EXPECT_EQ(io::SafetensorsCheckpoint::open(dir + "/bf16").entry("model.norm.weight").dtype,
            io::SafetensorsDtype::kBF16);
  const CliRun compare = hf_reference("compare " + dir + "/bf16 " + dir + "/saved --rtol 1e-2");
  EXPECT_EQ(compare.exit_code, 0) << compare.output;
}

// A rank of --nproc holds only its own stages (the others are meta placeholders): its checkpoint
// part, and resuming from the merged checkpoint, must still give the uninterrupted run's weights.
TEST(TrainLlama, AResumedMultiProcessRunEndsWithTheUninterruptedRunsWeights) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string dir = testing::scratch_dir("train-llama/resume");
  const std::string run = train_flags("qwen2") + " --nproc 2 --chunks 4 --schedule 1f1b";
  const CliRun whole = run_pipetrain(replace_steps(run, 4) + " --save-hf " + dir + "/whole");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const CliRun first = run_pipetrain(replace_steps(run, 2) +
                                     " --checkpoint-format file --checkpoint-dir " + dir + "/ck");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const CliRun second = run_pipetrain(replace_steps(run, 4) + " --resume " + dir +
                                      "/ck/checkpoint.pt --save-hf " + dir + "/resumed");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;
  std::string why;
  EXPECT_TRUE(testing::same_checkpoints(dir + "/whole", dir + "/resumed", why)) << why;
}

TEST(TrainLlama, EvalGivesTransformersLossAndPerplexity) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string model = hf_fixtures() + "/llama";
  const std::string tokens = hf_fixtures() + "/tokens.bin";
  const CliRun expected = hf_reference("eval " + model + " " + tokens + " --seq-len 16");
  ASSERT_EQ(expected.exit_code, 0) << expected.output;
  std::smatch want;
  ASSERT_TRUE(std::regex_search(expected.output, want, std::regex(R"(loss ([0-9.]+))")));
  const CliRun run = run_pipetrain("eval --model " + model + " --data tokens --token-file " +
                                   tokens + " --seq-len 16 --batch-size 64 --stages 2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::smatch got;
  ASSERT_TRUE(std::regex_search(
      run.output, got,
      std::regex(R"(eval loss ([0-9.]+) nats, perplexity ([0-9.]+) \(249 samples, 3984 tokens\))")))
      << run.output;
  EXPECT_NEAR(std::stod(got[1].str()), std::stod(want[1].str()), 1e-5) << run.output;
}

TEST(TrainLlama, GenerateGivesTransformersGreedyIds) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  for (const std::string arch : {"llama", "qwen2"}) {
    const std::string model = hf_fixtures() + "/" + arch;
    const CliRun expected =
        hf_reference("generate " + model + " --prompt 5,17,42,3 --max-new-tokens 10");
    ASSERT_EQ(expected.exit_code, 0) << expected.output;
    for (const std::string stages : {"1", "3"}) {
      const CliRun run =
          run_pipetrain("generate --model " + model +
                        " --prompt-tokens 5,17,42,3 --max-new-tokens 10 --stages " + stages);
      ASSERT_EQ(run.exit_code, 0) << run.output;
      EXPECT_EQ(run.output, expected.output) << arch << " with " << stages << " stages";
    }
  }
}

// The losses of "step k/N ... loss L" progress lines, in order.
std::vector<double> losses(const std::string& output) {
  static const std::regex line(R"(step (\d+)/\d+ .*loss ([0-9.]+))");
  std::vector<double> values;
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it) {
    values.push_back(std::stod((*it)[2].str()));
  }
  return values;
}

TEST(TrainLlama, Bf16LossesStayWithinTwoPercentOfFp32ForFiftySteps) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string dir = hf_fixtures();
  // pattern.bin can be learned (each id follows from the one before): the losses fall.
  const std::string run = "train --model " + dir + "/llama --data tokens --token-file " + dir +
                          "/pattern.bin --seq-len 16 --batch-size 8 --steps 50 --lr 3e-3 "
                          "--optimizer adamw --stages 2 --chunks 4 --log-every 1";
  const CliRun fp32 = run_pipetrain(run);
  const CliRun bf16 = run_pipetrain(run + " --precision bf16");
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  const std::vector<double> a = losses(fp32.output), b = losses(bf16.output);
  ASSERT_EQ(a.size(), 50u) << fp32.output;
  ASSERT_EQ(b.size(), 50u) << bf16.output;
  double worst = 0;
  for (size_t k = 0; k < a.size(); ++k) worst = std::max(worst, std::abs(b[k] - a[k]) / a[k]);
  EXPECT_LT(worst, 0.02) << "fp32 " << a.front() << " -> " << a.back() << ", bf16 " << b.front()
                         << " -> " << b.back();
  EXPECT_LT(a.back(), a.front() / 2) << "fp32 did not learn";
}

}  // namespace
}  // namespace pipetrain::train_llama_test
