// parallel/ring_attention.h: causal attention by chunks, merged by log-sum-exp, equals
// scaled_dot_product_attention forward and backward.
#include "pipetrain/parallel/ring_attention.h"

#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/hf_models.h"
#include "../helpers/multiprocess.h"
#include "pipetrain/base/error.h"
#include "pipetrain/data/sequence_layout.h"
#include "pipetrain/models/document_attention.h"

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

// Packed documents: by chunks with the rows' segment ids equals attention per document (each
// document its own causal attention, padding output 0), forward and backward; a pair of chunks
// that shares no document, or holds only padding queries, is skipped, and one whose documents
// line up with the chunks' causal mask needs no bias.
TEST(RingAttention, ByDocumentChunksEqualAttentionPerDocumentAndSkipPairsSharingNone) {
  torch::manual_seed(4);
  // Row 0: documents of 4 and 6 tokens, 2 of padding; row 1: one of 8, 4 of padding.
  const data::SequenceLayout layout({{4, 6}, {8}}, 12);
  const torch::Tensor q = torch::randn({2, 2, 12, 8}, torch::requires_grad());
  const torch::Tensor k = torch::randn({2, 2, 12, 8}, torch::requires_grad());
  const torch::Tensor v = torch::randn({2, 2, 12, 8}, torch::requires_grad());
  const torch::Tensor g = torch::randn({2, 2, 12, 8});
  const torch::Tensor reference =
      models::document_causal_attention(q, k, v, layout, 1.0 / std::sqrt(8.0));
  const auto expected = torch::autograd::grad({reference}, {q, k, v}, {g});
  for (const int64_t chunks : {1, 2, 3, 4, 6}) {
    SCOPED_TRACE(chunks);
    const torch::Tensor out = chunked_causal_attention(q, k, v, chunks, layout.segment_ids());
    EXPECT_LE(worst(out, reference), 1e-5);
    const auto got = torch::autograd::grad({out}, {q, k, v}, {g});
    for (size_t t = 0; t < 3; ++t) EXPECT_LE(worst(got[t], expected[t]), 1e-5) << t;
  }
  // One row, documents of 4 and 3 tokens and 1 of padding, in chunks of 4: chunk 1 holds the
  // second document (and the padding), chunk 0 the first.
  const torch::Tensor segments = data::SequenceLayout({{4, 3}}, 8).segment_ids();
  EXPECT_EQ(pair_mask(segments, 1, 0, 4, torch::kFloat).chunks, ChunkMask::kSkip);
  EXPECT_EQ(pair_mask(segments, 0, 1, 4, torch::kFloat).chunks, ChunkMask::kSkip);  // causal
  const PairMask first = pair_mask(segments, 0, 0, 4, torch::kFloat);
  EXPECT_EQ(first.chunks, ChunkMask::kCausal);
  EXPECT_FALSE(first.bias.defined());
  const PairMask second = pair_mask(segments, 1, 1, 4, torch::kFloat);  // the padding query
  EXPECT_EQ(second.chunks, ChunkMask::kFull);
  ASSERT_TRUE(second.bias.defined());
  EXPECT_EQ(second.bias.sizes(), (std::vector<int64_t>{1, 1, 4, 4}));
  EXPECT_TRUE(second.bias[0][0][3].isneginf().all().item<bool>());
  EXPECT_EQ(second.bias[0][0][2][1].item<float>(), 0.0f);
  EXPECT_TRUE(second.bias[0][0][1][2].isneginf().item<bool>());
  EXPECT_EQ(pair_mask({}, 1, 0, 4, torch::kFloat).chunks, ChunkMask::kFull);
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
// zigzag chunks of the output and of q's, k's and v's gradients equal the whole sequence's, causal
// and by document, with the passes waited for at once and overlapped with the compute; and
// Ulysses' ("ulysses"), each rank holding a contiguous chunk.
TEST(RingAttention, OverTwoAndThreeProcessesEachRankHoldsItsChunksOfTheWhole) {
  for (const int ranks : {2, 3}) {
    for (const std::string method : {"ring", "ulysses"}) {
      const testing::RanksRun run = testing::run_ranks(ranks, {method});
      EXPECT_EQ(run.result.exit_code, 0) << ranks << " " << method << "\n" << run.output();
      EXPECT_EQ(run.count("OK " + method + " rank"), ranks) << run.output();
      if (method == "ring") {  // each pass waited for at once, then overlapped with the compute
        EXPECT_EQ(run.count("OK ring-serial rank"), ranks) << run.output();
      }
    }
  }
}

// The Llama model with context parallelism over 2 and 4 processes, ring and Ulysses
// ("llama_cp"): each rank's logits are the whole model's at its tokens, and the gradients summed
// over the ranks are the whole model's; where transformers is there, each rank's logits of its
// tokens of transformers' own llama and qwen2 checkpoints equal transformers' (rel 1e-5).
TEST(RingAttention, TheLlamaModelOverContextParallelRanksComputesTheWholeModel) {
  const bool hf = testing::python_has_transformers();
  for (const int ranks : {2, 4}) {
    for (const std::string method : {"ring", "ulysses"}) {
      std::vector<std::string> args = {"llama_cp", method};
      if (hf) args.push_back(testing::hf_fixtures());
      const testing::RanksRun run = testing::run_ranks(ranks, args);
      EXPECT_EQ(run.result.exit_code, 0) << ranks << " " << method << "\n" << run.output();
      EXPECT_EQ(run.count("OK llama_cp " + method), ranks) << run.output();
      if (hf) {
        EXPECT_EQ(run.count("OK hf llama rank"), ranks) << run.output();
        EXPECT_EQ(run.count("OK hf qwen2 rank"), ranks) << run.output();
      }
    }
  }
}

}  // namespace
}  // namespace pipetrain::parallel
