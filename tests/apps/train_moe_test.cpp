// `pipetrain train` with the mixtures of experts transformers makes (tests/helpers/hf_models.h:
// Qwen2-MoE with a shared expert and a dense layer, Qwen3-MoE with its q/k norms, Mixtral), checked
// against transformers' own training: the weights --save-hf writes after three AdamW steps equal
// it, each architecture in another layout (a pipeline in one process, two processes, pp2 x dp2
// under ZeRO-1), so that the three runs cover the layouts between them.
//
// Routing decisions: the fixtures draw their routers with std 1 (hf_reference.py), so a token's
// router logits differ by far more than the two implementations' roundings, before and after the
// steps at lr 1e-2: no top-k choice flips, and equality within 1e-4 is meaningful (a flipped
// choice would move a token's output by a whole expert's).
//
// Adam's eps is 1e-5 here, not the dense tests' 1e-6: Adam turns a gradient element far below
// eps' scale into a full-size update whatever its rounding, and Qwen3-MoE's k_proj (under its
// per-head norm) and experts that see few tokens have such elements. Measured against
// transformers after three steps in one process: 1.06e-4 at eps 1e-6, 3.2e-5 at 1e-5, 4.3e-6 at
// 1e-4 (the experts' products are the same sums in another blocking: transformers multiplies
// gate and up as one fused [2I, H] matrix).
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../helpers/cli_run.h"
#include "../helpers/hf_models.h"

namespace pipetrain::train_moe_test {
namespace {

using testing::CliRun;
using testing::hf_fixtures;
using testing::hf_reference;
using testing::run_pipetrain;

struct Case {
  std::string arch, saved, layout;
};

TEST(TrainMoe, WeightsAfterAdamWEqualTransformersTrainingInThreeLayouts) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string dir = testing::scratch_dir("train-moe");
  const std::vector<Case> cases = {
      {"qwen2_moe", "Qwen2MoeForCausalLM", "--stages 2 --chunks 4 --schedule 1f1b"},
      {"qwen3_moe", "Qwen3MoeForCausalLM", "--nproc 2 --chunks 4 --schedule zb-v"},
      {"mixtral", "MixtralForCausalLM", "--nproc 4 --dp 2 --zero 1 --chunks 2 --schedule 1f1b"}};
  std::ofstream batch(dir + "/compare.txt");
  for (const Case& c : cases) {
    const std::string model = hf_fixtures() + "/" + c.arch;
    const CliRun reference =
        hf_reference("train " + model + " " + hf_fixtures() + "/tokens.bin " + dir + "/" + c.arch +
                     "_reference --seq-len 16 --batch-size 8 --steps 3 --lr 1e-2 "
                     "--betas 0.9,0.95 --eps 1e-5 --weight-decay 0.1");
    ASSERT_EQ(reference.exit_code, 0) << reference.output;
    const std::string out = dir + "/" + c.arch;
    const CliRun run = run_pipetrain(
        "train --model " + model + " --data tokens --token-file " + hf_fixtures() +
        "/tokens.bin --seq-len 16 --batch-size 8 --steps 3 --lr 1e-2 --optimizer adamw "
        "--weight-decay 0.1 --adam-betas 0.9,0.95 --adam-eps 1e-5 " +
        c.layout + " --save-hf " + out);
    ASSERT_EQ(run.exit_code, 0) << c.arch << "\n" << run.output;
    EXPECT_NE(run.output.find("saved " + c.saved), std::string::npos) << run.output;
    batch << "compare " << out << " " << dir << "/" << c.arch << "_reference --rtol 1e-4\n";
  }
  batch.close();
  const CliRun compare = hf_reference("batch " + dir + "/compare.txt");
  const std::vector<double> errors = testing::worst_relative_errors(compare.output);
  ASSERT_EQ(errors.size(), cases.size()) << compare.output;
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_LE(errors[i], 1e-4) << cases[i].arch << "\n" << compare.output;
  }
  EXPECT_EQ(compare.exit_code, 0) << compare.output;
}

}  // namespace
}  // namespace pipetrain::train_moe_test
