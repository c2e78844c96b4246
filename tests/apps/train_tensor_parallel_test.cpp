// `pipetrain train --tp`: a Hugging Face model made by transformers (tests/helpers/hf_models.h)
// split Megatron-style over tensor-parallel processes, composed with pipeline stages, data-parallel
// replicas and ZeRO, against one-process training of the same model: after three AdamW steps the
// --save-hf output of every layout loads in transformers (from_pretrained) with every parameter
// within 1e-4 of one process's; and what tensor parallelism does not cover yet exits 2 naming it.
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../helpers/cli_run.h"
#include "../helpers/hf_models.h"
#include "../helpers/params_file.h"

namespace pipetrain::train_tensor_parallel_test {
namespace {

using testing::CliRun;
using testing::hf_fixtures;
using testing::hf_reference;
using testing::run_pipetrain;

std::string train_flags(const std::string& arch) {
  const std::string dir = hf_fixtures();
  return "train --model " + dir + "/" + arch + " --data tokens --token-file " + dir +
         "/tokens.bin --seq-len 16 --batch-size 8 --steps 3 --lr 1e-2 --optimizer adamw "
         "--weight-decay 0.1 --adam-betas 0.9,0.95 --adam-eps 1e-6";
}

struct TpLayout {
  std::string name;
  std::string flags;
  bool clip = false;  // compared with the one-process run clipped the same way
};

// qwen2: tied head, q/k/v biases (4 heads, 2 key/value heads, vocabulary 64, MLP 48).
const std::vector<TpLayout> kTpLayouts = {
    {"tp2", "--nproc 2 --tp 2 --chunks 2"},
    {"pp2tp2_1f1b", "--nproc 4 --pp 2 --tp 2 --chunks 4 --schedule 1f1b"},
    {"pp2tp2_gpipe", "--nproc 4 --pp 2 --tp 2 --chunks 4 --schedule gpipe"},
    {"pp2tp2_zbh1", "--nproc 4 --pp 2 --tp 2 --chunks 4 --schedule zb-h1"},
    {"pp2tp2_zbv", "--nproc 4 --pp 2 --tp 2 --chunks 4 --schedule zb-v"},
    {"pp2tp2_interleaved",
     "--nproc 4 --pp 2 --tp 2 --virtual 2 --chunks 4 --schedule "
     "interleaved-1f1b"},
    {"tp2dp2_zero1", "--nproc 4 --tp 2 --dp 2 --zero 1 --chunks 2"},
    {"pp2tp2dp2", "--nproc 8 --pp 2 --tp 2 --dp 2 --chunks 2 --schedule 1f1b"},
    {"tp2_clip", "--nproc 2 --tp 2 --chunks 2 --clip-grad-norm 0.5", true},
    {"tp2_sp", "--nproc 2 --tp 2 --chunks 2 --sequence-parallel"},
    {"pp2tp2_1f1b_sp", "--nproc 4 --pp 2 --tp 2 --chunks 4 --schedule 1f1b --sequence-parallel"},
    {"pp2tp2_zbv_sp", "--nproc 4 --pp 2 --tp 2 --chunks 4 --schedule zb-v --sequence-parallel"},
    {"tp2dp2_zero1_sp", "--nproc 4 --tp 2 --dp 2 --zero 1 --chunks 2 --sequence-parallel"},
    {"tp2_clip_sp", "--nproc 2 --tp 2 --chunks 2 --clip-grad-norm 0.5 --sequence-parallel", true},
    // 4 ranks over 2 key/value heads: each head replicated on 2 ranks (Megatron's way).
    {"tp4", "--nproc 4 --tp 4 --chunks 2"},
    {"tp4_clip_sp", "--nproc 4 --tp 4 --chunks 2 --clip-grad-norm 0.5 --sequence-parallel", true},
    {"pp2tp4_zbh1", "--nproc 8 --pp 2 --tp 4 --chunks 4 --schedule zb-h1"},
};

TEST(TrainTensorParallel, WeightsAfterAdamWEqualOneProcessInEveryLayout) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string dir = testing::scratch_dir("train-tp");
  const std::string flags = train_flags("qwen2");
  const CliRun one = run_pipetrain(flags + " --save-hf " + dir + "/one");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const CliRun clipped = run_pipetrain(flags + " --clip-grad-norm 0.5 --save-hf " + dir + "/clip");
  ASSERT_EQ(clipped.exit_code, 0) << clipped.output;
  std::ofstream batch(dir + "/compare.txt");
  for (const TpLayout& layout : kTpLayouts) {
    const std::string out = dir + "/" + layout.name;
    const CliRun run = run_pipetrain(flags + " " + layout.flags + " --save-hf " + out);
    ASSERT_EQ(run.exit_code, 0) << layout.name << "\n" << run.output;
    EXPECT_NE(run.output.find("tensor-parallel x"), std::string::npos) << run.output;
    if (layout.name == "pp2tp2_1f1b" || layout.name == "pp2tp2_1f1b_sp") {  // 4 micro-batches
      // What crosses the stage boundary: [2, 16, 16] fp32 per micro-batch and direction, the
      // whole sequence, or 1/tp of it with --sequence-parallel.
      const std::string bytes = layout.name == "pp2tp2_1f1b" ? "196608" : "98304";
      EXPECT_NE(run.output.find("transport: " + bytes + " tensor bytes"), std::string::npos)
          << run.output;
    }
    batch << "compare " << out << " " << dir << (layout.clip ? "/clip" : "/one")
          << " --rtol 1e-4\n";
  }
  // The untied llama (llama3 RoPE) in one 3-D layout.
  const CliRun llama_one = run_pipetrain(train_flags("llama") + " --save-hf " + dir + "/llama");
  ASSERT_EQ(llama_one.exit_code, 0) << llama_one.output;
  const CliRun llama = run_pipetrain(train_flags("llama") +
                                     " --nproc 4 --pp 2 --tp 2 --chunks 4 --schedule zb-h1 "
                                     "--save-hf " +
                                     dir + "/llama_pp2tp2");
  ASSERT_EQ(llama.exit_code, 0) << llama.output;
  // (Measured 1.22e-4 here on 2026-12-01, bit for bit the same before and after the loss became a
  // mean over counted targets: three AdamW steps with eps 1e-6 turn the tp sums' other order into
  // up to that much on o_proj. Checked against 2e-4 below.)
  batch << "compare " << dir << "/llama_pp2tp2 " << dir << "/llama --rtol 2e-4\n";
  batch.close();
  // from_pretrained loads each output; every parameter within 1e-4 of one process's.
  const CliRun compare = hf_reference("batch " + dir + "/compare.txt");
  const std::vector<double> errors = testing::worst_relative_errors(compare.output);
  ASSERT_EQ(errors.size(), kTpLayouts.size() + 1) << compare.output;
  for (size_t l = 0; l < errors.size(); ++l) {
    EXPECT_LE(errors[l], l < kTpLayouts.size() ? 1e-4 : 2e-4)
        << (l < kTpLayouts.size() ? kTpLayouts[l].name : "llama") << "\n"
        << compare.output;
  }
  EXPECT_EQ(compare.exit_code, 0) << compare.output;
}

// Checkpoints hold whole tensors: one written at pp 2 x tp 2 resumes at the same layout bit for bit
// and at pp 4 x tp 1, tp 2 x dp 2 and in one process within float rounding (SGD with momentum,
// whose buffer is sliced and joined like the weights; AdamW's eps 1e-6 amplifies the rounding of
// another reduction order to a few 1e-5, as between any two layouts: docs/TENSOR_PARALLEL.md).
TEST(TrainTensorParallel, ACheckpointResumesAtAnotherPipelineTensorDataLayout) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string dir = testing::scratch_dir("train-tp-resume");
  const std::string fixtures = hf_fixtures();
  const std::string flags = "train --model " + fixtures + "/qwen2 --data tokens --token-file " +
                            fixtures +
                            "/tokens.bin --seq-len 16 --batch-size 8 --lr 0.5 --optimizer sgd "
                            "--momentum 0.9";
  const std::string tp = " --nproc 4 --pp 2 --tp 2 --chunks 4";
  const CliRun whole = run_pipetrain(flags + " --steps 4 --save-params " + dir + "/whole.pt");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const CliRun whole_tp =
      run_pipetrain(flags + tp + " --steps 4 --save-params " + dir + "/whole_tp.pt");
  ASSERT_EQ(whole_tp.exit_code, 0) << whole_tp.output;
  const CliRun first = run_pipetrain(
      flags + tp + " --steps 2 --checkpoint-format file --checkpoint-dir " + dir + "/ck");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string resume = " --steps 4 --resume " + dir + "/ck/checkpoint.pt --save-params ";
  const CliRun same = run_pipetrain(flags + tp + resume + dir + "/same.pt");
  ASSERT_EQ(same.exit_code, 0) << same.output;
  EXPECT_EQ(testing::max_relative_difference(dir + "/same.pt", dir + "/whole_tp.pt"), 0.0);
  for (const std::string layout :
       {" --nproc 4 --pp 4 --chunks 4", " --nproc 4 --tp 2 --dp 2 --chunks 2", " --stages 1"}) {
    const CliRun run = run_pipetrain(flags + layout + resume + dir + "/other.pt");
    ASSERT_EQ(run.exit_code, 0) << layout << "\n" << run.output;
    EXPECT_LE(testing::max_relative_difference(dir + "/other.pt", dir + "/whole.pt"), 1e-5)
        << layout;
  }
}

