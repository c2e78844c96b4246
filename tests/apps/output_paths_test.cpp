// Every path a command will write is checked before the work starts: an unwritable one exits 2
// naming the flag, before the first training step (or the first profile), instead of after it.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../helpers/cli_run.h"
#include "../helpers/python.h"

namespace pipetrain::output_paths_test {
namespace {

using testing::CliRun;
using testing::run_pipetrain;

struct Case {
  std::string name;
  std::string command;  // a run long enough that finishing it first would show
  std::string message;
};

const std::string kTrain =
    "train --model mlp --data synthetic --synthetic-samples 64 --batch-size 8 --steps 100000 ";

class OutputPaths : public ::testing::TestWithParam<Case> {};

TEST_P(OutputPaths, AnUnwritablePathExitsTwoNamingItsFlagBeforeAnyWork) {
  const CliRun run = run_pipetrain(GetParam().command);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find(GetParam().message), std::string::npos) << run.output;
  // Nothing before the error line: no rank launched, no step trained, nothing profiled.
  EXPECT_EQ(run.output.rfind("pipetrain: error: ", 0), 0u) << run.output;
  EXPECT_LE(std::count(run.output.begin(), run.output.end(), '\n'), 1) << run.output;
}

INSTANTIATE_TEST_SUITE_P(
    Flags, OutputPaths,
    ::testing::Values(
        Case{"checkpoint_dir", kTrain + "--checkpoint-dir /proc/nope",
             "--checkpoint-dir: cannot write '/proc/nope'"},
        Case{"checkpoint_dir_nproc", kTrain + "--nproc 2 --checkpoint-dir /proc/nope",
             "--checkpoint-dir: cannot write '/proc/nope'"},
        Case{"save_params", kTrain + "--save-params /nonexistent/dir/p.pt",
             "--save-params: cannot write '/nonexistent/dir/p.pt'"},
        Case{"trace", kTrain + "--trace /nonexistent/t.json", "--trace: cannot write"},
        Case{"timeline", kTrain + "--timeline /tmp", "--timeline: cannot write '/tmp'"},
        Case{"plan_save", "plan --stages 2 --microbatches 4 --schedule 1f1b --save /nonexistent/s",
             "--save: cannot write '/nonexistent/s'"},
        Case{"plan_output", "plan --stages 2 --microbatches 4 --schedule 1f1b --output /tmp",
             "--output: cannot write '/tmp': it is a directory"},
        Case{"plan_profile_out",
             "plan --model mlp --sample-shape 64,784 --profile-out /nonexistent/p.json",
             "--profile-out: cannot write '/nonexistent/p.json'"},
        Case{"plan_model_output", "plan --model mlp --sample-shape 64,784 --output /proc/x/y",
             "--output: cannot write '/proc/x/y'"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// --resume of a TorchScript model (not a checkpoint): one line naming the file, without c10's
// "Exception raised from ..." frame list.
TEST(ResumeErrors, ATorchScriptFileIsRefusedInOneLine) {
  if (!testing::python_has_torch()) GTEST_SKIP() << testing::no_python_torch_message();
  const std::string dir = std::string(PIPETRAIN_BINARY_DIR) + "/test-scratch/resume-torchscript";
  const CliRun made = testing::run_command(
      "mkdir -p " + dir + " && " + testing::kPython +
      " -c 'import torch; torch.jit.save(torch.jit.script(torch.nn.Sequential(torch.nn.Linear(2, "
      "2))), \"" +
      dir + "/model.pt\")'");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const CliRun run = run_pipetrain(kTrain + "--resume " + dir + "/model.pt");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("is not a pipetrain checkpoint"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("Exception raised from"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("frame #"), std::string::npos) << run.output;
  EXPECT_LE(std::count(run.output.begin(), run.output.end(), '\n'), 1) << run.output;
}

}  // namespace
}  // namespace pipetrain::output_paths_test
