// End-to-end tests of `pipetrain train` (apps/pipetrain/train.cpp).
//
// The oracle is Python: tests/apps/make_models.py scripts an MLP, trains the same TorchScript
// model sequentially with torch.optim.SGD and the CLI's batching, and compares the parameters the
// CLI saved (loaded with torch.load) with its own. So a pass shows three things at once: the
// TorchScript model trains through the pipeline, pipelined training equals sequential training,
// and the saved file is a dict Python reads under the TorchScript module's parameter names.
//
// Skipped (GTEST_SKIP) only when the project's Python (tests/helpers/python.h) has no torch.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/cli_run.h"
#include "../helpers/python.h"
#include "../helpers/shared_fixture.h"

namespace {

const std::string kHelper = std::string(PIPETRAIN_SOURCE_DIR) + "/tests/apps/make_models.py";
const std::string kPipetrain = std::string(PIPETRAIN_BINARY_DIR) + "/pipetrain";

using pipetrain::testing::CliOptions;
using pipetrain::testing::kPython;
using Result = pipetrain::testing::CliRun;

// Runs a shell command line; its output also stays in the test directory as LOG.
Result run(const std::string& command, const std::string& log) {
  return pipetrain::testing::run_command(command, CliOptions().log_to(log));
}

class TrainCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string pattern = ::testing::TempDir() + "pipetrain_train_cli_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = new std::string(pattern);
    std::ofstream(*dir_ + "/bad.csv") << "0F0,0Q0\r\n";  // a CSV schedule with an unknown action
    // One Python process makes the files and both references (importing torch is slow), once per
    // build directory (testing::shared_fixture): each test of the suite runs in a process of its
    // own and copies them into its directory. References: 20 rows, batch 8 (does not divide: step
    // 2 reads rows 16..19 and 0..3).
    const std::string made_by =
        "mlp {dir} --rows 20\n"
        "reference --model {dir}/mlp.pt --inputs {dir}/x.pt --targets {dir}/y_mse.pt --loss mse "
        "--lr 0.1 --momentum 0.5 --batch-size 8 --steps 4 --out {dir}/ref_mse.pt\n"
        "reference --model {dir}/mlp.pt --inputs {dir}/x.pt --targets {dir}/y_ce.pt --loss "
        "cross-entropy --lr 0.2 --batch-size 6 --steps 5 --out {dir}/ref_ce.pt\n";
    // Without torch in the project's Python the fixture cannot be made and every test skips; the
    // import is tried only then (it takes seconds, and the fixture is made once).
    std::string shared;
    try {
      shared = make_shared_files(made_by);
    } catch (const std::exception& error) {
      if (!pipetrain::testing::python_has_torch()) {
        std::filesystem::remove_all(*dir_);
        delete dir_;
        dir_ = nullptr;
        return;
      }
      FAIL() << error.what();
    }
    for (const auto& file : std::filesystem::directory_iterator(shared)) {
      std::filesystem::copy_file(file.path(), *dir_ + "/" + file.path().filename().string());
    }
  }

  static std::string make_shared_files(const std::string& made_by) {
    return pipetrain::testing::shared_fixture(
        "train-cli",
        std::to_string(std::filesystem::last_write_time(kHelper).time_since_epoch().count()) + " " +
            std::to_string(std::hash<std::string>()(made_by)),
        [&](const std::string& partial) {
          const std::string commands = partial + "/commands.txt";
          std::ofstream(commands) << pipetrain::testing::replace_all(made_by, "{dir}", partial);
          Result made =
              run(kPython + " " + kHelper + " batch " + commands, partial + "/python.log");
          if (made.exit_code != 0) throw std::runtime_error("make_models.py: " + made.output);
        });
  }

  void SetUp() override {
    if (dir_ == nullptr) GTEST_SKIP() << kPython << " has no torch";
  }

  static std::string path(const std::string& name) { return *dir_ + "/" + name; }

  // `pipetrain train` on the MLP with the mse reference's settings plus `extra`.
  static Result train_mse(const std::string& extra, const std::string& tag) {
    return run(kPipetrain + " train --model " + path("mlp.pt") + " --inputs " + path("x.pt") +
                   " --targets " + path("y_mse.pt") +
                   " --loss mse --optimizer sgd --lr 0.1 --momentum 0.5 --batch-size 8 --steps 4 "
                   "--save-params " +
                   path(tag + ".pt") + " " + extra,
               path(tag + ".log"));
  }

  static Result compare(const std::string& got, const std::string& expected) {
    return run(
        kPython + " " + kHelper + " compare " + path(got) + " " + path(expected) + " --rtol 1e-5",
        path(got + ".compare.log"));
  }

  // The same check as `make_models.py compare`, in C++ (saves a Python start per case).
  static void expect_same_parameters(const std::string& got, const std::string& expected) {
    auto load = [](const std::string& file) {
      std::ifstream in(path(file), std::ios::binary);
      std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      return torch::pickle_load(bytes).toGenericDict();
    };
    auto have = load(got);
    auto want = load(expected);
    ASSERT_EQ(have.size(), want.size());
    auto it = have.begin();
    for (const auto& entry : want) {
      ASSERT_EQ(it->key().toStringRef(), entry.key().toStringRef());
      const torch::Tensor a = it->value().toTensor();
      const torch::Tensor b = entry.value().toTensor();
      ASSERT_EQ(a.sizes(), b.sizes()) << entry.key().toStringRef();
      const double error =
          (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-12);
      EXPECT_LE(error, 1e-5) << entry.key().toStringRef();
      ++it;
    }
  }

  static std::string* dir_;
};
std::string* TrainCli::dir_ = nullptr;