// The auto plan with --tp: rank 0 profiles a copy of its layers split over a mirror group, every
// rank runs the measured plans, and the models are put back before training. The run equals the
// same plan given by hand, byte for byte (before the put-back covered the tp model, the plans'
// timed SGD steps leaked into it).
TEST(TrainTensorParallel, AnAutoPlanWithTensorParallelismTrainsLikeThePlanItChose) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string dir = testing::scratch_dir("train-tp-auto");
  const std::string flags = train_flags("llama") + " --nproc 4 --pp 2 --tp 2 --chunks 2 " +
                            "--schedule 1f1b --save-params ";
  const CliRun planned = run_pipetrain(flags + dir + "/auto.pt --balance auto");
  ASSERT_EQ(planned.exit_code, 0) << planned.output;
  std::smatch m;
  const std::regex chosen(R"(auto plan: 1f1b, chunks 2, balance (\d+) (\d+), checkpoint (\S+),)");
  ASSERT_TRUE(std::regex_search(planned.output, m, chosen)) << planned.output;
  const CliRun by_hand = run_pipetrain(flags + dir + "/by_hand.pt --balance " + m[1].str() + "," +
                                       m[2].str() + " --checkpoint " + m[3].str());
  ASSERT_EQ(by_hand.exit_code, 0) << by_hand.output;
  EXPECT_EQ(testing::max_relative_difference(dir + "/auto.pt", dir + "/by_hand.pt"), 0.0);
}

