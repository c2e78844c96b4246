// parallel/ring_attention.h: causal attention by chunks, merged by log-sum-exp, equals
// scaled_dot_product_attention forward and backward.
#include "pipetrain/parallel/ring_attention.h"

#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/multiprocess.h"
#include "pipetrain/base/error.h"

namespace pipetrain::parallel {
namespace {

double worst(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max()).item<double>();
}

TEST(RingAttention, CausalAttentionByChunksEqualsSdpaForwardAndBackward) {
  torch::manual_seed(3);
  const torch::Tensor q = torch::randn({2, 3, 16, 8}, torch::requires_grad());
  const torch::Tensor k = torch::randn({2, 3, 16, 8}, torch::requires_grad());
  const torch::Tensor v = torch::randn({2, 3, 16, 8}, torch::requires_grad());
  const torch::Tensor g = torch::randn({2, 3, 16, 8});
  const torch::Tensor reference =
      torch::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
  const auto expected = torch::autograd::grad({reference}, {q, k, v}, {g});
  for (const int64_t chunks : {1, 2, 4, 8}) {
    SCOPED_TRACE(chunks);
    const torch::Tensor out = chunked_causal_attention(q, k, v, chunks);
    EXPECT_LE(worst(out, reference), 1e-5);
    const auto got = torch::autograd::grad({out}, {q, k, v}, {g});
    for (size_t t = 0; t < 3; ++t) EXPECT_LE(worst(got[t], expected[t]), 1e-5) << t;
  }
  EXPECT_THROW(chunked_causal_attention(q, k, v, 3), BadInput);
}

TEST(RingAttention, PartialsOverDisjointKeysMergeInAnyOrder) {
  // A query chunk over three key chunks, merged in two orders (a ring passes them in its own):
  // the same attention as over the three at once.
  torch::manual_seed(4);
  const torch::Tensor q = torch::randn({1, 2, 4, 8});
  const torch::Tensor k = torch::randn({1, 2, 12, 8});
  const torch::Tensor v = torch::randn({1, 2, 12, 8});
  const torch::Tensor whole = torch::scaled_dot_product_attention(q, k, v);
  const auto ks = k.chunk(3, 2);
  const auto vs = v.chunk(3, 2);
  for (const std::vector<int>& order : {std::vector<int>{0, 1, 2}, std::vector<int>{2, 0, 1}}) {
    PartialAttention merged;
    for (int c : order) {
      merge_partial(merged, attend_chunk(q, ks[static_cast<size_t>(c)], vs[static_cast<size_t>(c)],
                                         ChunkMask::kFull));
    }
    EXPECT_LE(worst(merged.out, whole), 1e-5);
  }
  EXPECT_EQ(causal_chunk_mask(2, 1), ChunkMask::kFull);
  EXPECT_EQ(causal_chunk_mask(2, 2), ChunkMask::kCausal);
  EXPECT_EQ(causal_chunk_mask(1, 2), ChunkMask::kSkip);
}

// Over 2 and 3 real processes (tests/helpers/tensor_parallel_ranks.cpp, "ring"): each rank's
// zigzag chunks of the output and of q's, k's and v's gradients equal the whole sequence's; and
// Ulysses' ("ulysses"), each rank holding a contiguous chunk.
TEST(RingAttention, OverTwoAndThreeProcessesEachRankHoldsItsChunksOfTheWhole) {
  for (const int ranks : {2, 3}) {
    for (const std::string method : {"ring", "ulysses"}) {
      const testing::RanksRun run = testing::run_ranks(ranks, {method});
      EXPECT_EQ(run.result.exit_code, 0) << ranks << " " << method << "\n" << run.output();
      EXPECT_EQ(run.count("OK " + method + " rank"), ranks) << run.output();
    }
  }
}

// The Llama model with context parallelism over 2 and 4 processes, ring and Ulysses
// ("llama_cp"): each rank's logits are the whole model's at its tokens, and the gradients summed
// over the ranks are the whole model's.
TEST(RingAttention, TheLlamaModelOverContextParallelRanksComputesTheWholeModel) {
  for (const int ranks : {2, 4}) {
    for (const std::string method : {"ring", "ulysses"}) {
      const testing::RanksRun run = testing::run_ranks(ranks, {"llama_cp", method});
      EXPECT_EQ(run.result.exit_code, 0) << ranks << " " << method << "\n" << run.output();
      EXPECT_EQ(run.count("OK llama_cp " + method), ranks) << run.output();
    }
  }
}

}  // namespace
}  // namespace pipetrain::parallel
