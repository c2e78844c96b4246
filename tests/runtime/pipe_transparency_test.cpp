// Transparency: weights after 3 SGD steps (lr 0.1, momentum 0.9) of pipelined training equal
// those of plain sequential training on the whole mini-batch, for every schedule x checkpoint
// mode x balance x micro-batch split.
#include <gtest/gtest.h>

#include "../helpers/tied.h"
#include "pipetrain/base/error.h"
#include "pipetrain/runtime/pipe.h"
#include "training_reference.h"

namespace pipetrain {
namespace {

using testing::Batch;

struct Case {
  std::string schedule;
  int64_t virtual_stages;
  std::vector<int64_t> balance;
  Checkpoint checkpoint;
  int64_t rows;
  int64_t chunks;
};

std::string name_of(const Case& c) {
  std::string balance;
  for (auto b : c.balance) balance += std::to_string(b);
  std::string name = c.schedule + "_V" + std::to_string(c.virtual_stages) + "_b" + balance + "_" +
                     to_string(c.checkpoint) + "_n" + std::to_string(c.rows) + "_m" +
                     std::to_string(c.chunks);
  for (char& ch : name) {
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

std::vector<Case> all_cases() {
  struct Layout {
    std::string schedule;
    int64_t v;
    std::vector<std::vector<int64_t>> balances;
  };
  const std::vector<Layout> layouts = {
      {"gpipe", 1, {{3, 4}, {1, 2, 4}}},
      {"1f1b", 1, {{3, 4}, {1, 2, 4}}},
      {"interleaved-1f1b", 2, {{2, 2, 2, 1}, {1, 1, 3, 2}}},
      {"zb-h1", 1, {{3, 4}, {1, 2, 4}}},
      {"zb-h2", 1, {{3, 4}, {1, 2, 4}}},
      {"zb-auto", 1, {{3, 4}, {1, 2, 4}}},
      // V-shaped: rank r holds stages r and 2K-1-r, so rank 0 holds the first and the last.
      {"zb-v", 2, {{2, 2, 2, 1}, {1, 1, 3, 2}}},
      {"v-half", 2, {{2, 2, 2, 1}, {1, 1, 1, 1, 1, 2}}},
      {"v-min", 2, {{2, 2, 2, 1}, {1, 1, 3, 2}}},
      {"dualpipev", 2, {{2, 2, 2, 1}, {1, 1, 3, 2}}},
      {"interleaved-zb", 2, {{2, 2, 2, 1}, {1, 1, 1, 1, 1, 2}}},
      {"looped-bfs", 2, {{2, 2, 2, 1}, {1, 1, 1, 1, 1, 2}}},
  };
  const std::vector<std::pair<int64_t, int64_t>> splits = {{8, 4}, {10, 4}, {3, 4}};
  std::vector<Case> cases;
  for (const auto& layout : layouts) {
    for (const auto& balance : layout.balances) {
      for (Checkpoint mode : {Checkpoint::kAlways, Checkpoint::kExceptLast, Checkpoint::kNever}) {
        for (const auto& split : splits) {
          // DualPipeV needs M >= 2K micro-batches; 3 rows make 3.
          if (layout.schedule == "dualpipev" && split.first < 4) continue;
          cases.push_back({layout.schedule, layout.v, balance, mode, split.first, split.second});
        }
      }
    }
  }
  return cases;
}

class PipeTransparency : public ::testing::TestWithParam<Case> {};

TEST_P(PipeTransparency, WeightsAfterThreeStepsEqualSequentialTraining) {
  const Case& c = GetParam();
  for (bool with_skip : {false, true}) {
    torch::nn::Sequential reference = with_skip ? testing::make_skip_mlp() : testing::make_mlp();
    torch::nn::Sequential copy = testing::clone_of(reference);
    auto batches = testing::make_batches(c.rows, 3);
    testing::train_sequential(reference, batches);

    Pipe pipe(copy, PipeOptions()
                        .balance(c.balance)
                        .chunks(c.chunks)
                        .schedule(c.schedule)
                        .virtual_stages(c.virtual_stages)
                        .checkpoint(c.checkpoint));
    testing::train_pipe(pipe, batches);
    EXPECT_EQ(testing::compare_parameters(*pipe, *reference), "")
        << (with_skip ? "model with a skip across stages" : "plain MLP");
  }
}

INSTANTIATE_TEST_SUITE_P(AllSchedules, PipeTransparency, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return name_of(info.param); });

// Activation offload (on CPU stages the inputs stay put, but they are set aside after the forward
// and made leaves again before the recompute, prefetched one action ahead by the interpreter):
// still sequential training's weights, with a skip across stages, for the families that order
// backwards differently. Some stage held offloaded inputs.
TEST(PipeTransparency, OffloadedActivationsTrainLikeSequentialTrainingForEveryFamily) {
  const std::vector<std::pair<std::string, int64_t>> schedules = {
      {"gpipe", 1}, {"1f1b", 1},      {"interleaved-1f1b", 2}, {"zb-h1", 1},
      {"zb-v", 2},  {"dualpipev", 2}, {"looped-bfs", 2}};
  for (const auto& [name, v] : schedules) {
    for (Checkpoint mode : {Checkpoint::kAlways, Checkpoint::kExceptLast}) {
      const auto run = testing::train_skip_mlp_both_ways(PipeOptions()
                                                             .stages(2 * v)
                                                             .virtual_stages(v)
                                                             .chunks(4)
                                                             .schedule(name)
                                                             .checkpoint(mode)
                                                             .offload_activations(true));
      EXPECT_EQ(run.difference, "") << name << " checkpoint " << to_string(mode);
      int64_t offloaded = 0;
      for (const auto& stage : run.pipe->stage_accounting()) {
        offloaded += stage.peak_offloaded_bytes;
      }
      EXPECT_GT(offloaded, 0) << name << " checkpoint " << to_string(mode);
    }
  }
}

// Offload with nothing checkpointed is bad input naming the option and what it needs.
TEST(PipeTransparency, OffloadWithoutACheckpointedMicroBatchIsBadInput) {
  const auto message = [](PipeOptions options) {
    try {
      Pipe pipe(testing::make_mlp(), options.stages(2).offload_activations(true));
      return std::string("no error");
    } catch (const BadInput& e) {
      return std::string(e.what());
    }
  };
  EXPECT_NE(message(PipeOptions().chunks(4).checkpoint(Checkpoint::kNever))
                .find("offload_activations moves the inputs that checkpointed micro-batches keep"),
            std::string::npos);
  EXPECT_NE(message(PipeOptions().chunks(1).checkpoint(Checkpoint::kExceptLast))
                .find("except_last with 1 chunk checkpoints none"),
            std::string::npos);
  EXPECT_EQ(message(PipeOptions().chunks(1).checkpoint(Checkpoint::kAlways)), "no error");
}

TEST(PipeTransparency, ReturnedLossIsTheMiniBatchMeanLoss) {
  torch::nn::Sequential reference = testing::make_mlp();
  Pipe pipe(testing::clone_of(reference), PipeOptions().stages(2).chunks(4));
  auto batch = testing::make_batches(10, 1)[0];
  torch::Tensor expected = testing::mse(reference->forward(batch.input), batch.target);
  torch::Tensor loss = pipe->train_step(batch.input, batch.target, testing::mse);
  EXPECT_TRUE(torch::allclose(loss, expected, 1e-5, 1e-6))
      << loss.item<double>() << " vs " << expected.item<double>();
  EXPECT_FALSE(loss.requires_grad());
}

TEST(PipeTransparency, SingleStageZeroBubbleSplitsBackwardWithASkipInsideTheStage) {
  torch::nn::Sequential reference = testing::make_skip_mlp();
  Pipe pipe(testing::clone_of(reference), PipeOptions().stages(1).chunks(3).schedule("zb-h1"));
  auto batches = testing::make_batches(9, 3);
  testing::train_sequential(reference, batches);
  testing::train_pipe(pipe, batches);
  EXPECT_EQ(testing::compare_parameters(*pipe, *reference), "");
}

// 7 layers; layer 4 uses layer 2's weight.
torch::nn::Sequential make_tied_mlp() {
  torch::manual_seed(3);
  torch::nn::Linear shared(8, 8);
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::Tanh(), shared,
                               torch::nn::Tanh(), testing::TiedLinear(shared->weight),
                               torch::nn::Tanh(), torch::nn::Linear(8, 2));
}

// A weight tied between two layers of one stage, with the backward split into I and W: each
// layer's W adds its own part of the gradient (the fix for "backward through the graph a second
// time" that zb-h1 hit here), for every zero-bubble schedule and checkpoint mode.
TEST(PipeTransparency, AWeightTiedWithinOneStageTrainsWithEveryZeroBubbleSchedule) {
  const struct {
    const char* schedule;
    int64_t virtual_stages;
    std::vector<int64_t> balance;  // layers 1..4 (both uses of the tie) on one stage
  } layouts[] = {{"zb-h1", 1, {5, 2}},           {"zb-h2", 1, {5, 2}},
                 {"zb-auto", 1, {5, 2}},         {"zb-v", 2, {1, 4, 1, 1}},
                 {"v-half", 2, {1, 4, 1, 1}},    {"v-min", 2, {1, 4, 1, 1}},
                 {"dualpipev", 2, {1, 4, 1, 1}}, {"interleaved-zb", 2, {1, 4, 1, 1}}};
  for (const auto& layout : layouts) {
    for (Checkpoint mode : {Checkpoint::kAlways, Checkpoint::kExceptLast, Checkpoint::kNever}) {
      torch::nn::Sequential reference = make_tied_mlp();
      auto batches = testing::make_batches(8, 3);
      auto reference_sgd = testing::make_sgd(testing::unique_parameters(reference->parameters()));
      for (const auto& batch : batches) {
        reference_sgd.zero_grad();
        testing::mse(reference->forward(batch.input), batch.target).backward();
        reference_sgd.step();
      }
      Pipe pipe(make_tied_mlp(), PipeOptions()
                                     .balance(layout.balance)
                                     .chunks(4)
                                     .schedule(layout.schedule)
                                     .virtual_stages(layout.virtual_stages)
                                     .checkpoint(mode));
      auto sgd = testing::make_sgd(testing::unique_parameters(pipe->parameters()));
      for (const auto& batch : batches) {
        sgd.zero_grad();
        pipe->train_step(batch.input, batch.target, testing::mse);
        sgd.step();
      }
      EXPECT_EQ(testing::compare_parameters(*pipe, *reference), "")
          << layout.schedule << " checkpoint " << to_string(mode);
    }
  }
}

}  // namespace
}  // namespace pipetrain
