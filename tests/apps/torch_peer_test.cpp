// pipetrain against PyTorch's own pipeline runtime and launcher, as real processes:
//
//   [1] bench/torch_pipelining.py --make-fixture writes a TorchScript MLP, its initial weights and
//       a batch (one Python process);
//   [2] `pipetrain train --nproc 2` trains model.pt for 3 SGD steps and saves its weights;
//   [3] torch.distributed.pipelining (2 ranks under the pinned torch's torchrun, the same schedule,
//       stages, micro-batches, loss and SGD) trains the same weights on the same batch;
//   [4] the two sets of weights agree (rel 1e-4; both equal sequential training within 1e-5);
//   [5] `pipetrain train` started by torchrun itself (its environment, no --nproc) saves the same
//       weights as the --nproc run;
//   [6], [7] schedules cross over as torch's CSV (below).
//
// Skipped only when the project's Python (tests/helpers/python.h) has no torch.
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "../helpers/cli_run.h"
#include "../helpers/hf_models.h"
#include "../helpers/python.h"
#include "pipetrain/runtime/launcher.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/text_format.h"

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
std::string torchrun(const std::string& command, int nproc = 2) {
  const std::string launcher = kPython.substr(0, kPython.rfind('/') + 1) + "torchrun";
  return "GLOO_SOCKET_IFNAME=lo " + launcher + " --nproc-per-node " + std::to_string(nproc) +
         " --master-addr 127.0.0.1 --master-port " + std::to_string(find_free_port()) + " " +
         command;
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

// The peer of `bench --suite tp`: torch's own 2-D composition (bench/torch_pipelining.py --tp 2,
// DTensor parallelize_module on each of 2 pipeline stages, 4 processes) trains transformers'
// Llama to the weights its 2-process pipeline at tp 1 reaches (2 SGD steps at lr 10, so that the
// steps move the weights far beyond rounding; shards gathered whole for the file).
TEST_F(TorchPeer, TheTensorParallelPeerTrainsLikeItsPipelineAtTpOne) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();  // the llama suite runs transformers' own modules
  const std::string flags =
      " --suite llama --width 32 --batch 8 --chunks 2 --schedule 1f1b --threads 1 --lr 10 "
      "--steps 2 --warmup 0 --save-params ";
  const CliRun tp1 = run(torchrun("-- " + kPeer + flags + path("llama_tp1.pt")), "llama_tp1");
  ASSERT_EQ(tp1.exit_code, 0) << tp1.output;
  const CliRun tp2 =
      run(torchrun("-- " + kPeer + flags + path("llama_tp2.pt") + " --tp 2", 4), "llama_tp2");
  ASSERT_EQ(tp2.exit_code, 0) << tp2.output;
  EXPECT_NE(tp2.output.find("\"tp\": 2"), std::string::npos) << tp2.output;
  const CliRun compared = compare("llama_tp2.pt", "llama_tp1.pt", 1e-5);
  EXPECT_EQ(compared.exit_code, 0) << compared.output;
}

// A schedule made in either system runs in the other, through torch's compute-only CSV:
//   [6] torch's ScheduleZBVZeroBubble lists (tests/schedule/torch_schedule_csv.py) run in
//       `pipetrain train --nproc 2 --schedule-file` and give torch's own zb-v weights;
//   [7] pipetrain's v-half (a schedule torch does not have), saved by `pipetrain plan --save`,
//       runs in torch's runtime (_load_csv on the V placement) and gives pipetrain's v-half
//       weights.
TEST_F(TorchPeer, CsvSchedulesRunInTheOtherSystemWithTheSameWeights) {
  const std::string csv_script =
      std::string(PIPETRAIN_SOURCE_DIR) + "/tests/schedule/torch_schedule_csv.py";
  const CliRun dumped = run(kPython + " " + csv_script + " " + *dir_ + " zb-v:2:4", "dump_zbv");
  ASSERT_EQ(dumped.exit_code, 0) << dumped.output;
  // [6]
  const CliRun ours = run(kPipetrain + " " + pipetrain_flags("custom", "ours_torch_zbv.pt") +
                              " --schedule-file " + path("zb-v-2-4.csv") + " --nproc 2",
                          "ours_torch_zbv");
  ASSERT_EQ(ours.exit_code, 0) << ours.output;
  const std::string peer_flags =
      " --suite small --width 16 --chunks 4 --threads 1 --lr 0.05 "
      "--steps 3 --warmup 0 --virtual 2 --init-params " +
      path("init.pt") + " --inputs " + path("x.pt") + " --targets " + path("y.pt");
  const CliRun theirs = run(torchrun("-- " + kPeer + " --schedule zb-v" + peer_flags +
                                     " --save-params " + path("torch_zbv.pt")),
                            "torch_zbv");
  ASSERT_EQ(theirs.exit_code, 0) << theirs.output;
  CliRun compared = compare("ours_torch_zbv.pt", "torch_zbv.pt", 1e-4);
  EXPECT_EQ(compared.exit_code, 0) << compared.output;
  // [7]
  const CliRun saved = run(kPipetrain + " plan --stages 2 --microbatches 4 --schedule v-half " +
                               "--format json --save " + path("v-half.csv"),
                           "plan_vhalf");
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const CliRun ours_vhalf = run(
      kPipetrain + " " + pipetrain_flags("v-half", "ours_vhalf.pt") + " --nproc 2", "ours_vhalf");
  ASSERT_EQ(ours_vhalf.exit_code, 0) << ours_vhalf.output;
  const CliRun torch_vhalf =
      run(torchrun("-- " + kPeer + " --schedule zb-v --load-csv " + path("v-half.csv") +
                   " --dump-csv " + path("torch_ran.csv") + peer_flags + " --save-params " +
                   path("torch_vhalf.pt")),
          "torch_vhalf");
  ASSERT_EQ(torch_vhalf.exit_code, 0) << torch_vhalf.output;
  // Every schedule ends with the same weights, so the weights alone cannot tell that torch ran
  // v-half: its runtime's lists must be the file's.
  const schedule::Schedule ran = schedule::load_schedule(path("torch_ran.csv"));
  const schedule::Schedule v_half = schedule::make_schedule("v-half", 2, 4, 2);
  EXPECT_EQ(ran.actions, v_half.actions);
  EXPECT_NE(ran.actions, schedule::make_schedule("zb-v", 2, 4, 2).actions);
  compared = compare("torch_vhalf.pt", "ours_vhalf.pt", 1e-4);
  EXPECT_EQ(compared.exit_code, 0) << compared.output;
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
