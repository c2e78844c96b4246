// End-to-end tests of `pipetrain train` / `pipetrain eval` as a product (apps/pipetrain/train*.cpp,
// eval.cpp): resume equals the uninterrupted run (also across stage and process counts), a
// SIGKILLed run leaves a loadable checkpoint, bad input exits 2 with a clear message, a diverged
// run exits 1 naming the step, traces and timelines are written, GPT with a tied embedding trains.
// Tiny models and few steps: the whole file runs in well under a minute on 2 cores.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "../helpers/cli_run.h"
#include "../helpers/params_file.h"
#include "../helpers/wait_until.h"
#include "pipetrain/train/checkpoint.h"

namespace {

const std::string kPipetrain = std::string(PIPETRAIN_BINARY_DIR) + "/pipetrain";

using pipetrain::testing::CliOptions;
using pipetrain::testing::load_params;
using pipetrain::testing::max_relative_difference;
using pipetrain::testing::replace_all;
using Result = pipetrain::testing::CliRun;

// Runs `pipetrain ARGUMENTS`; its output also stays in the test directory as LOG.
Result run(const std::string& arguments, const std::string& log) {
  return pipetrain::testing::run_pipetrain(arguments, CliOptions().log_to(log));
}

std::string read_text(const std::string& file) {
  std::ifstream in(file);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Compute actions per rank (the trace's tid) in a Chrome trace; sends and receives (named S.. and
// R..) are left out, and with `op` only the actions whose name has that letter are counted.
std::map<int, int> compute_actions_by_rank(const std::string& file, char op = 0) {
  const nlohmann::json trace = nlohmann::json::parse(read_text(file));
  const nlohmann::json& events = trace.is_array() ? trace : trace.at("traceEvents");
  std::map<int, int> actions;
  for (const auto& event : events) {
    const std::string name = event.value("name", "");
    // Compute actions: not a send or a receive, nor a collective (the ranks' collectives rows).
    if (event.value("ph", "") == "X" && event.value("cat", "") != "collective" &&
        name.find('S') == std::string::npos && name.find('R') == std::string::npos &&
        (op == 0 || name.find(op) != std::string::npos)) {
      ++actions[event.value("tid", -1)];
    }
  }
  return actions;
}

class TrainProduct : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string pattern = ::testing::TempDir() + "pipetrain_product_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = new std::string(pattern);
  }
  static std::string path(const std::string& name) { return *dir_ + "/" + name; }

  // A small MLP on synthetic 28x28 images: 256 rows, batches of 32 (8 steps an epoch).
  static std::string small(const std::string& extra) {
    return "train --data synthetic --synthetic-samples 256 --model mlp "
           "--model-options '{\"widths\": [784, 32, 16, 10]}' --batch-size 32 --seed 3 " +
           extra;
  }

  static std::string* dir_;
};
std::string* TrainProduct::dir_ = nullptr;

TEST_F(TrainProduct, ResumedRunEndsWithTheWeightsOfTheUninterruptedRun) {
  Result whole = run(small("--steps 8 --stages 2 --chunks 2 --save-params " + path("whole.pt")),
                     path("whole.log"));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  Result first =
      run(small("--steps 4 --stages 2 --chunks 2 --checkpoint-format file --checkpoint-dir " +
                path("half")),
          path("half.log"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  Result second = run(small("--steps 8 --stages 2 --chunks 2 --resume " +
                            path("half/checkpoint.pt") + " --save-params " + path("resumed.pt")),
                      path("resumed.log"));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;
  // The same layout and the same arithmetic, but not bit for bit on torch 2.11: two identical
  // runs differed in the last bits once (5.8e-6 relative after 8 steps; 0 usually), most likely
  // MKL (the BLAS of PyPI's torch) taking another kernel path for another buffer alignment.
  EXPECT_LE(max_relative_difference(path("resumed.pt"), path("whole.pt")), 1e-5);
}

TEST_F(TrainProduct, ResumesWithAnotherStageCountAndFromAMultiProcessRun) {
  // SGD with momentum: Adam's first steps are nearly sign(gradient), which turns float rounding
  // in near-zero gradients into lr-sized differences; SGD keeps the comparison tight.
  const std::string sgd = "--optimizer sgd --lr 0.05 --momentum 0.9 ";
  Result whole = run(small(sgd + "--steps 8 --stages 2 --chunks 2 --save-params " + path("w2.pt")),
                     path("w2.log"));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  // First half on 2 processes, second half on 3 stages in one process.
  Result first =
      run(small(sgd + "--steps 4 --nproc 2 --chunks 2 --checkpoint-format file --checkpoint-dir " +
                path("mp")),
          path("mp.log"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  Result second = run(small(sgd + "--steps 8 --stages 3 --chunks 2 --resume " +
                            path("mp/checkpoint.pt") + " --save-params " + path("mp_resumed.pt")),
                      path("mp_resumed.log"));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  // Pipelining is transparent within float rounding (docs/ARCHITECTURE.md: about 1e-5).
  EXPECT_LT(max_relative_difference(path("mp_resumed.pt"), path("w2.pt")), 1e-5);
}

TEST_F(TrainProduct, EvalReportsTheAccuracyOfACheckpoint) {
  Result trained = run(small("--steps 8 --checkpoint-format file --checkpoint-dir " + path("eval")),
                       path("eval_train.log"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  // The epoch's evaluation in training and `pipetrain eval` on the checkpoint agree.
  const auto at = trained.output.find("test accuracy ");
  ASSERT_NE(at, std::string::npos) << trained.output;
  const std::string accuracy = trained.output.substr(at, trained.output.find('%', at) - at);
  Result evaluated = run("eval --checkpoint " + path("eval/checkpoint.pt") +
                             " --data synthetic --synthetic-samples 256 --seed 3",
                         path("eval.log"));
  ASSERT_EQ(evaluated.exit_code, 0) << evaluated.output;
  EXPECT_NE(evaluated.output.find(accuracy), std::string::npos)
      << "training said '" << accuracy << "', eval said:\n"
      << evaluated.output;
}

TEST_F(TrainProduct, ASigkilledRunLeavesItsLastCheckpointLoadable) {
  // Checkpoints every step of a model whose checkpoint takes a while to write; kill at random
  // moments, then load what is on disk.
  std::srand(7);
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string dir = path("kill" + std::to_string(attempt));
    const std::string command =
        kPipetrain +
        " train --data synthetic --synthetic-samples 512 --model mlp --model-options "
        "'{\"widths\": [784, 1024, 1024, 10]}' --batch-size 32 --steps 1000 --save-every 1 "
        "--checkpoint-format file --checkpoint-dir " +
        dir + " >" + dir + ".log 2>&1";
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      setpgid(0, 0);
      execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    // Wait for the first checkpoint (bounded), then kill at a random moment: the random delay is
    // what is tested (a kill that may land in the middle of any write), not a wait for an event.
    pipetrain::testing::wait_until([&] { return std::filesystem::exists(dir + "/checkpoint.pt"); },
                                   std::chrono::seconds(30));
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + std::rand() % 700));
    ::kill(-child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(std::filesystem::exists(dir + "/checkpoint.pt")) << "no checkpoint in 30 s";
    pipetrain::train::Checkpoint checkpoint;
    ASSERT_NO_THROW(checkpoint = pipetrain::train::load_checkpoint(dir + "/checkpoint.pt"));
    EXPECT_GE(checkpoint.step, 1);
    EXPECT_EQ(checkpoint.parameters.size(), 6u);
  }
}

TEST_F(TrainProduct, ADivergedRunExitsOneNamingTheStepAndKeepsTheLastGoodCheckpoint) {
  Result result = run(small("--steps 50 --optimizer sgd --lr 1e12 --save-every 1 "
                            "--checkpoint-format file --checkpoint-dir " +
                            path("nan")),
                      path("nan.log"));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("at step"), std::string::npos) << result.output;
  if (std::filesystem::exists(path("nan/checkpoint.pt"))) {
    pipetrain::train::Checkpoint c = pipetrain::train::load_checkpoint(path("nan/checkpoint.pt"));
    for (const auto& [name, tensor] : c.parameters) {
      EXPECT_TRUE(torch::isfinite(tensor).all().item<bool>()) << name;
    }
  }
}

TEST_F(TrainProduct, WritesTheMeasuredTraceAndTimelineOfEveryRank) {
  Result result = run(small("--steps 3 --nproc 2 --chunks 3 --schedule 1f1b --trace " +
                            path("trace.json") + " --timeline " + path("timeline.svg")),
                      path("trace.log"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::map<int, int> forwards = compute_actions_by_rank(path("trace.json"), 'F');
  // 3 steps x 3 micro-batches of forwards on each of the 2 ranks.
  EXPECT_EQ(forwards[0], 9) << result.output;
  EXPECT_EQ(forwards[1], 9) << result.output;
  const std::string text = read_text(path("timeline.svg"));
  EXPECT_NE(text.find("<svg"), std::string::npos);
  EXPECT_NE(text.find("measured"), std::string::npos);
}

// With data parallelism every replica's ranks are drawn, not replica 0's only.
TEST_F(TrainProduct, TheTraceOfAPipelineTimesDataParallelRunHasEveryRank) {
  Result result = run(small("--steps 2 --nproc 4 --dp 2 --chunks 2 --schedule 1f1b --trace " +
                            path("trace_dp.json") + " --timeline " + path("timeline_dp.svg")),
                      path("trace_dp.log"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::map<int, int> actions = compute_actions_by_rank(path("trace_dp.json"));
  // 2 steps x 2 micro-batches x (F + B) on each of the 4 ranks (2 pipeline x 2 replicas).
  ASSERT_EQ(actions.size(), 4u) << result.output;
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(actions[rank], 8) << "rank " << rank;
  const std::string text = read_text(path("timeline_dp.svg"));
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(text.find(">rank " + std::to_string(rank) + "<"), std::string::npos) << rank;
  }
}

TEST_F(TrainProduct, GptWithATiedEmbeddingTrainsOnTwoStages) {
  const std::string gpt =
      "train --model gpt --data text --model-options "
      "'{\"context\": 16, \"embed_dim\": 16, \"heads\": 2, \"layers\": 1}' --batch-size 8 "
      "--steps 3 --optimizer sgd --lr 0.1 ";
  Result in_process = run(gpt + "--stages 2 --save-params " + path("gpt1.pt"), path("gpt1.log"));
  ASSERT_EQ(in_process.exit_code, 0) << in_process.output;
  EXPECT_NE(in_process.output.find("unigram entropy"), std::string::npos) << in_process.output;
  Result two = run(gpt + "--nproc 2 --save-params " + path("gpt2.pt"), path("gpt2.log"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  // The tie all-reduce keeps both copies equal and equal to the in-process shared tensor.
  EXPECT_LT(max_relative_difference(path("gpt2.pt"), path("gpt1.pt")), 1e-5);
  auto params = load_params(path("gpt2.pt"));
  ASSERT_TRUE(params.count("0.token_embedding.weight"));
  ASSERT_TRUE(params.count("3.weight"));  // layers 1: embedding, block, ln_f, head
  EXPECT_TRUE(torch::equal(params["0.token_embedding.weight"], params["3.weight"]));
}

// Regression: the stages' random streams (dropout) were not in checkpoints, so a resumed run drew
// other dropout masks than the uninterrupted one and ended with other weights.
TEST_F(TrainProduct, AResumedRunWithDropoutEndsWithTheWeightsOfTheUninterruptedRun) {
  const std::string gpt =
      "train --model gpt --data text --model-options "
      "'{\"context\": 16, \"embed_dim\": 16, \"heads\": 2, \"layers\": 1, \"dropout\": 0.3}' "
      "--batch-size 8 --optimizer sgd --lr 0.1 --chunks 2 ";
  for (const std::string layout : {"--stages 2 ", "--nproc 2 "}) {
    SCOPED_TRACE(layout);
    const std::string tag = layout == "--stages 2 " ? "in" : "mp";
    Result whole = run(gpt + layout + "--steps 6 --save-params " + path(tag + "_drop_whole.pt"),
                       path(tag + "_drop_whole.log"));
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    Result first = run(gpt + layout + "--steps 3 --checkpoint-format file --checkpoint-dir " +
                           path(tag + "_drop_half"),
                       path(tag + "_drop_half.log"));
    ASSERT_EQ(first.exit_code, 0) << first.output;
    Result second =
        run(gpt + layout + "--steps 6 --resume " + path(tag + "_drop_half/checkpoint.pt") +
                " --save-params " + path(tag + "_drop_resumed.pt"),
            path(tag + "_drop_resumed.log"));
    ASSERT_EQ(second.exit_code, 0) << second.output;
    EXPECT_LE(max_relative_difference(path(tag + "_drop_resumed.pt"), path(tag + "_drop_whole.pt")),
              1e-5);
    // The dropout is live: the same run without it ends elsewhere (so the check above can fail).
    Result plain = run(replace_all(gpt, "\"dropout\": 0.3", "\"dropout\": 0.0") + layout +
                           "--steps 6 --save-params " + path(tag + "_nodrop.pt"),
                       path(tag + "_nodrop.log"));
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    EXPECT_GT(max_relative_difference(path(tag + "_nodrop.pt"), path(tag + "_drop_whole.pt")),
              1e-3);
  }
}

TEST_F(TrainProduct, AConfigFileGivesFlagsAndTheCommandLineWins) {
  std::ofstream(path("run.json")) << R"({"steps": 2, "batch-size": 16, "lr": 0.5})";
  Result result = run(small("--config " + path("run.json") + " --lr 0.01"), path("config.log"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("done: 2 steps"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("lr 0.01"), std::string::npos) << result.output;
}

// ---- bad input: exit 2 and a message that says what is wrong -----------------------------------

struct BadCase {
  const char* tag;
  const char* arguments;  // {dir} = the test's temporary directory
  const char* expected;   // a piece of the message
};

class TrainProductRejects : public TrainProduct, public ::testing::WithParamInterface<BadCase> {
 protected:
  static void SetUpTestSuite() {
    TrainProduct::SetUpTestSuite();
    // A corrupt Fashion-MNIST directory: files with the right names and garbage inside.
    std::filesystem::create_directories(path("corrupt"));
    for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                             "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
      std::ofstream(path("corrupt/") + name) << "not an IDX file";
    }
    auto save = [](const torch::Tensor& t, const std::string& file) {
      std::vector<char> bytes = torch::pickle_save(t);
      std::ofstream(path(file), std::ios::binary).write(bytes.data(), bytes.size());
    };
    save(torch::randn({20, 1, 28, 28}), "x.pt");
    save(torch::randn({20, 5}), "x_wrong_shape.pt");
    save(torch::randint(0, 10, {20}, torch::kLong), "y.pt");
    save(torch::full({20}, 12, torch::kLong), "y_out_of_range.pt");
  }
};

TEST_P(TrainProductRejects, WithExitCodeTwoAndAClearMessage) {
  const BadCase& param = GetParam();
  Result result = run(replace_all(param.arguments, "{dir}", *dir_),
                      path(std::string("bad_") + param.tag + ".log"));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  const std::string expected = replace_all(param.expected, "{dir}", *dir_);
  EXPECT_NE(result.output.find(expected), std::string::npos)
      << "expected '" << expected << "' in:\n"
      << result.output;
}

#define PIPETRAIN_MLP "train --model mlp --model-options '{\"widths\": [784, 8, 10]}' --steps 1 "

INSTANTIATE_TEST_SUITE_P(
    BadInput, TrainProductRejects,
    ::testing::Values(
        BadCase{"missing_data", PIPETRAIN_MLP "--data-dir {dir}/absent", "{dir}/absent"},
        BadCase{"corrupt_data", PIPETRAIN_MLP "--data-dir {dir}/corrupt", "corrupt"},
        BadCase{"wrong_shape", PIPETRAIN_MLP "--inputs {dir}/x_wrong_shape.pt --targets {dir}/y.pt",
                "check that the inputs match the model's input"},
        BadCase{"wrong_shape_names_the_layer",
                PIPETRAIN_MLP "--inputs {dir}/x_wrong_shape.pt --targets {dir}/y.pt",
                "at layer '1' (layer 1 of 4, torch::nn::LinearImpl, which got [2, 5])"},
        BadCase{"zero_chunks", PIPETRAIN_MLP "--data synthetic --stages 2 --chunks 0",
                "--chunks must be at least 1 (or auto), got 0"},
        BadCase{"batch_larger_than_the_data",
                PIPETRAIN_MLP "--data synthetic --synthetic-samples 64 --batch-size 100",
                "--batch-size 100 is larger than the training set (64 rows of --data synthetic)"},
        BadCase{"labels_out_of_range",
                PIPETRAIN_MLP "--inputs {dir}/x.pt --targets {dir}/y_out_of_range.pt",
                "class index 12"},
        BadCase{"unknown_model", "train --model resnet9000 --steps 1", "valid: mlp, cnn, gpt"},
        BadCase{"unknown_flag", "train --model mlp --learning-rate 3", "--learning-rate"},
        BadCase{"missing_resume", PIPETRAIN_MLP "--data synthetic --resume {dir}/nothing.pt",
                "nothing.pt"},
        BadCase{"eval_missing_checkpoint", "eval --checkpoint {dir}/nothing.pt", "nothing.pt"},
        BadCase{"bad_config", "train --config {dir}/absent.json", "absent.json"},
        BadCase{"unknown_backend",
                PIPETRAIN_MLP "--data synthetic --nproc 2 --backend carrier-pigeon",
                "use gloo, nccl or mpi"},
        BadCase{
            "restarts_without_ranks",
            PIPETRAIN_MLP
            "--data synthetic --max-restarts 2 --checkpoint-format file --checkpoint-dir {dir}/ck",
            "--max-restarts starts the ranks of --nproc N (N >= 2) again"},
        BadCase{"restarts_without_checkpoints",
                PIPETRAIN_MLP "--data synthetic --nproc 2 --max-restarts 2",
                "--max-restarts needs --checkpoint-dir DIR"},
        BadCase{"negative_restarts", PIPETRAIN_MLP "--data synthetic --nproc 2 --max-restarts -1",
                "--max-restarts must be >= 0, got -1"},
        // PyPI's LibTorch has no MPI.
        BadCase{"unavailable_backend", PIPETRAIN_MLP "--data synthetic --nproc 2 --backend mpi",
                "--backend mpi is not available (this LibTorch was built without MPI)"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.tag); });

}  // namespace
