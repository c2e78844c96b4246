// The Pipe as a LibTorch module and as a pipeline: names, clone, inference, memory accounting,
// events, dropout replay.
#include <gtest/gtest.h>

#include <thread>

#include "pipetrain/runtime/pipe.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/schedule/text_format.h"
#include "pipetrain/stage/batchnorm.h"
#include "training_reference.h"

namespace pipetrain {
namespace {

TEST(PipeModule, ParameterNamesAreTheSequentialsOwn) {
  torch::nn::Sequential model = testing::make_mlp();
  std::vector<std::string> expected = model->named_parameters().keys();
  Pipe pipe(model, PipeOptions().stages(3));
  EXPECT_EQ(pipe->named_parameters().keys(), expected);
  EXPECT_EQ(pipe->named_parameters().keys().front(), "0.weight");
}

TEST(PipeModule, CloneCopiesWeightsIntoIndependentLayers) {
  Pipe pipe(testing::make_mlp(), PipeOptions().stages(2).chunks(2));
  auto copy = std::dynamic_pointer_cast<PipeImpl>(pipe->clone());
  ASSERT_TRUE(copy);
  EXPECT_EQ(testing::compare_parameters(*copy, *pipe), "");
  {
    torch::NoGradGuard no_grad;
    copy->parameters()[0].add_(1.0);
  }
  EXPECT_NE(testing::compare_parameters(*copy, *pipe), "");
  auto batch = testing::make_batches(4, 1)[0];
  EXPECT_NO_THROW(copy->train_step(batch.input, batch.target, testing::mse));
}

// A module holding a Pipe: cloning it assigns the Pipe's clone into the holder's new Pipe
// (Cloneable::clone_ -> PipeImpl::operator=), which must give it layers and workers of its own.
struct PipeHolderImpl : torch::nn::Cloneable<PipeHolderImpl> {
  Pipe pipe{nullptr};
  PipeHolderImpl() { reset(); }
  void reset() override {
    pipe = register_module("pipe", Pipe(testing::make_mlp(), PipeOptions().stages(2).chunks(2)));
  }
};
TORCH_MODULE(PipeHolder);

TEST(PipeModule, APipeInsideAClonedModuleTrainsWithLayersOfItsOwn) {
  PipeHolder holder;
  auto copy = std::dynamic_pointer_cast<PipeHolderImpl>(holder->clone());
  ASSERT_TRUE(copy);
  EXPECT_EQ(testing::compare_parameters(*copy, *holder), "");
  auto batch = testing::make_batches(4, 1)[0];
  EXPECT_NO_THROW(copy->pipe->train_step(batch.input, batch.target, testing::mse));
  {
    torch::NoGradGuard no_grad;
    copy->parameters()[0].add_(1.0);
  }
  EXPECT_NE(testing::compare_parameters(*copy, *holder), "");
  EXPECT_TRUE(torch::allclose(copy->pipe->forward(batch.input),
                              copy->pipe->sequential()->forward(batch.input)));
}

TEST(PipeModule, InferenceEqualsTheSequentialForwardForEverySplit) {
  torch::nn::Sequential model = testing::make_skip_mlp();
  torch::Tensor x = torch::randn({10, 6});
  torch::Tensor expected = model->forward(x);
  for (auto [stages, v, schedule] : std::vector<std::tuple<int, int, std::string>>{
           {1, 1, "gpipe"}, {3, 1, "1f1b"}, {4, 2, "interleaved-1f1b"}}) {
    Pipe pipe(model, PipeOptions().stages(stages).virtual_stages(v).schedule(schedule).chunks(4));
    torch::Tensor out = pipe->forward(x);
    EXPECT_FALSE(out.requires_grad());
    EXPECT_TRUE(torch::allclose(out, expected, 1e-6, 1e-7)) << schedule;
    EXPECT_TRUE(
        torch::allclose(pipe->forward(x.narrow(0, 0, 2)), expected.narrow(0, 0, 2), 1e-6, 1e-7));
  }
}

// Records which thread ran its forward and that thread's intra-op thread count.
struct ThreadProbeImpl : torch::nn::Module {
  std::thread::id* thread;
  int* threads;
  ThreadProbeImpl(std::thread::id* t, int* n) : thread(t), threads(n) {}
  torch::Tensor forward(torch::Tensor x) {
    *thread = std::this_thread::get_id();
    *threads = at::get_num_threads();
    return x;
  }
};
TORCH_MODULE(ThreadProbe);

TEST(PipeThreads, OneRankRunsOnTheCallingThreadWithItsThreadCountForTheStepOnly) {
  std::thread::id seen_single, seen_two;
  int threads_single = 0, threads_two = 0;
  const int caller_threads = at::get_num_threads();
  const int wanted = caller_threads == 1 ? 2 : 1;
  {
    torch::nn::Sequential model(torch::nn::Linear(4, 4),
                                ThreadProbe(&seen_single, &threads_single));
    Pipe pipe(model, PipeOptions().stages(1).chunks(2).threads_per_stage(wanted));
    pipe->train_step(torch::randn({4, 4}), torch::randn({4, 4}), testing::mse);
  }
  EXPECT_EQ(seen_single, std::this_thread::get_id());
  EXPECT_EQ(threads_single, wanted);
  EXPECT_EQ(at::get_num_threads(), caller_threads);  // restored after the step
  {
    torch::nn::Sequential model(torch::nn::Linear(4, 4), ThreadProbe(&seen_two, &threads_two));
    Pipe pipe(model, PipeOptions().stages(2).chunks(2).threads_per_stage(wanted));
    pipe->train_step(torch::randn({4, 4}), torch::randn({4, 4}), testing::mse);
  }
  EXPECT_NE(seen_two, std::this_thread::get_id());  // two ranks: the last stage on a worker
  EXPECT_EQ(threads_two, wanted);
}

TEST(PipeMemory, OneFOneBKeepsAtMostRanksMinusStageMicroBatchesWhileGPipeKeepsAll) {
  const int k = 4;
  const int m = 8;
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int l = 0; l < k; ++l) model->push_back(torch::nn::Linear(4, 4));
  for (std::string schedule : {"gpipe", "1f1b"}) {
    Pipe pipe(model,
              PipeOptions().stages(k).chunks(m).schedule(schedule).checkpoint(Checkpoint::kNever));
    pipe->train_step(torch::randn({16, 4}), torch::randn({16, 4}), testing::mse);
    auto accounting = pipe->stage_accounting();
    for (int j = 0; j < k; ++j) {
      EXPECT_EQ(accounting[j].microbatches, m);
      if (schedule == "gpipe") {
        EXPECT_EQ(accounting[j].peak_stashed_microbatches, m) << "stage " << j;
      } else {
        EXPECT_LE(accounting[j].peak_stashed_microbatches, k - j) << "stage " << j;
        EXPECT_GE(accounting[j].peak_stashed_microbatches, 1) << "stage " << j;
      }
    }
  }
}

// What the runtime holds is what the schedule's simulation says: for every family, the peak of
// micro-batches stashed on each stage in one training step (measured by the stages' accounting)
// equals simulate()'s peak_activations (stashed from F until B, or until W when split).
TEST(PipeMemory, MeasuredPeakStashOfEveryStageEqualsTheSimulatedPeakForEverySchedule) {
  const int k = 2;
  const int m = 8;
  for (const auto& name : schedule::schedule_names()) {
    const int v = name == "interleaved-1f1b" ? 2 : schedule::default_virtual_stages(name);
    torch::manual_seed(0);
    torch::nn::Sequential model;
    for (int l = 0; l < k * v; ++l) model->push_back(torch::nn::Linear(4, 4));
    Pipe pipe(model,
              PipeOptions().stages(k * v).virtual_stages(v).chunks(m).schedule(name).checkpoint(
                  Checkpoint::kNever));
    pipe->train_step(torch::randn({16, 4}), torch::randn({16, 4}), testing::mse);
    const auto accounting = pipe->stage_accounting();
    const auto simulated =
        schedule::simulate(schedule::make_schedule(name, k, m, v)).peak_activations;
    ASSERT_EQ(accounting.size(), simulated.size()) << name;
    for (std::size_t j = 0; j < simulated.size(); ++j) {
      EXPECT_EQ(accounting[j].peak_stashed_microbatches, simulated[j]) << name << " stage " << j;
    }
  }
}

// 4 x (Linear(W) + ReLU) per stage, K = 2 stages, M = 8 micro-batches of R rows (the bench's
// except_last_stash_cut configuration, smaller). A kept micro-batch on stage 0 holds its input and
// 4 ReLU results (each Linear saves its input: the stage input or the previous ReLU's result),
// so U = 5 * R * W * 4 bytes; a checkpointed one holds only its input, R * W * 4.
TEST(PipeMemory, StageZeroStashesFollowFromWhatAutogradKeepsPerMicroBatch) {
  const int k = 2;
  const int m = 8;
  const int64_t width = 64;
  const int64_t rows = 4;
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int l = 0; l < 4 * k; ++l) {
    model->push_back(torch::nn::Linear(width, width));
    model->push_back(torch::nn::ReLU());
  }
  const torch::Tensor x = torch::randn({rows * m, width});
  const torch::Tensor y = torch::randn({rows * m, width});
  auto stage0_peak = [&](const std::string& schedule, Checkpoint checkpoint) {
    Pipe pipe(model, PipeOptions().stages(k).chunks(m).schedule(schedule).checkpoint(checkpoint));
    pipe->train_step(x, y, testing::mse);
    return pipe->stage_accounting()[0].peak_stashed_bytes;
  };
  const int64_t input = rows * width * 4;
  const int64_t kept = 5 * input;
  const int64_t gpipe_never = stage0_peak("gpipe", Checkpoint::kNever);
  EXPECT_EQ(gpipe_never, m * kept) << "gpipe holds all M micro-batches at once";

