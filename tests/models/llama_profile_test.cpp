// profile_llama (models/llama_profile.h): the tables profiled on fewer rows and the MLP on a
// narrower width, extended.
#include "pipetrain/models/llama_profile.h"

#include <string>
#include <utility>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "pipetrain/base/error.h"
#include "pipetrain/models/llama_config.h"
#include "pipetrain/parallel/expert_parallel.h"

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

// A Qwen3-MoE config whose second layer is a mixture (decoder_sparse_step 2): 4 experts of width
// 16, 2 a token, hidden 32.
LlamaConfig mixture_config() {
  return parse_llama_config(nlohmann::json{{"architectures", {"Qwen3MoeForCausalLM"}},
                                           {"model_type", "qwen3_moe"},
                                           {"vocab_size", 64},
                                           {"hidden_size", 32},
                                           {"intermediate_size", 64},
                                           {"moe_intermediate_size", 16},
                                           {"num_hidden_layers", 2},
                                           {"num_attention_heads", 4},
                                           {"num_key_value_heads", 2},
                                           {"head_dim", 8},
                                           {"max_position_embeddings", 64},
                                           {"rms_norm_eps", 1e-6},
                                           {"num_experts", 4},
                                           {"num_experts_per_tok", 2},
                                           {"norm_topk_prob", true},
                                           {"decoder_sparse_step", 2},
                                           {"mlp_only_layers", nlohmann::json::array()},
                                           {"tie_word_embeddings", false}});
}

TEST(ProfileLlama, RoutingImbalanceAddsTheBusiestRanksExtraRowsToEachMixtureLayer) {
  const LlamaConfig config = mixture_config();
  ASSERT_FALSE(config.is_moe_layer(0));
  ASSERT_TRUE(config.is_moe_layer(1));
  // One routed row keeps its input and the SwiGLU's four intermediates of the expert's width:
  // (32 + 4 x 16) x 4 bytes in float32. In bf16 the gate and the up projection each keep their
  // own bf16 cast of the input (autocast's cast cache is off): (2 x 32 + 4 x 16) x 2.
  EXPECT_EQ(expert_row_bytes(config, Precision::kFloat32), (32 + 4 * 16) * 4);
  EXPECT_EQ(expert_row_bytes(config, Precision::kBFloat16), (2 * 32 + 4 * 16) * 2);
  // ep 2, 4 experts, 2 a token: a rank holds 2, and every token may send it both choices.
  EXPECT_EQ(parallel::routing_imbalance_bound(4, 2, 2), 2.0);
  EXPECT_EQ(parallel::routing_imbalance_bound(4, 2, 4), 2.0);  // one expert a rank
  EXPECT_EQ(parallel::routing_imbalance_bound(8, 1, 4), 4.0);  // top-1: all to one rank
  const torch::Tensor sample = torch::randint(config.vocab_size, {4, 8}, torch::kInt64);
  const partition::ProfileOptions options = partition::ProfileOptions()
                                                .microbatch_sizes({2, 4})
                                                .warmup(0)
                                                .repeats(1)
                                                .min_trial_seconds(0)
                                                .measure_transfer(false);
  const partition::ModelProfile balanced = profile_llama(config, sample, options);
  partition::ModelProfile skewed = balanced;
  apply_routing_imbalance(skewed, config, 8, 2, 1.5, Precision::kFloat32);
  ASSERT_EQ(skewed.layers.size(), 5u);  // embedding, 2 decoder layers, norm, head
  for (size_t e = 0; e < skewed.layers.size(); ++e) {
    for (size_t p = 0; p < 2; ++p) {
      const int64_t tokens = balanced.microbatch_sizes[p] * 8;
      // The MoE layer (entry 2): half again the balanced T x k rows, on the expert's rank.
      const int64_t more = e == 2 ? tokens * 2 * (32 + 4 * 16) * 4 / 2 : 0;
      const partition::LayerCost& b = balanced.layers[e].costs[p];
      const partition::LayerCost& s = skewed.layers[e].costs[p];
      EXPECT_EQ(s.activation_bytes - b.activation_bytes, more) << e << " " << p;
      EXPECT_EQ(s.split_activation_bytes - b.split_activation_bytes, more);
      EXPECT_EQ(s.split_first_activation_bytes - b.split_first_activation_bytes, more);
      EXPECT_EQ(s.output_bytes, b.output_bytes);
    }
  }
  // Outside what routing can reach, at ep 1 and below balance: BadInput naming the value.
  for (const auto& [ep, imbalance] : {std::pair<int, double>{2, 2.5}, {1, 1.5}, {2, 0.5}}) {
    partition::ModelProfile p = balanced;
    try {
      apply_routing_imbalance(p, config, 8, ep, imbalance, Precision::kFloat32);
      ADD_FAILURE() << ep << " " << imbalance;
    } catch (const BadInput& error) {
      EXPECT_NE(std::string(error.what()).find("--routing-imbalance"), std::string::npos)
          << error.what();
    }
  }
}

}  // namespace
}  // namespace pipetrain::models
