// tune/memory_check.h and train/memory_fit.h: the evaluation between steps is part of the memory a
// run needs (`make demo` peaked at 682 MiB against a prediction of 400 MiB before it was: the
// test split's forward of 1000 images ran on the main process, outside the model of a step).
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/partition/memory.h"
#include "pipetrain/train/memory_fit.h"
#include "pipetrain/tune/memory_check.h"

namespace pipetrain::memory_check_test {
namespace {

TEST(EvaluationForwardBytes, CountsTheLargestInputAndOutputOfOneLayerAtOnce) {
  // 500 rows: the counted copy of the batch (500 x 100 floats), then 500 x 1000 after the first
  // Linear and again after the ReLU, whose input is alive until it returns: 2 x 2,000,000 bytes.
  torch::nn::Sequential model(torch::nn::Linear(100, 1000), torch::nn::ReLU(),
                              torch::nn::Linear(1000, 10));
  const torch::Tensor inputs = torch::randn({500, 100});
  const int64_t bytes = tune::evaluation_forward_bytes(model, inputs);
  EXPECT_GE(bytes, 2 * 500 * 1000 * 4);
  EXPECT_LT(bytes, 2 * 500 * 1000 * 4 + 500 * 100 * 4 + 4096);
  EXPECT_TRUE(model->is_training());  // put back as it was
  // Twice the rows, twice the bytes: what a 1000-image evaluation batch costs.
  EXPECT_GE(tune::evaluation_forward_bytes(model, torch::randn({1000, 100})), 2 * bytes - 4096);
}

TEST(EvaluationExtraBytes, IsWhatTheEvaluationNeedsAboveTheStepsPeak) {
  partition::RankMemory rank0, rank1;
  rank0.parameters = 100;
  rank0.gradients = 100;
  rank0.optimizer_state = 200;
  rank0.activations = 1000;
  rank1 = rank0;
  // One process running both ranks: the step needs 2 x 1400; evaluating, the ranks keep 2 x 400
  // and the forward holds 5000: 2200 more.
  EXPECT_EQ(train::evaluation_extra_bytes({rank0, rank1}, {0, 1}, 200, 5000), 5800 - 2800);
  // A small evaluation fits in the step's peak: nothing more.
  EXPECT_EQ(train::evaluation_extra_bytes({rank0, rank1}, {0, 1}, 200, 500), 0);
  // On a process of its own, rank 0 gathers the whole model (a copy of 8000 bytes) first.
  EXPECT_EQ(train::evaluation_extra_bytes({rank0, rank1}, {0}, 8000, 500), 400 + 8000 - 1400);
}

TEST(MemoryFit, AProcessesExtraIsPartOfItsNeedAndOfTheMessage) {
  partition::RankMemory rank;
  rank.parameters = 1 << 20;
  auto predict = [&](const std::string&) { return std::vector<partition::RankMemory>{rank, rank}; };
  const train::ProcessExtra extra = [](const std::vector<partition::RankMemory>&, int p) {
    return p == 0 ? std::int64_t{64} << 20 : std::int64_t{0};
  };
  const train::AvailableMemory small{32 << 20, "test"};
  const train::MemoryFit fit = train::check_memory_fit(predict, {}, {{0}, {1}}, 0, small, 0, extra);
  EXPECT_EQ(fit.run.needed, (2 << 20) + (64 << 20));
  EXPECT_FALSE(fit.fits());
  EXPECT_EQ(train::process_needs(fit, {{0}, {1}}),
            (std::vector<std::int64_t>{(1 << 20) + (64 << 20), 1 << 20}));
  EXPECT_NE(train::memory_fit_text(fit).find("64.0 MiB more on process 0 while it evaluates"),
            std::string::npos)
      << train::memory_fit_text(fit);
}

// What a rank offloads to host memory is the machine's memory: on CUDA stages it counts for the
// machine only (the device budget is the rest); on CPU stages it is the rank's own memory still,
// so a --memory-limit sees it too (ZeRO-Offload on the CPU moves nothing out of the host).
TEST(MemoryFit, OffloadedBytesCountForTheMachineAndOnCpuStagesForTheRank) {
  partition::RankMemory rank;
  rank.parameters = 1 << 20;
  rank.offloaded = 3 << 20;
  auto predict = [&](const std::string&) { return std::vector<partition::RankMemory>{rank, rank}; };
  const train::AvailableMemory plenty{std::int64_t{1} << 40, "test"};
  const train::MemoryFit cuda =
      train::check_memory_fit(predict, {}, {{0}, {1}}, 0, plenty, 0, {}, /*cpu_stages=*/false);
  EXPECT_EQ(cuda.run.needed, 2 * (4 << 20));
  EXPECT_EQ(cuda.run.rank_peaks, (std::vector<std::int64_t>{1 << 20, 1 << 20}));
  EXPECT_EQ(train::process_needs(cuda, {{0}, {1}}), (std::vector<std::int64_t>{4 << 20, 4 << 20}));
  const train::MemoryFit cpu =
      train::check_memory_fit(predict, {}, {{0, 1}}, 0, plenty, 0, {}, /*cpu_stages=*/true);
  EXPECT_EQ(cpu.run.needed, 2 * (4 << 20));
  EXPECT_EQ(cpu.run.rank_peaks, (std::vector<std::int64_t>{4 << 20, 4 << 20}));
  EXPECT_EQ(train::process_needs(cpu, {{0, 1}}), (std::vector<std::int64_t>{8 << 20}));
  // A budget per rank between the two readings: the CUDA one passes, the CPU one does not.
  const train::MemoryFit budget =
      train::check_memory_fit(predict, {}, {{0}, {1}}, 0, plenty, 2 << 20, {}, true);
  EXPECT_FALSE(budget.fits());
  EXPECT_TRUE(
      train::check_memory_fit(predict, {}, {{0}, {1}}, 0, plenty, 2 << 20, {}, false).fits());
}

}  // namespace
}  // namespace pipetrain::memory_check_test