  // except_last: M - 1 checkpointed inputs and the last micro-batch kept, then at most one
  // recomputed micro-batch beside them: the peak is far below keeping everything.
  const int64_t gpipe_except_last = stage0_peak("gpipe", Checkpoint::kExceptLast);
  EXPECT_LE(gpipe_except_last, (m - 1) * input + 2 * kept);
  EXPECT_GE(gpipe_except_last, (m - 1) * input + kept);
  EXPECT_LE(static_cast<double>(gpipe_except_last) / gpipe_never, 0.5)
      << "except_last must cut gpipe's stage-0 stash by at least half";

  // 1F1B: stage 0 has at most K micro-batches in flight.
  const int64_t one_f_one_b = stage0_peak("1f1b", Checkpoint::kNever);
  EXPECT_EQ(one_f_one_b, k * kept);
  EXPECT_NEAR(static_cast<double>(one_f_one_b) / gpipe_never, static_cast<double>(k) / m, 0.01);
}

TEST(PipeEvents, EveryActionOfTheScheduleIsMeasuredOnce) {
  Pipe pipe(testing::make_mlp(), PipeOptions().stages(2).chunks(3).schedule("zb-h1"));
  auto batch = testing::make_batches(6, 1)[0];
  pipe->train_step(batch.input, batch.target, testing::mse);
  size_t actions = 0;
  for (const auto& rank_actions : pipe->schedule().actions) actions += rank_actions.size();
  const auto& events = pipe->last_events();
  EXPECT_EQ(events.size(), actions);
  for (const auto& event : events) EXPECT_LE(event.start_us, event.end_us);
  EXPECT_TRUE(pipe->schedule().splits_backward());
}

