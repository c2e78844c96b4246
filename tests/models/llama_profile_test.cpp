// profile_llama (models/llama_profile.h): the tables profiled on fewer rows and the MLP on a
// narrower width, extended.
#include "pipetrain/models/llama_profile.h"

#include <utility>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/models/llama_config.h"

namespace pipetrain::models {
namespace {

LlamaConfig tied_config() {
  LlamaConfig c = llama_config(/*vocab_size=*/1000, /*hidden_size=*/32, /*intermediate_size=*/64,
                               /*layers=*/3, /*heads=*/4, /*kv_heads=*/2);
  c.tie_word_embeddings = true;
  c.pad_token_id = 999;  // above the rows profiled: taken modulo them as the ids are
  return c;
}

TEST(ProfileLlama, TablesOnFewerRowsAndMlpsOnNarrowerWidthsHaveTheBytesOfTheWholeModel) {
  for (const bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied table" : "separate head");
    LlamaConfig config = tied_config();
    config.tie_word_embeddings = tied;
    const torch::Tensor sample = torch::randint(config.vocab_size, {2, 8}, torch::kInt64);
    const partition::ProfileOptions options = partition::ProfileOptions()
                                                  .microbatch_sizes({2})
                                                  .warmup(0)
                                                  .repeats(1)
                                                  .min_trial_seconds(0)
                                                  .measure_transfer(false);
    const partition::ModelProfile whole = profile_llama(config, sample, options);
    const partition::ModelProfile cut = profile_llama(config, sample, options, 0, {}, 100);
    // The decoder layer's MLP too, profiled 16 and 32 wide (the config's is 64).
    const partition::ModelProfile both = profile_llama(config, sample, options, 0, {}, 100, 32);
    // The MLP alone, 16 and 32 wide.
    const partition::ModelProfile mlp = profile_llama(config, sample, options, 0, {}, 0, 32);
    ASSERT_EQ(whole.layers.size(), 6u);
    for (const auto& [what, profile] :
         {std::pair<const char*, const partition::ModelProfile*>{"the tables cut", &cut},
          {"the tables and the MLP cut", &both},
          {"the MLP cut", &mlp}}) {
      SCOPED_TRACE(what);
      ASSERT_EQ(profile->layers.size(), whole.layers.size());
      for (size_t e = 0; e < whole.layers.size(); ++e) {
        SCOPED_TRACE(whole.layers[e].name);
        const partition::LayerProfile& w = whole.layers[e];
        const partition::LayerProfile& c = profile->layers[e];
        EXPECT_EQ(c.name, w.name);
        EXPECT_EQ(c.parameter_bytes, w.parameter_bytes);
        EXPECT_EQ(c.cast_parameter_bytes, w.cast_parameter_bytes);
        EXPECT_EQ(c.parameter_sizes, w.parameter_sizes);
        EXPECT_EQ(c.shared_parameters, w.shared_parameters);
        ASSERT_EQ(c.costs.size(), w.costs.size());
        for (size_t s = 0; s < w.costs.size(); ++s) {
          EXPECT_EQ(c.costs[s].activation_bytes, w.costs[s].activation_bytes) << "size " << s;
          EXPECT_EQ(c.costs[s].split_activation_bytes, w.costs[s].split_activation_bytes);
          EXPECT_EQ(c.costs[s].split_first_activation_bytes,
                    w.costs[s].split_first_activation_bytes);
          EXPECT_EQ(c.costs[s].output_bytes, w.costs[s].output_bytes);
          EXPECT_GE(c.costs[s].forward_seconds, 0);
        }
      }
    }
    // The head's logits are the vocabulary's width: the figure that grows with it.
    EXPECT_EQ(cut.layers.back().costs[0].output_bytes, 2 * 8 * 1000 * 4);
  }
}

}  // namespace
}  // namespace pipetrain::models
