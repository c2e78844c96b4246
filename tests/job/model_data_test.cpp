// job/model_data.h: the checks and loaders the CLI calls. check_batch_size refuses a
// mini-batch larger than the training set, naming the largest that fits; load_planning_model
// loads an example model, a Hugging Face directory's config or refuses, naming --model or
// --sample-shape.
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/bad_input.h"
#include "../helpers/hf_models.h"
#include "pipetrain/base/error.h"
#include "pipetrain/job/model_data.h"

namespace pipetrain::job {
namespace {

using pipetrain::testing::message_of_bad_input;

TEST(CheckBatchSize, RefusesMoreRowsThanTheTrainingSetAndNamesTheLargestThatFits) {
  BuiltData data;
  data.name = "tensors";
  data.train_inputs = torch::zeros({10, 3});
  EXPECT_NO_THROW(check_batch_size(data, 10));
  const std::string message = message_of_bad_input([&] { check_batch_size(data, 11); });
  EXPECT_NE(message.find("--batch-size 11 is larger than the training set (10 rows of --inputs)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("use --batch-size 10 or less"), std::string::npos) << message;

  data.name = "fashion-mnist";
  EXPECT_NE(message_of_bad_input([&] { check_batch_size(data, 11); }).find("--data fashion-mnist"),
            std::string::npos);
  BuiltData text;  // windows are sampled: no limit
  text.name = "text";
  EXPECT_NO_THROW(check_batch_size(text, 1 << 20));
}

// Entries built with their values on demand (ZeRO-3 takes them a layer at a time): once
// fill_values has written them they are the values of the build that wrote them at once, drawn
// (Qwen2, whose head is tied to the embedding's table) or read from the checkpoint (Llama); a
// second call for the entry writes nothing.
TEST(BuildModel, ValuesOnDemandAreTheValuesOfTheBuildThatWritesThemAtOnce) {
  for (const std::string& init : {std::string("random"), std::string("checkpoint")}) {
    ModelDataSpec spec;
    spec.model = pipetrain::testing::hf_fixtures() + (init == "random" ? "/qwen2" : "/llama");
    spec.init = init;
    spec.seed = 7;
    const BuiltData data;
    const int64_t entries = hf_config(spec).entries();
    // The last stage of two: the tied table comes with its head.
    std::vector<int64_t> mine;
    for (int64_t e = entries / 2; e < entries; ++e) mine.push_back(e);
    const BuiltModel eager = build_model(spec, data, mine);
    const std::vector<int64_t> waiting = {entries / 2, entries - 1};
    const BuiltModel lazy = build_model(spec, data, mine, {}, waiting);
    ASSERT_TRUE(lazy.fill_values) << init;
    EXPECT_FALSE(eager.fill_values) << init;
    const auto eager_named = eager.sequential->named_parameters();
    const auto lazy_named = lazy.sequential->named_parameters();
    ASSERT_EQ(eager_named.size(), lazy_named.size());
    for (size_t i = 0; i < lazy_named.size(); ++i) {
      const torch::Tensor p = lazy_named[i].value();
      if (p.is_meta()) continue;
      lazy.fill_values(p);
      EXPECT_TRUE(torch::equal(p, eager_named[i].value())) << init << " " << lazy_named[i].key();
    }
    // Written once: a second call leaves what the shard's owner did to them.
    const torch::Tensor first = lazy_named[lazy_named.size() - 1].value();
    torch::NoGradGuard no_grad;
    first.fill_(3.0);
    lazy.fill_values(first);
    EXPECT_TRUE(torch::equal(first, torch::full_like(first, 3.0))) << init;
  }
}

TEST(LoadPlanningModel, AnExampleModelWithARandomSampleOfTheShape) {
  const PlanningModel mlp = load_planning_model("mlp", {4, 784});
  ASSERT_GT(mlp.sequential->size(), 0u);
  EXPECT_EQ(mlp.layers(), static_cast<int64_t>(mlp.sequential->size()));
  EXPECT_EQ(mlp.sample.sizes(), (std::vector<int64_t>{4, 784}));
  EXPECT_EQ(mlp.sample.scalar_type(), torch::kFloat32);
  EXPECT_EQ(mlp.description, "mlp");
  EXPECT_FALSE(mlp.llama.has_value());
  // Seeded: the same sample again.
  EXPECT_TRUE(torch::equal(load_planning_model("mlp", {4, 784}).sample, mlp.sample));
}

TEST(LoadPlanningModel, BadNamesAndDirectoriesNameTheFlag) {
  EXPECT_NE(message_of_bad_input([] {
              load_planning_model("no-such-model", {4, 784});
            }).find("no-such-model"),
            std::string::npos);
  const std::string empty = ::testing::TempDir() + "/planning_model_empty_dir";
  std::filesystem::create_directories(empty);  // a directory: taken for a Hugging Face model
  EXPECT_NE(message_of_bad_input([&] {
              load_planning_model(empty, {2, 8});
            }).find("--model " + empty + ":"),
            std::string::npos);
}

TEST(LoadPlanningModel, AHuggingFaceDirectoryIsReadAsAConfigWithTokenIds) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string dir = pipetrain::testing::hf_fixtures() + "/llama";
  const PlanningModel llama = load_planning_model(dir, {2, 8});
  ASSERT_TRUE(llama.llama.has_value());
  EXPECT_EQ(llama.sequential->size(), 0u);  // profiled unbuilt
  EXPECT_EQ(llama.layers(), llama.llama->entries());
  EXPECT_EQ(llama.sample.scalar_type(), torch::kInt64);
  EXPECT_EQ(llama.sample.sizes(), (std::vector<int64_t>{2, 8}));
  EXPECT_LT(llama.sample.max().item<int64_t>(), llama.llama->vocab_size);
  EXPECT_GE(llama.sample.min().item<int64_t>(), 0);
  EXPECT_NE(message_of_bad_input([&] {
              load_planning_model(dir, {2, 8, 4});
            }).find("B,T"),
            std::string::npos);
}

}  // namespace
}  // namespace pipetrain::job
