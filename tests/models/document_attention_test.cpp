// Tests for attention by document (include/pipetrain/models/document_attention.h) in the Llama
// model: a packed row computes what each of its documents computes alone, padding changes nothing,
// and the counted-target loss.
#include "pipetrain/models/document_attention.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/data/sequence_layout.h"
#include "pipetrain/models/llama.h"

namespace pipetrain::models::document_attention_test {
namespace {

LlamaModel tiny_model() {
  LlamaConfig config = llama_config(40, 16, 24, /*layers=*/2, /*heads=*/4, /*kv_heads=*/2);
  LlamaModel model = make_llama(config);
  init_llama_random(model, 3);
  return model;
}

torch::Tensor logits_of(LlamaModel& model, const torch::Tensor& tokens,
                        const data::SequenceLayout* layout) {
  const data::LayoutScope scope(layout);
  return model.sequential->forward(tokens);
}

double max_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

TEST(DocumentAttention, APackedRowComputesWhatEachDocumentComputesAlone) {
  LlamaModel model = tiny_model();
  torch::manual_seed(0);
  const torch::Tensor a = torch::randint(40, {1, 3}), b = torch::randint(40, {1, 5});
  const torch::Tensor c = torch::randint(40, {1, 4}), d = torch::randint(40, {1, 2});
  // Row 0: a b, row 1: c d then 2 padding.
  const torch::Tensor pad = torch::zeros({1, 2}, torch::kInt64);
  const torch::Tensor rows = torch::cat({torch::cat({a, b}, 1), torch::cat({c, d, pad}, 1)}, 0);
  const data::SequenceLayout layout({{3, 5}, {4, 2}}, 8);
  const torch::Tensor packed = logits_of(model, rows, &layout);
  const torch::Tensor alone_a = logits_of(model, a, nullptr);
  const torch::Tensor alone_b = logits_of(model, b, nullptr);
  const torch::Tensor alone_c = logits_of(model, c, nullptr);
  const torch::Tensor alone_d = logits_of(model, d, nullptr);
  EXPECT_LT(max_difference(packed.narrow(1, 0, 3).narrow(0, 0, 1), alone_a), 1e-5);
  EXPECT_LT(max_difference(packed.narrow(1, 3, 5).narrow(0, 0, 1), alone_b), 1e-5);
  EXPECT_LT(max_difference(packed.narrow(1, 0, 4).narrow(0, 1, 1), alone_c), 1e-5);
  EXPECT_LT(max_difference(packed.narrow(1, 4, 2).narrow(0, 1, 1), alone_d), 1e-5);
  // Without the layout the row's later documents see the earlier ones: different logits.
  const torch::Tensor whole = logits_of(model, rows, nullptr);
  EXPECT_GT(max_difference(whole.narrow(1, 3, 5).narrow(0, 0, 1), alone_b), 1e-3);
  // Across documents (by_document false) is the plain whole-row attention.
  const data::SequenceLayout across({{3, 5}, {4, 2}}, 8, /*by_document=*/false);
  EXPECT_TRUE(torch::equal(logits_of(model, rows, &across), whole));
}

TEST(DocumentAttention, OneDocumentPerRowWithPaddingComputesWhatTheDocumentsComputeAlone) {
  LlamaModel model = tiny_model();
  torch::manual_seed(1);
  const torch::Tensor a = torch::randint(40, {1, 6}), b = torch::randint(40, {1, 3});
  const torch::Tensor rows =
      torch::cat({a, torch::cat({b, torch::full({1, 3}, 7, torch::kInt64)}, 1)}, 0);
  const data::SequenceLayout layout({{6}, {3}}, 6);
  ASSERT_TRUE(layout.one_segment_per_row());
  const torch::Tensor packed = logits_of(model, rows, &layout);
  EXPECT_LT(max_difference(packed.narrow(0, 0, 1), logits_of(model, a, nullptr)), 1e-5);
  EXPECT_LT(max_difference(packed.narrow(0, 1, 1).narrow(1, 0, 3), logits_of(model, b, nullptr)),
            1e-5);
}

TEST(DocumentAttention, GradientsOfAPackedRowAreTheSumOfItsDocuments) {
  LlamaModel model = tiny_model();
  torch::manual_seed(2);
  const torch::Tensor a = torch::randint(40, {1, 4}), b = torch::randint(40, {1, 4});
  const torch::Tensor ta = torch::randint(40, {1, 4}), tb = torch::randint(40, {1, 4});
  const data::SequenceLayout layout({{4, 4}}, 8);
  // Packed: one row, the loss the mean over its 8 targets.
  causal_lm_loss(logits_of(model, torch::cat({a, b}, 1), &layout), torch::cat({ta, tb}, 1))
      .backward();
  std::vector<torch::Tensor> packed;
  for (const torch::Tensor& p : model.sequential->parameters()) {
    packed.push_back(p.grad().clone());
    p.mutable_grad().zero_();
  }
  // Alone: each document's sum of cross-entropy over the 8 targets.
  (causal_lm_loss(logits_of(model, a, nullptr), ta) * 0.5 +
   causal_lm_loss(logits_of(model, b, nullptr), tb) * 0.5)
      .backward();
  const auto params = model.sequential->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_LT(max_difference(params[i].grad(), packed[i]),
              1e-6 + 1e-4 * packed[i].abs().max().item<double>())
        << "parameter " << i;
  }
}

TEST(CausalLmLoss, IsTheMeanOverCountedTargetsAndZeroWhenNoneCounts) {
  torch::manual_seed(3);
  const torch::Tensor logits = torch::randn({2, 3, 5});
  const torch::Tensor targets = torch::tensor({1, -100, 2, -100, -100, 4}).view({2, 3});
  const torch::Tensor log_p = torch::log_softmax(logits, -1);
  const double expected = -(log_p[0][0][1] + log_p[0][2][2] + log_p[1][2][4]).item<double>() / 3.0;
  EXPECT_NEAR(causal_lm_loss(logits, targets).item<double>(), expected, 1e-6);
  EXPECT_EQ(counted_targets(targets).item<int64_t>(), 3);
  const torch::Tensor none = torch::full({2, 3}, -100, torch::kInt64);
  torch::Tensor leaf = logits.clone().requires_grad_();
  const torch::Tensor zero = causal_lm_loss(leaf, none);
  EXPECT_EQ(zero.item<double>(), 0.0);
  zero.backward();
  EXPECT_TRUE(torch::equal(leaf.grad(), torch::zeros_like(leaf)));
}

}  // namespace
}  // namespace pipetrain::models::document_attention_test