TEST(PipeCustom, ACustomScheduleFromTextRunsAndIsTransparent) {
  schedule::Schedule custom = schedule::parse_schedule(
      "0F0,0F1,0B0,0B1\n"
      "1F0,1B0,1F1,1B1\n");
  torch::nn::Sequential reference = testing::make_mlp();
  Pipe pipe(testing::clone_of(reference),
            PipeOptions().stages(2).chunks(2).schedule("custom").custom_schedule(custom));
  auto batches = testing::make_batches(4, 2);
  testing::train_sequential(reference, batches);
  testing::train_pipe(pipe, batches);
  EXPECT_EQ(testing::compare_parameters(*pipe, *reference), "");
}

// Dropout draws random masks, so a whole-batch sequential run draws different numbers than
// per-micro-batch forwards and cannot be the reference. The reference is the same pipeline with
// checkpoint never (activations kept, no replay): checkpointed runs must replay the masks of
// their forward exactly, and every schedule draws the same per-stage stream.
torch::nn::Sequential make_dropout_mlp() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Dropout(0.5),
                               torch::nn::Linear(16, 16), torch::nn::Tanh(),
                               torch::nn::Dropout(0.3), torch::nn::Linear(16, 2));
}

std::string run_dropout(const std::string& schedule, Checkpoint checkpoint, uint64_t seed,
                        torch::nn::Sequential& result, std::vector<int64_t> balance = {2, 4},
                        int64_t virtual_stages = 1) {
  result = testing::clone_of(make_dropout_mlp());
  Pipe pipe(result, PipeOptions()
                        .balance(std::move(balance))
                        .virtual_stages(virtual_stages)
                        .chunks(4)
                        .schedule(schedule)
                        .checkpoint(checkpoint));
  pipe->manual_seed(seed);
  testing::train_pipe(pipe, testing::make_batches(10, 3));
  return "";
}

