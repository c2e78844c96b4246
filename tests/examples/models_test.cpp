// Shapes, residuals, causal masking and weight tying of the example models.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/examples/cnn.h"
#include "pipetrain/examples/gpt.h"
#include "pipetrain/examples/mlp.h"
#include "pipetrain/examples/model_registry.h"
#include "pipetrain/stage/skip.h"

namespace pipetrain::examples {
namespace {

TEST(Mlp, MapsImagesToClassScoresWithTheExpectedParameterCount) {
  torch::nn::Sequential mlp = make_mlp();
  EXPECT_EQ(mlp->forward(torch::randn({5, 1, 28, 28})).sizes(), torch::IntArrayRef({5, 10}));
  // (784*512 + 512) + (512*256 + 256) + (256*10 + 10)
  EXPECT_EQ(count_parameters(*mlp), 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10);
  EXPECT_EQ(mlp->size(), 6u);  // Flatten, Linear, ReLU, Linear, ReLU, Linear
}

TEST(Cnn, MapsImagesToClassScoresAndLeavesNoSkipBehind) {
  SkipContext context;
  SkipContextGuard guard(&context);
  torch::nn::Sequential cnn = make_cnn();
  EXPECT_EQ(cnn->forward(torch::randn({3, 1, 28, 28})).sizes(), torch::IntArrayRef({3, 10}));
  EXPECT_TRUE(context.pending.empty());
  EXPECT_EQ(cnn->size(), 4u + 8u + 3u + 8u + 2u);
  // conv 1->32, bn; block 32 (2 convs, 2 bns); conv 32->64, bn; block 64; linear 64*7*7 -> 10
  int64_t expected = 9 * 32 + 64 + 2 * (9 * 32 * 32 + 64) + 9 * 32 * 64 + 128 +
                     2 * (9 * 64 * 64 + 128) + 64 * 49 * 10 + 10;
  EXPECT_EQ(count_parameters(*cnn), expected);
}

TEST(Cnn, MoreBlocksAddNamedResidualsAndStillRun) {
  torch::nn::Sequential cnn = make_cnn(CnnOptions().width(8).blocks(2));
  EXPECT_EQ(cnn->forward(torch::randn({2, 1, 28, 28})).sizes(), torch::IntArrayRef({2, 10}));
}

GptOptions small_gpt() {
  return GptOptions(11).context(8).embed_dim(16).heads(2).layers(2);
}

TEST(Gpt, MapsTokensToLogitsPerPosition) {
  Gpt gpt = make_gpt(small_gpt());
  torch::Tensor tokens = torch::randint(11, {3, 8}, torch::kInt64);
  EXPECT_EQ(gpt.model->forward(tokens).sizes(), torch::IntArrayRef({3, 8, 11}));
  EXPECT_EQ(gpt.model->size(), 1u + 2u + 1u + 1u);  // embedding, 2 blocks, ln_f, head
}

TEST(Gpt, OutputAtPositionTDoesNotDependOnLaterTokens) {
  torch::manual_seed(3);
  Gpt gpt = make_gpt(small_gpt());
  torch::Tensor tokens = torch::randint(11, {2, 8}, torch::kInt64);
  torch::Tensor changed = tokens.clone();
  using torch::indexing::Slice;
  changed.index_put_({Slice(), Slice(5, 8)}, (tokens.index({Slice(), Slice(5, 8)}) + 1) % 11);
  torch::Tensor a = gpt.model->forward(tokens);
  torch::Tensor b = gpt.model->forward(changed);
  EXPECT_TRUE(torch::allclose(a.index({Slice(), Slice(0, 5)}), b.index({Slice(), Slice(0, 5)}),
                              1e-6, 1e-6));
  // ... while the changed positions themselves do change: the mask is not hiding everything.
  EXPECT_FALSE(torch::allclose(a.index({Slice(), 7}), b.index({Slice(), 7})));
}

TEST(Gpt, TiedHeadWeightIsTheEmbeddingTensorItself) {
  Gpt gpt = make_gpt(small_gpt());
  ASSERT_EQ(gpt.tied_parameters.size(), 1u);
  auto named = gpt.model->named_parameters();
  const auto& [embedding_name, head_name] = gpt.tied_parameters[0];
  ASSERT_TRUE(named.contains(embedding_name)) << embedding_name;
  ASSERT_TRUE(named.contains(head_name)) << head_name;
  EXPECT_EQ(named[embedding_name].unsafeGetTensorImpl(), named[head_name].unsafeGetTensorImpl());
  // The tie counts once: the untied model has exactly one more [V, C] matrix.
  Gpt untied = make_gpt(small_gpt().tie_embeddings(false));
  EXPECT_TRUE(untied.tied_parameters.empty());
  EXPECT_EQ(count_parameters(*untied.model) - count_parameters(*gpt.model), 11 * 16);
}

TEST(Gpt, TiedWeightAccumulatesTheGradientsOfBothUses) {
  torch::manual_seed(5);
  Gpt tied = make_gpt(small_gpt());
  Gpt untied = make_gpt(small_gpt().tie_embeddings(false));
  {
    torch::NoGradGuard no_grad;
    auto from = tied.model->named_parameters();
    for (auto& item : untied.model->named_parameters()) item.value().copy_(from[item.key()]);
  }
  torch::Tensor tokens = torch::randint(11, {2, 8}, torch::kInt64);
  torch::Tensor targets = torch::randint(11, {2, 8}, torch::kInt64);
  gpt_loss(tied.model->forward(tokens), targets).backward();
  gpt_loss(untied.model->forward(tokens), targets).backward();
  auto t = tied.model->named_parameters();
  auto u = untied.model->named_parameters();
  const auto& [embedding_name, head_name] = tied.tied_parameters[0];
  torch::Tensor sum = u[embedding_name].grad() + u[head_name].grad();
  EXPECT_TRUE(torch::allclose(t[embedding_name].grad(), sum, 1e-5, 1e-6));
}

TEST(Gpt, ParameterCountFollowsTheTransformerFormula) {
  // Per block: qkv 3C^2+3C, projection C^2+C, MLP 8C^2+5C, two layer norms 4C: 12C^2 + 13C.
  // Plus token table V*C (once: tied), positions T*C, final layer norm 2C.
  const int64_t v = 76, t = 64, c = 128, l = 4;
  ExampleModel gpt = make_model("gpt", {{"vocab_size", v}});
  EXPECT_EQ(count_parameters(*gpt.sequential), l * (12 * c * c + 13 * c) + v * c + t * c + 2 * c);
}

TEST(Gpt, SequenceLongerThanTheContextIsAnError) {
  Gpt gpt = make_gpt(small_gpt());
  EXPECT_THROW(gpt.model->forward(torch::zeros({1, 9}, torch::kInt64)), c10::Error);
}

TEST(ModelRegistry, BuildsEveryNamedModel) {
  for (const std::string& name : model_names()) {
    ExampleModel model = make_model(name);
    EXPECT_EQ(model.name, name);
    EXPECT_GT(model.sequential->size(), 0u);
    EXPECT_TRUE(model.loss) << name;
  }
  EXPECT_EQ(make_model("gpt").options["vocab_size"], 256);
  EXPECT_EQ(make_model("gpt", {{"vocab_size", 80}}).options["vocab_size"], 80);
}

TEST(ModelRegistry, UnknownNameListsTheValidNames) {
  try {
    make_model("resnet152");
    FAIL() << "no error";
  } catch (const ModelOptionError& e) {
    EXPECT_NE(std::string(e.what()).find("'resnet152'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("mlp, cnn, gpt"), std::string::npos) << e.what();
  }
}

TEST(ModelRegistry, UnknownOptionListsTheModelsOptions) {
  try {
    make_model("cnn", {{"depth", 3}});
    FAIL() << "no error";
  } catch (const ModelOptionError& e) {
    EXPECT_NE(std::string(e.what()).find("'depth'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("width"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_model("cnn", {{"width", "wide"}}), ModelOptionError);
  EXPECT_THROW(make_model("cnn", {{"width", 2.5}}), ModelOptionError);
}

TEST(ModelRegistry, ClassLossIsCrossEntropy) {
  ExampleModel model = make_model("mlp", {{"widths", {4, 3}}});
  torch::Tensor logits = torch::zeros({2, 3});
  EXPECT_NEAR(model.loss(logits, torch::tensor({0, 2})).item<double>(), std::log(3.0), 1e-6);
}

}  // namespace
}  // namespace pipetrain::examples