// bf16 through sequence parallelism's linears (one autograd node that computes under autocast
// and casts its gradients back as autocast's own casts do): the same losses as tensor
// parallelism without it, and within 1e-3 of one process (bf16 rounding at another split).
TEST(TrainTensorParallel, Bf16WithSequenceParallelismTrainsAsWithoutIt) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string flags = train_flags("llama") + " --chunks 2 --precision bf16 ";
  auto losses = [](const CliRun& run) {
    std::smatch m;
    const std::regex done(R"(loss ([0-9.]+) -> ([0-9.]+))");
    std::string text = run.output;
    std::vector<double> found;
    while (std::regex_search(text, m, done)) {
      found = {std::stod(m[1].str()), std::stod(m[2].str())};
      text = m.suffix();
    }
    return found;
  };
  const CliRun one = run_pipetrain(flags + "--stages 2");
  const CliRun tp = run_pipetrain(flags + "--nproc 2 --tp 2");
  const CliRun sp = run_pipetrain(flags + "--nproc 2 --tp 2 --sequence-parallel");
  for (const CliRun* run : {&one, &tp, &sp}) ASSERT_EQ(run->exit_code, 0) << run->output;
  const std::vector<double> want = losses(one), plain = losses(tp), sequence = losses(sp);
  ASSERT_EQ(want.size(), 2u) << one.output;
  EXPECT_EQ(sequence, plain) << sp.output;
  for (size_t k = 0; k < 2 && k < plain.size(); ++k) EXPECT_NEAR(plain[k], want[k], 1e-3);
}

TEST(TrainTensorParallel, WhatItDoesNotCoverExitsTwoNamingTheNumbersOrTheFlag) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string flags = train_flags("qwen2");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--nproc 3 --tp 3",
       "--tp 3 does not divide num_attention_heads (4) of config.json; tensor-parallel sizes "
       "that divide heads, vocabulary and MLP width and divide or are a multiple of the "
       "key/value heads: 1, 2, 4"},
      {"--nproc 3 --tp 2", "--tp 2 x --dp 1 does not divide the world of 3 processes"},
      {"--tp 2", "--pp/--tp/--dp describe a multi-process run: give --nproc 2"},
      {"--nproc 2 --sequence-parallel",
       "--sequence-parallel splits the sequence over the "
       "tensor-parallel ranks: give --tp 2 or more"},
  };
  for (const auto& [extra, want] : cases) {
    const CliRun run = run_pipetrain(flags + " " + extra);
    EXPECT_EQ(run.exit_code, 2) << extra << "\n" << run.output;
    EXPECT_NE(run.output.find(want), std::string::npos) << extra << "\n" << run.output;
  }
  const CliRun odd = run_pipetrain(testing::replace_all(flags, "--seq-len 16", "--seq-len 15") +
                                   " --nproc 2 --tp 2 --sequence-parallel");
  EXPECT_EQ(odd.exit_code, 2) << odd.output;
  EXPECT_NE(odd.output.find("cuts each sample's --seq-len 15 ids into 2 parts"), std::string::npos)
      << odd.output;
  const CliRun mlp = run_pipetrain("train --model mlp --nproc 2 --tp 2 --steps 1");
  EXPECT_EQ(mlp.exit_code, 2) << mlp.output;
  EXPECT_NE(mlp.output.find("'mlp' has no tensor-parallel form"), std::string::npos) << mlp.output;
}

}  // namespace
}  // namespace pipetrain::train_tensor_parallel_test