TEST(PipeDropout, CheckpointReplayDrawsTheSameMasksForEverySchedule) {
  torch::nn::Sequential reference;
  run_dropout("gpipe", Checkpoint::kNever, 42, reference);
  for (std::string schedule : {"gpipe", "1f1b", "zb-h1"}) {
    for (Checkpoint mode : {Checkpoint::kAlways, Checkpoint::kExceptLast, Checkpoint::kNever}) {
      torch::nn::Sequential trained;
      run_dropout(schedule, mode, 42, trained);
      EXPECT_EQ(testing::compare_parameters(*trained, *reference), "")
          << schedule << " " << to_string(mode);
    }
  }
  // Two chunks per rank: the same four stages (each its own stream) as gpipe on four ranks.
  torch::nn::Sequential four_stages;
  run_dropout("gpipe", Checkpoint::kNever, 42, four_stages, {1, 1, 2, 2});
  for (const auto& schedule : schedule::schedule_names()) {
    if (schedule::default_virtual_stages(schedule) != 2) continue;
    for (Checkpoint mode : {Checkpoint::kAlways, Checkpoint::kExceptLast, Checkpoint::kNever}) {
      torch::nn::Sequential trained;
      run_dropout(schedule, mode, 42, trained, {1, 1, 2, 2}, 2);
      EXPECT_EQ(testing::compare_parameters(*trained, *four_stages), "")
          << schedule << " " << to_string(mode);
    }
  }
  for (const std::string schedule : {"zb-h2", "zb-auto"}) {
    torch::nn::Sequential trained;
    run_dropout(schedule, Checkpoint::kAlways, 42, trained);
    EXPECT_EQ(testing::compare_parameters(*trained, *reference), "") << schedule;
  }
  // The comparison can fail: another seed draws other masks and trains other weights.
  torch::nn::Sequential other;
  run_dropout("gpipe", Checkpoint::kNever, 43, other);
  EXPECT_NE(testing::compare_parameters(*other, *reference), "");
}

}  // namespace
}  // namespace pipetrain

namespace pipetrain {
namespace {

void check_deferred_batch_norm(const std::string& schedule);

// Batch norm in a pipeline: each micro-batch is normalised with its own statistics, so the
// reference is a plain loop over the SAME micro-batches (weighted losses) on a copy of the model.
// With checkpointing every forward is replayed; DeferredBatchNorm must not count the replay, so
// running statistics equal the plain loop's (and BatchNorm's on the whole mini-batch).
TEST(PipeBatchNorm, CheckpointedPipelineKeepsRunningStatisticsOfThePlainMicroBatchLoop) {
  for (const auto& schedule : schedule::schedule_names()) {
    SCOPED_TRACE(schedule);
    check_deferred_batch_norm(schedule);
  }
}

void check_deferred_batch_norm(const std::string& schedule) {
  torch::manual_seed(4);
  torch::nn::Sequential plain(torch::nn::Linear(6, 8),
                              DeferredBatchNorm(DeferredBatchNormOptions(8).chunks(4)),
                              torch::nn::Tanh(), torch::nn::Linear(8, 2));
  torch::nn::Sequential piped = testing::clone_of(plain);
  const int64_t v = schedule::default_virtual_stages(schedule);
  Pipe pipe(piped,
            PipeOptions()
                .balance(v == 2 ? std::vector<int64_t>{1, 1, 1, 1} : std::vector<int64_t>{2, 2})
                .virtual_stages(v)
                .chunks(4)
                .schedule(schedule)
                .checkpoint(Checkpoint::kAlways));
  auto batches = testing::make_batches(8, 3);
  auto sgd = testing::make_sgd(plain->parameters());
  for (const auto& batch : batches) {
    sgd.zero_grad();
    for (int i = 0; i < 4; ++i) {
      auto x = batch.input.narrow(0, 2 * i, 2);
      auto y = batch.target.narrow(0, 2 * i, 2);
      (testing::mse(plain->forward(x), y) * 0.25).backward();
    }
    sgd.step();
  }
  testing::train_pipe(pipe, batches);
  EXPECT_EQ(testing::compare_parameters(*pipe, *plain), "");
  auto expected = plain->named_buffers();
  for (const auto& buffer : pipe->named_buffers()) {
    EXPECT_TRUE(torch::allclose(buffer.value().to(torch::kDouble),
                                expected[buffer.key()].to(torch::kDouble), 1e-5, 1e-6))
        << buffer.key();
  }
  EXPECT_EQ(expected["1.num_batches_tracked"].item<int64_t>(), 3);
}

}  // namespace
}  // namespace pipetrain
