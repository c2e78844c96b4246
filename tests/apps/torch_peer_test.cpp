// pipetrain against PyTorch's own pipeline runtime and launcher, as real processes:
//
//   [1] bench/torch_pipelining.py --make-fixture writes a TorchScript MLP, its initial weights and
//       a batch (one Python process);
//   [2] `pipetrain train --nproc 2` trains model.pt for 3 SGD steps and saves its weights;
//   [3] torch.distributed.pipelining (2 ranks under the pinned torch's torchrun, the same schedule,
//       stages, micro-batches, loss and SGD) trains the same weights on the same batch;
//   [4] the two sets of weights agree (rel 1e-4; both equal sequential training within 1e-5);
//   [5] `pipetrain train` started by torchrun itself (its environment, no --nproc) saves the same
//       weights as the --nproc run.
//
// Skipped only when the project's Python (tests/helpers/python.h) has no torch.
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "../helpers/cli_run.h"
#include "../helpers/python.h"
#include "pipetrain/runtime/launcher.h"

namespace pipetrain {
namespace {

using testing::CliOptions;
using testing::CliRun;
using testing::kPython;

const std::string kPeer = std::string(PIPETRAIN_SOURCE_DIR) + "/bench/torch_pipelining.py";
const std::string kCompare = std::string(PIPETRAIN_SOURCE_DIR) + "/tests/apps/make_models.py";
const std::string kPipetrain = std::string(PIPETRAIN_BINARY_DIR) + "/pipetrain";

// torchrun of the project's venv, 2 ranks on loopback, running `command` (a program and its
// arguments; "--" keeps torchrun from reading their flags).
std::string torchrun(const std::string& command) {
  const std::string launcher = kPython.substr(0, kPython.rfind('/') + 1) + "torchrun";
  return "GLOO_SOCKET_IFNAME=lo " + launcher +
         " --nproc-per-node 2 --master-addr 127.0.0.1 --master-port " +
         std::to_string(find_free_port()) + " " + command;
}

class TorchPeer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!testing::python_has_torch()) return;
    std::string pattern = ::testing::TempDir() + "pipetrain_torch_peer_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = new std::string(pattern);
    // [1] 16 x (Linear(16) + ReLU), 16 rows.
    const CliRun made = run(kPython + " " + kPeer + " --make-fixture " + *dir_ +
                                " --suite small --width 16 --batch 16 --seed 3",
                            "fixture");
    ASSERT_EQ(made.exit_code, 0) << made.output;
  }
  void SetUp() override {
    if (dir_ == nullptr) GTEST_SKIP() << testing::no_python_torch_message();
  }

  static std::string path(const std::string& name) { return *dir_ + "/" + name; }
  static CliRun run(const std::string& command, const std::string& tag) {
    return testing::run_command(
        command,
        CliOptions().log_to(*dir_ + "/" + tag + ".log").timeout_after(std::chrono::seconds(180)));
  }
  // The pipetrain flags of the run both sides make: 3 steps of SGD (lr 0.05) on the whole batch.
  static std::string pipetrain_flags(const std::string& schedule, const std::string& out) {
    return "train --model " + path("model.pt") + " --inputs " + path("x.pt") + " --targets " +
           path("y.pt") + " --loss mse --optimizer sgd --lr 0.05 --batch-size 16 --steps 3 " +
           "--chunks 4 --schedule " + schedule + " --save-params " + path(out);
  }
  static CliRun compare(const std::string& got, const std::string& expected, double rtol) {
    return run(kPython + " " + kCompare + " compare " + path(got) + " " + path(expected) +
                   " --rtol " + std::to_string(rtol),
               got + ".compare");
  }

  static std::string* dir_;
};
std::string* TorchPeer::dir_ = nullptr;

TEST_F(TorchPeer, WeightsAfterThreeStepsEqualTorchDistributedPipeliningsForGpipeAnd1f1b) {
  for (const std::string schedule : {"gpipe", "1f1b"}) {
    // [2]
    const CliRun ours =
        run(kPipetrain + " " + pipetrain_flags(schedule, "ours_" + schedule + ".pt") + " --nproc 2",
            "ours_" + schedule);
    ASSERT_EQ(ours.exit_code, 0) << ours.output;
    // [3]
    const CliRun theirs =
        run(torchrun("-- " + kPeer + " --suite small --width 16 --schedule " + schedule +
                     " --chunks 4 --threads 1 --lr 0.05 --steps 3 --warmup 0 --init-params " +
                     path("init.pt") + " --inputs " + path("x.pt") + " --targets " + path("y.pt") +
                     " --save-params " + path("torch_" + schedule + ".pt")),
            "torch_" + schedule);
    ASSERT_EQ(theirs.exit_code, 0) << theirs.output;
    // [4]
    const CliRun compared = compare("ours_" + schedule + ".pt", "torch_" + schedule + ".pt", 1e-4);
    EXPECT_EQ(compared.exit_code, 0) << schedule << ": " << compared.output;
  }
}

TEST_F(TorchPeer, TorchrunStartedRanksSaveWhatTheNprocRunSaves) {
  // [5] The --nproc run of the test above may not have run (filters): make it here.
  const CliRun launched =
      run(kPipetrain + " " + pipetrain_flags("1f1b", "nproc.pt") + " --nproc 2", "nproc");
  ASSERT_EQ(launched.exit_code, 0) << launched.output;
  const CliRun under_torchrun =
      run(torchrun("--no-python " + kPipetrain + " " + pipetrain_flags("1f1b", "torchrun.pt")),
          "torchrun");
  ASSERT_EQ(under_torchrun.exit_code, 0) << under_torchrun.output;
  // 1e-5, not 0: MKL may round two identical runs differently (train_product_test.cpp).
  const CliRun compared = compare("torchrun.pt", "nproc.pt", 1e-5);
  EXPECT_EQ(compared.exit_code, 0) << compared.output;
}

}  // namespace
}  // namespace pipetrain
