// parallel/tensor_parallel.h: slices, the size-1 forms (the plain operations) in this process, and
// the split forms across 2 and 3 real processes (tests/helpers/tensor_parallel_ranks.cpp), each
// against the whole layers.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "../helpers/multiprocess.h"
#include "pipetrain/base/error.h"
#include "pipetrain/parallel/tensor_parallel.h"

namespace pipetrain::parallel {
namespace {

TEST(TensorParallelSlice, CutsEvenlyAndNamesWhatItCannotDivide) {
  EXPECT_EQ(even_slice(12, 3, 2, "heads").start, 8);
  EXPECT_EQ(even_slice(12, 3, 2, "heads").length, 4);
  try {
    even_slice(10, 4, 0, "vocabulary");
    FAIL() << "4 parts of 10 were accepted";
  } catch (const BadInput& e) {
    EXPECT_NE(
        std::string(e.what()).find("tensor parallelism 4 does not divide the vocabulary (10)"),
        std::string::npos)
        << e.what();
  }
  EXPECT_THROW(even_slice(8, 2, 2, "heads"), BadInput);
}

TEST(TensorParallelOneRank, LayersAreThePlainOperations) {
  torch::manual_seed(3);
  const TensorParallel one;
  ColumnParallelLinear column(4, 6, true, one);
  RowParallelLinear row(6, 3, true, one);
  VocabParallelEmbedding embedding(10, 4, one, 2);
  for (auto* t : {&column->weight, &column->bias, &row->weight, &row->bias, &embedding->weight}) {
    torch::NoGradGuard no_grad;
    t->normal_();
  }
  const torch::Tensor ids = torch::tensor({{1, 2, 9}, {2, 0, 5}}, torch::kInt64);
  const torch::Tensor y = row(column(embedding(ids)));
  const torch::Tensor want = torch::nn::functional::linear(
      torch::nn::functional::linear(at::embedding(embedding->weight, ids, 2), column->weight,
                                    column->bias),
      row->weight, row->bias);
  EXPECT_TRUE(torch::allclose(y, want, 1e-6, 1e-6));
  y.sum().backward();
  EXPECT_EQ(embedding->weight.grad()[2].abs().sum().item<float>(), 0.0f);  // padding row
}

TEST(TensorParallelOneRank, CrossEntropyEqualsTorchsWithItsGradient) {
  torch::manual_seed(4);
  const torch::Tensor logits = (torch::randn({7, 11}) * 5).requires_grad_();
  const torch::Tensor targets = torch::randint(11, {7}, torch::kInt64);
  const torch::Tensor ours = vocab_parallel_cross_entropy(logits, targets, 0, TensorParallel{});
  const torch::Tensor theirs = torch::nn::functional::cross_entropy(
      logits, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  EXPECT_TRUE(torch::allclose(ours, theirs, 1e-5, 1e-6));
  const torch::Tensor weights = torch::rand({7});
  const torch::Tensor g_ours = torch::autograd::grad({(ours * weights).sum()}, {logits})[0];
  const torch::Tensor g_theirs = torch::autograd::grad({(theirs * weights).sum()}, {logits})[0];
  EXPECT_TRUE(torch::allclose(g_ours, g_theirs, 1e-5, 1e-6));
  // bf16 logits: computed in float32, the gradient returns in bf16.
  const torch::Tensor half = logits.detach().to(torch::kBFloat16).requires_grad_();
  const torch::Tensor loss = vocab_parallel_cross_entropy(half, targets, 0, TensorParallel{});
  EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
  EXPECT_EQ(torch::autograd::grad({loss.sum()}, {half})[0].scalar_type(), torch::kBFloat16);
  EXPECT_THROW(vocab_parallel_cross_entropy(logits, targets.unsqueeze(0), 0, TensorParallel{}),
               BadInput);
}

class TensorParallelRanks : public ::testing::TestWithParam<int> {};

TEST_P(TensorParallelRanks, SplitLayersComputeWhatTheWholeLayersCompute) {
  const int ranks = GetParam();
  const testing::RanksRun run = testing::run_ranks(ranks, {"layers"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  EXPECT_EQ(run.count("OK layers rank"), ranks) << run.output();
}

INSTANTIATE_TEST_SUITE_P(Group, TensorParallelRanks, ::testing::Values(2, 3));

}  // namespace
}  // namespace pipetrain::parallel
