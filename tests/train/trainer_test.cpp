// Trainer (train/trainer.h) driven through the public library alone: the same weights as
// sequential training, resume with dropout equal to the uninterrupted run, bad options.
#include "pipetrain/train/trainer.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/train/checkpoint.h"
#include "pipetrain/train/step_runner.h"

namespace pipetrain::train {
namespace {

// Fixed rows, batch k = rows [8k, 8k+8) mod 32: 4 batches an epoch.
TensorBatches fixed_batches() {
  torch::manual_seed(11);
  const torch::Tensor x = torch::randn({32, 6});
  return TensorBatches(x, torch::randn({32, 2}), 8);
}

torch::Tensor mse(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::mse_loss(output, target);
}

// Four layers; with dropout, two Dropout layers that draw from the stages' streams.
torch::nn::Sequential make_model(bool dropout) {
  torch::manual_seed(5);
  torch::nn::Sequential model;
  model->push_back(torch::nn::Linear(6, 16));
  model->push_back(torch::nn::ReLU());
  if (dropout) model->push_back(torch::nn::Dropout(0.4));
  model->push_back(torch::nn::Linear(16, 16));
  if (dropout) model->push_back(torch::nn::Dropout(0.4));
  model->push_back(torch::nn::Linear(16, 2));
  return model;
}

double max_difference(torch::nn::Sequential a, torch::nn::Sequential b) {
  auto pa = a->named_parameters();
  auto pb = b->named_parameters();
  double worst = 0;
  for (const auto& item : pa) {
    worst = std::max(worst, (item.value() - pb[item.key()]).abs().max().item<double>());
  }
  return worst;
}

std::string temporary_directory() {
  std::string pattern = ::testing::TempDir() + "pipetrain_trainer_XXXXXX";
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

TrainerOptions options(int64_t steps) {
  return TrainerOptions(steps).optimizer("sgd").lr(0.05).momentum(0.9).clip_grad_norm(1.0);
}

TEST(Trainer, APipeOfTwoStagesEndsWithTheWeightsOfSequentialTraining) {
  const TensorBatches batches = fixed_batches();
  torch::nn::Sequential reference = make_model(false);
  auto sequential = make_sequential_runner(reference, mse);
  Trainer(reference, *sequential, batches, options(6)).fit();

  torch::nn::Sequential piped = make_model(false);
  auto pipe = make_pipe_runner(piped, mse, PipeOptions().stages(2).chunks(4).schedule("1f1b"));
  Trainer trainer(piped, *pipe, batches, options(6));
  std::vector<int64_t> steps, epochs;
  trainer.on_step = [&](const StepReport& r) { steps.push_back(r.step); };
  trainer.on_epoch_end = [&](int64_t e) { epochs.push_back(e); };
  TrainSummary summary = trainer.fit();

  EXPECT_EQ(summary.steps, 6);
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  // Epoch 0 ends after step 3; the run ends inside epoch 1, which is reported too.
  EXPECT_EQ(epochs, (std::vector<int64_t>{0, 1}));
  EXPECT_LT(max_difference(piped, reference), 1e-5);
}

// Trains steps [0, 3) with a checkpoint, then a fresh model, runner and Trainer resume to 6.
// `keep_streams` false drops the stages' random streams from the checkpoint (the defect).
torch::nn::Sequential resumed_run(const std::string& dir, bool keep_streams) {
  const TensorBatches batches = fixed_batches();
  const PipeOptions pipe = PipeOptions().stages(2).chunks(2).schedule("1f1b");
  {
    torch::nn::Sequential model = make_model(true);
    auto runner = make_pipe_runner(model, mse, pipe);
    Trainer(model, *runner, batches, options(3).checkpoint_format("file").checkpoint_dir(dir))
        .fit();
  }
  Checkpoint saved = load_checkpoint(checkpoint_path(dir));
  EXPECT_EQ(saved.stage_rng_states.size(), 2u);
  if (!keep_streams) saved.stage_rng_states.clear();
  torch::nn::Sequential model = make_model(true);
  restore_model(saved, *model);
  auto runner = make_pipe_runner(model, mse, pipe);
  Trainer trainer(model, *runner, batches, options(6));
  trainer.resume(saved);
  EXPECT_EQ(trainer.first_step(), 3);
  EXPECT_EQ(trainer.fit().steps, 3);
  return model;
}

TEST(Trainer, AResumedRunWithDropoutEndsWithTheWeightsOfTheUninterruptedRun) {
  const TensorBatches batches = fixed_batches();
  torch::nn::Sequential whole = make_model(true);
  auto runner = make_pipe_runner(whole, mse, PipeOptions().stages(2).chunks(2).schedule("1f1b"));
  Trainer(whole, *runner, batches, options(6)).fit();

  const std::string dir = temporary_directory();
  EXPECT_LT(max_difference(resumed_run(dir + "/kept", true), whole), 1e-6);
  // Without the streams the masks after the resume differ: the check above can fail.
  EXPECT_GT(max_difference(resumed_run(dir + "/dropped", false), whole), 1e-4);
  std::filesystem::remove_all(dir);
}

TEST(Trainer, BadOptionsAreBadInputNamingTheOption) {
  const TensorBatches batches = fixed_batches();
  torch::nn::Sequential model = make_model(false);
  auto runner = make_sequential_runner(model, mse);
  try {
    Trainer(model, *runner, batches, TrainerOptions(0));
    ADD_FAILURE() << "no error";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("total_steps must be >= 1 (got 0)"), std::string::npos);
  }
  try {
    Trainer(model, *runner, batches, TrainerOptions(1).lr_schedule("linear"));
    ADD_FAILURE() << "no error";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("'linear'"), std::string::npos);
  }
}

// The settings the CLI takes from flags are checked by the library (check_trainer_settings), so a
// C++ user gets the CLI's messages: each names the flag and the value it refuses.
TEST(Trainer, EveryHandPickedSettingOutOfRangeIsBadInputNamingItsFlagAndValue) {
  const TensorBatches batches = fixed_batches();
  torch::nn::Sequential model = make_model(false);
  auto runner = make_sequential_runner(model, mse);
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<TrainerOptions, std::string>> cases = {
      {TrainerOptions(1).optimizer("rmsprop"), "unknown --optimizer 'rmsprop'; valid: sgd, adam"},
      {TrainerOptions(1).lr(0), "--lr must be a positive number, got 0"},
      {TrainerOptions(1).lr(inf), "--lr must be a positive number, got inf"},
      {TrainerOptions(1).momentum(-0.5), "--momentum must be >= 0, got -0.5"},
      {TrainerOptions(1).weight_decay(inf), "--weight-decay must be a finite number >= 0, got inf"},
      {TrainerOptions(1).lr(0.1).min_lr(0.2), "--min-lr must be in 0..--lr, got 0.2"},
      {TrainerOptions(1).clip_grad_norm(std::nan("")), "--clip-grad-norm must be a finite"},
      {TrainerOptions(1).warmup_steps(-1), "--warmup-steps must be >= 0, got -1"},
      {TrainerOptions(1).save_every(-2), "--save-every must be >= 0, got -2"},
      {TrainerOptions(1).beta2(1), "--adam-betas must be in [0, 1), got 1"},
      {TrainerOptions(1).eps(0), "--adam-eps must be a finite number > 0, got 0"},
      {TrainerOptions(1).zero(4), "--zero must be 0, 1, 2 or 3, got 4"},
      {TrainerOptions(1).offload_optimizer(true), "it needs --zero 1, 2 or 3"},
      {TrainerOptions(1).zero(1).reshard_after_forward(true), "it needs --zero 3, got --zero 1"},
  };
  for (const auto& [options, expected] : cases) {
    try {
      Trainer(model, *runner, batches, options);
      ADD_FAILURE() << "no error; expected: " << expected;
    } catch (const BadInput& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
          << e.what() << "\nexpected: " << expected;
    }
  }
  // The defaults, and the edges that are allowed, pass.
  EXPECT_NO_THROW(check_trainer_settings(TrainerOptions(1)));
  EXPECT_NO_THROW(check_trainer_settings(
      TrainerOptions(1).lr(0.1).min_lr(0.1).momentum(0).beta1(0).clip_grad_norm(0).zero(3)));
}

TEST(Trainer, AFailingStepIsAnErrorNamingTheStep) {
  const TensorBatches batches = fixed_batches();
  torch::nn::Sequential model = make_model(false);
  int calls = 0;
  auto failing = [&calls](const torch::Tensor& out, const torch::Tensor& target) {
    if (++calls == 3) throw std::runtime_error("loss exploded");
    return torch::mse_loss(out, target);
  };
  auto runner = make_sequential_runner(model, failing);
  Trainer trainer(model, *runner, batches, options(5));
  try {
    trainer.fit();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 1);
    EXPECT_NE(std::string(e.what()).find("step 2 failed: loss exploded"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pipetrain::train