struct ScheduleCase {
  const char* tag;
  const char* flags;
};

class TrainCliSchedules : public TrainCli, public ::testing::WithParamInterface<ScheduleCase> {};

TEST_P(TrainCliSchedules, SavedParametersEqualPythonSequentialTraining) {
  const ScheduleCase& param = GetParam();
  Result trained = train_mse(param.flags, param.tag);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_NE(trained.output.find("step 3 loss"), std::string::npos) << trained.output;
  if (std::string(param.tag) == "sequential") {
    // Once through Python's torch.load, to show the file is the dict Python expects.
    Result compared = compare(std::string(param.tag) + ".pt", "ref_mse.pt");
    EXPECT_EQ(compared.exit_code, 0) << compared.output << "\n--- pipetrain:\n" << trained.output;
  } else {
    expect_same_parameters(std::string(param.tag) + ".pt", "ref_mse.pt");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, TrainCliSchedules,
    ::testing::Values(ScheduleCase{"sequential", "--stages 1 --chunks 1"},
                      ScheduleCase{"gpipe", "--stages 2 --chunks 4 --schedule gpipe"},
                      ScheduleCase{"onefoneb", "--stages 2 --chunks 3 --schedule 1f1b"},
                      ScheduleCase{"zbh1", "--stages 2 --chunks 4 --schedule zb-h1"},
                      ScheduleCase{"interleaved",
                                   "--stages 2 --virtual 2 --chunks 4 --schedule interleaved-1f1b"},
                      ScheduleCase{"balance_always",
                                   "--balance 1,4 --chunks 2 --schedule 1f1b --checkpoint always"}),
    [](const ::testing::TestParamInfo<ScheduleCase>& info) { return std::string(info.param.tag); });

TEST_F(TrainCli, CrossEntropyWithClassIndicesEqualsPython) {
  Result trained =
      run(kPipetrain + " train --model " + path("mlp.pt") + " --inputs " + path("x.pt") +
              " --targets " + path("y_ce.pt") +
              " --loss cross-entropy --optimizer sgd --lr 0.2 --batch-size 6 --steps 5 --stages 2 "
              "--chunks 3 --schedule 1f1b --checkpoint never --save-params " +
              path("ce.pt"),
          path("ce.log"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  expect_same_parameters("ce.pt", "ref_ce.pt");
}

TEST_F(TrainCli, PrintsOneLinePerStepAndTheSameLossesAsPython) {
  Result trained = train_mse("--stages 2 --chunks 2", "losses");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  // python.log holds the mse reference's 4 "step s loss L" lines first, then the others.
  std::ifstream reference(path("python.log"));
  std::string line;
  int lines = 0;
  while (lines < 4 && std::getline(reference, line)) {
    if (line.rfind("step ", 0) != 0) continue;
    // "step s loss L" with 6 decimals: compare the value, not the text (last-digit rounding).
    const auto space = line.rfind(' ');
    const double want = std::stod(line.substr(space + 1));
    const std::string prefix = line.substr(0, space + 1);
    const auto at = trained.output.find(prefix);
    ASSERT_NE(at, std::string::npos) << prefix << "\n" << trained.output;
    const double got = std::stod(trained.output.substr(at + prefix.size()));
    EXPECT_NEAR(got, want, 2e-6 + 1e-5 * std::abs(want)) << line;
    ++lines;
  }
  EXPECT_EQ(lines, 4);
  EXPECT_NE(trained.output.find("done: 4 steps"), std::string::npos) << trained.output;
}

// ---- bad input: exit code 2 and a message that names the problem ------------------------------

struct BadCase {
  const char* tag;
  const char* flags;     // replaces or adds to the good command's flags ({dir} = data dir)
  const char* expected;  // a piece of the message
};

class TrainCliRejects : public TrainCli, public ::testing::WithParamInterface<BadCase> {};

TEST_P(TrainCliRejects, WithExitCodeTwoAndAClearMessage) {
  const BadCase& param = GetParam();
  Result result = run(kPipetrain + " train --lr 0.1 " +
                          pipetrain::testing::replace_all(param.flags, "{dir}", *dir_),
                      path(std::string("bad_") + param.tag + ".log"));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find(param.expected), std::string::npos)
      << "expected '" << param.expected << "' in:\n"
      << result.output;
  // One line for a person: no TorchScript interpreter traceback, no C++ frames.
  EXPECT_EQ(result.output.find("Traceback of TorchScript"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("frame #"), std::string::npos) << result.output;
}

#define PIPETRAIN_GOOD_FILES "--model {dir}/mlp.pt --inputs {dir}/x.pt --targets {dir}/y_mse.pt "
#define PIPETRAIN_SMALL "--batch-size 4 --steps 1 "

INSTANTIATE_TEST_SUITE_P(
    BadInput, TrainCliRejects,
    ::testing::Values(
        BadCase{"missing_model",
                PIPETRAIN_SMALL
                "--model {dir}/absent.pt --inputs {dir}/x.pt --targets {dir}/y_mse.pt --loss mse",
                "absent.pt"},
        BadCase{"model_not_torchscript",
                PIPETRAIN_SMALL
                "--model {dir}/x.pt --inputs {dir}/x.pt --targets {dir}/y_mse.pt --loss mse",
                "not a TorchScript archive"},
        BadCase{"missing_inputs",
                PIPETRAIN_SMALL
                "--model {dir}/mlp.pt --inputs {dir}/nope.pt --targets {dir}/y_mse.pt --loss mse",
                "nope.pt"},
        BadCase{"rows_differ",
                PIPETRAIN_SMALL
                "--model {dir}/mlp.pt --inputs {dir}/x.pt --targets {dir}/y_short.pt --loss mse",
                "--inputs has 20 rows but --targets has 19"},
        BadCase{"float_targets_for_cross_entropy",
                PIPETRAIN_SMALL PIPETRAIN_GOOD_FILES "--loss cross-entropy", "int64"},
        BadCase{"label_out_of_range",
                PIPETRAIN_SMALL
                "--model {dir}/mlp.pt --inputs {dir}/x.pt --targets {dir}/y_ce_big.pt "
                "--loss cross-entropy",
                "class index 7 but the model outputs 4 classes"},
        BadCase{"unknown_loss", PIPETRAIN_SMALL PIPETRAIN_GOOD_FILES "--loss hinge",
                "mse, cross-entropy"},
        BadCase{"unknown_optimizer",
                PIPETRAIN_SMALL PIPETRAIN_GOOD_FILES "--loss mse --optimizer rmsprop",
                "valid: sgd, adam, adamw"},
        BadCase{"unknown_schedule",
                PIPETRAIN_SMALL PIPETRAIN_GOOD_FILES "--loss mse --schedule fast", "gpipe, 1f1b"},
        BadCase{"unknown_checkpoint",
                PIPETRAIN_SMALL PIPETRAIN_GOOD_FILES "--loss mse --checkpoint sometimes",
                "always, except_last, never"},
        BadCase{"zero_batch", PIPETRAIN_GOOD_FILES "--loss mse --steps 1 --batch-size 0",
                "--batch-size must be at least 1"},
        // CLI11 alone read it as --seed 0.
        BadCase{"empty_value", PIPETRAIN_SMALL PIPETRAIN_GOOD_FILES "--loss mse --seed ''",
                "--seed: an empty value (an unset shell variable?); give one"},
        BadCase{"zero_steps", PIPETRAIN_GOOD_FILES "--loss mse --batch-size 4 --steps 0",
                "--steps must be at least 1"},
        BadCase{"balance_sum", PIPETRAIN_SMALL PIPETRAIN_GOOD_FILES "--loss mse --balance 2,2",
                "--balance sums to 4 layers but the model has 5"},
        BadCase{"too_many_stages",
                PIPETRAIN_SMALL PIPETRAIN_GOOD_FILES "--loss mse --stages 3 --virtual 2",
                "only 5 layers"},
        BadCase{"dualpipev_odd_ranks",
                PIPETRAIN_SMALL PIPETRAIN_GOOD_FILES "--loss mse --stages 1 --schedule dualpipev",
                "needs an even number of ranks (got 1); use 2 ranks"},
        BadCase{"dualpipev_too_few_chunks",
                PIPETRAIN_SMALL PIPETRAIN_GOOD_FILES
                "--loss mse --stages 2 --chunks 3 --schedule dualpipev",
                "set the micro-batches (chunks) to 4 or more"},
        BadCase{"v_shape_needs_two_chunks",
                PIPETRAIN_SMALL PIPETRAIN_GOOD_FILES
                "--loss mse --stages 2 --virtual 1 --schedule zb-v",
                "set virtual_stages to 2"},
        BadCase{"csv_schedule_unknown_action",
                PIPETRAIN_SMALL PIPETRAIN_GOOD_FILES "--loss mse --schedule-file {dir}/bad.csv",
                "row 1, cell '0Q0'"},
        BadCase{"missing_required_flag", PIPETRAIN_SMALL "--model {dir}/mlp.pt --loss mse",
                "--inputs"},
        // 4 features into a model that takes 8: the layer is named, the TorchScript traceback is
        // not printed (its last line is).
        BadCase{"inputs_of_the_wrong_width",
                PIPETRAIN_SMALL
                "--model {dir}/mlp.pt --inputs {dir}/y_mse.pt --targets {dir}/y_mse.pt --loss mse",
                "at layer '0' (layer 0 of 5"},
        BadCase{"zero_chunks", PIPETRAIN_SMALL PIPETRAIN_GOOD_FILES "--loss mse --chunks 0",
                "--chunks must be at least 1 (or auto), got 0"},
        BadCase{"batch_larger_than_the_data",
                PIPETRAIN_GOOD_FILES "--loss mse --steps 1 --batch-size 21",
                "--batch-size 21 is larger than the training set (20 rows of --inputs)"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.tag); });

}  // namespace
