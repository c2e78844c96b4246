// parallel/tensor_parallel.h: slices, the size-1 forms (the plain operations) in this process, and
// the split forms across 2 and 3 real processes (tests/helpers/tensor_parallel_ranks.cpp), each
// against the whole layers.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "../helpers/multiprocess.h"
#include "pipetrain/base/error.h"
#include "pipetrain/models/llama.h"
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

// models/llama.h's tensor-parallel form, 2 and 4 ranks: init, load, logits, loss and gradients
// are the whole model's slices (untied without biases; tied with every bias and a padding id). At
// 4 ranks the 2 key/value heads are each replicated on 2 ranks, whose gradients of them must be
// the whole model's (summed over the pair).
TEST(TensorParallelLlama, TwoAndFourRanksHoldSlicesOfTheWholeModelAndItsGradients) {
  for (int ranks : {2, 4}) {
    for (const std::string variant : {"plain", "tied"}) {
      const testing::RanksRun run = testing::run_ranks(ranks, {"llama", variant});
      EXPECT_EQ(run.result.exit_code, 0) << ranks << " " << variant << "\n" << run.output();
      EXPECT_EQ(run.count("OK llama " + variant), ranks) << run.output();
    }
  }
}

}  // namespace
}  // namespace pipetrain::parallel

namespace pipetrain::models {
namespace {

TEST(TensorParallelLlamaConfig, SizesTpDoesNotDivideAreRefusedNamingTheKeyAndWhatWorks) {
  const LlamaConfig c = llama_config(24, 16, 24, 2, 4, 2);
  EXPECT_NO_THROW(check_llama_tensor_parallel(c, 2));
  auto message = [&](int tp) {
    try {
      check_llama_tensor_parallel(c, tp);
    } catch (const BadInput& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(3).find("--tp 3 does not divide num_attention_heads (4) of config.json; "
                            "tensor-parallel sizes that divide heads, vocabulary and MLP width "
                            "and divide or are a multiple of the key/value heads: 1, 2, 4"),
            std::string::npos)
      << message(3);
  EXPECT_EQ(message(4), "accepted");  // 2 key/value heads, each on 2 of the 4 ranks
  // 12 heads, 4 key/value heads: 6 neither divides 4 nor is a multiple of it.
  const LlamaConfig twelve = llama_config(24, 24, 24, 2, 12, 4);
  try {
    check_llama_tensor_parallel(twelve, 6);
    ADD_FAILURE() << "tp 6 over 4 key/value heads accepted";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("--tp 6 does not divide num_key_value_heads (4) of "
                                         "config.json and is not a multiple of it"),
              std::string::npos)
        << e.what();
  }
}

TEST(TensorParallelLlamaConfig, ColumnParallelTensorsAreCutByRowsAndRowParallelByColumns) {
  const LlamaConfig c = llama_config(24, 16, 24, 2, 4, 2);
  using parallel::TensorSplit;
  const TensorSplit rows{0, 1}, columns{1, 1};
  EXPECT_EQ(tensor_parallel_split("0.weight", c, 2), rows);
  EXPECT_EQ(tensor_parallel_split("4.weight", c, 2), rows);          // the head
  EXPECT_EQ(tensor_parallel_split("3.weight", c, 2), std::nullopt);  // the final norm
  EXPECT_EQ(tensor_parallel_split("1.self_attn.k_proj.bias", c, 2), rows);
  EXPECT_EQ(tensor_parallel_split("2.mlp.up_proj.weight", c, 2), rows);
  EXPECT_EQ(tensor_parallel_split("1.self_attn.o_proj.weight", c, 2), columns);
  EXPECT_EQ(tensor_parallel_split("2.mlp.down_proj.weight", c, 2), columns);
  EXPECT_EQ(tensor_parallel_split("2.mlp.down_proj.bias", c, 2), std::nullopt);
  EXPECT_EQ(tensor_parallel_split("1.input_layernorm.weight", c, 2), std::nullopt);
  // 2 key/value heads over 4 ranks: each shared by 2; the query heads are not.
  EXPECT_EQ(tensor_parallel_split("1.self_attn.k_proj.weight", c, 4), (TensorSplit{0, 2}));
  EXPECT_EQ(tensor_parallel_split("1.self_attn.v_proj.bias", c, 4), (TensorSplit{0, 2}));
  EXPECT_EQ(tensor_parallel_split("1.self_attn.q_proj.weight", c, 4), rows);
}

}  // namespace
}  // namespace pipetrain::models
