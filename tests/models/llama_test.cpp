// Tests for the Llama family (include/pipetrain/models/llama.h) against transformers' own models
// (tests/helpers/hf_models.h): same logits, loading only some entries, saving what
// from_pretrained loads.
#include "pipetrain/models/llama.h"

#include <cmath>
#include <filesystem>
#include <optional>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/hf_models.h"
#include "pipetrain/io/safetensors.h"
#include "pipetrain/stage/in_place_gradients.h"
#include "pipetrain/stage/precision.h"

namespace pipetrain::models {
namespace {

using testing::hf_fixtures;
namespace fs = std::filesystem;

// A model from a fixture directory, every entry loaded.
LlamaModel load_fixture(const std::string& arch, LlamaBuildOptions options = {}) {
  const std::string dir = hf_fixtures() + "/" + arch;
  LlamaModel model = make_llama(read_llama_config(dir), options);
  load_llama_weights(model, io::SafetensorsCheckpoint::open(dir));
  return model;
}

torch::Tensor fixture_tensor(const std::string& file, const std::string& name,
                             torch::Dtype dtype = torch::kFloat32) {
  return io::SafetensorsCheckpoint::open(hf_fixtures() + "/" + file).load(name, dtype);
}

double relative_error(const torch::Tensor& got, const torch::Tensor& expected) {
  return (got - expected).abs().max().item<double>() / expected.abs().max().item<double>();
}

class LlamaLogits : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaLogits, EqualTransformersForTheSameCheckpoint) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  LlamaModel model = load_fixture(GetParam());
  model.sequential->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor logits =
      model.sequential->forward(fixture_tensor("prompt.safetensors", "tokens", torch::kInt64));
  const torch::Tensor expected = fixture_tensor(GetParam() + "_logits.safetensors", "logits");
  ASSERT_EQ(logits.sizes(), expected.sizes());
  EXPECT_LT(relative_error(logits, expected), 1e-5) << GetParam();
}

// The mixtures' fixtures draw their routers with std 1 (hf_reference.py), so that no token's
// top-k choice is within a rounding of a tie.
INSTANTIATE_TEST_SUITE_P(Architectures, LlamaLogits,
                         ::testing::Values("llama", "qwen2", "mistral", "qwen2_moe", "qwen3_moe",
                                           "mixtral"));

// One layer's load-balancing term on one micro-batch's router logits is transformers'
// load_balancing_loss_func on those logits alone; its gradient reaches the router's logits.
TEST(Llama, OneLayersLoadBalancingTermIsTransformersOnThatLayersLogits) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string dir = testing::scratch_dir("load_balancing");
  torch::manual_seed(7);
  const torch::Tensor logits = (torch::randn({24, 6}) * 2).requires_grad_();
  io::write_safetensors_file(dir + "/logits.safetensors", {{"logits", logits.detach()}});
  const torch::Tensor term = load_balancing_loss(logits, 2);
  const testing::CliRun reference =
      testing::hf_reference("aux " + dir + "/logits.safetensors --top-k 2");
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const double expected = std::stod(reference.output.substr(reference.output.find("aux ") + 4));
  EXPECT_NEAR(term.item<double>(), expected, 1e-6 * std::abs(expected)) << reference.output;
  term.backward();
  EXPECT_GT(logits.grad().abs().sum().item<double>(), 0);
}

TEST(Llama, MixturesOfExpertsReadTheirExpertsAndLayersAsTransformersBuildsThem) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const LlamaConfig qwen2 = read_llama_config(hf_fixtures() + "/qwen2_moe");
  EXPECT_EQ(qwen2.architecture, LlamaArchitecture::kQwen2Moe);
  EXPECT_EQ(qwen2.num_experts, 4);
  EXPECT_EQ(qwen2.num_experts_per_tok, 2);
  EXPECT_EQ(qwen2.expert_intermediate_size, 16);
  EXPECT_EQ(qwen2.shared_expert_intermediate_size, 24);
  EXPECT_TRUE(qwen2.norm_topk_prob);
  EXPECT_TRUE(qwen2.qkv_bias);
  EXPECT_EQ(qwen2.moe_layer, (std::vector<char>{1, 0}));  // mlp_only_layers [1]
  const LlamaConfig qwen3 = read_llama_config(hf_fixtures() + "/qwen3_moe");
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_FALSE(qwen3.norm_topk_prob);
  EXPECT_EQ(qwen3.moe_layer, (std::vector<char>{1, 1}));
  const LlamaConfig mixtral = read_llama_config(hf_fixtures() + "/mixtral");
  EXPECT_TRUE(mixtral.norm_topk_prob);
  EXPECT_EQ(mixtral.expert_intermediate_size, 16);
  EXPECT_DOUBLE_EQ(mixtral.rms_norm_eps, 1e-5);
  // Every tensor the checkpoint holds is one the model names, and the other way round
  // (load_llama_weights refuses either difference); the counts as transformers counts them.
  for (const char* arch : {"qwen2_moe", "qwen3_moe", "mixtral"}) {
    LlamaModel model = load_fixture(arch);
    int64_t count = 0;
    for (const auto& p : model.sequential->parameters()) count += p.numel();
    EXPECT_EQ(count, model.config->parameter_count()) << arch;
  }
  // What cannot run is refused naming the key.
  nlohmann::json json = qwen3.source;
  EXPECT_FALSE(qwen3.aux_loss);
  json["output_router_logits"] = true;
  EXPECT_TRUE(parse_llama_config(json).aux_loss);
  json = qwen3.source;
  json["num_experts_per_tok"] = 5;
  EXPECT_THROW(parse_llama_config(json), ModelConfigError);
  json = mixtral.source;
  json["router_jitter_noise"] = 0.1;
  EXPECT_THROW(parse_llama_config(json), ModelConfigError);
  // Tensor parallelism splits a mixture's attention and keeps its experts whole: tp 2 is a layout
  // (4 heads, 2 key/value heads), tp 3 divides neither.
  EXPECT_NO_THROW(check_llama_tensor_parallel(mixtral, 2));
  EXPECT_THROW(check_llama_tensor_parallel(mixtral, 3), BadInput);
  EXPECT_FALSE(tensor_parallel_split("1.block_sparse_moe.experts.0.w1.weight", mixtral, 2));
  EXPECT_FALSE(tensor_parallel_split("1.block_sparse_moe.gate.weight", mixtral, 2));
}

TEST(Llama, ConfigsOfTheThreeArchitecturesReadAsTransformersBuildsThem) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const LlamaConfig llama = read_llama_config(hf_fixtures() + "/llama");
  EXPECT_EQ(llama.architecture, LlamaArchitecture::kLlama);
  EXPECT_EQ(llama.num_key_value_heads, 2);
  EXPECT_EQ(llama.head_dim, 8);
  EXPECT_EQ(llama.rope.type, "llama3");
  EXPECT_EQ(llama.rope_theta, 500000.0);
  EXPECT_EQ(llama.rope.original_max_position_embeddings, 64);
  EXPECT_FALSE(llama.tie_word_embeddings);
  EXPECT_FALSE(llama.qkv_bias);
  const LlamaConfig qwen = read_llama_config(hf_fixtures() + "/qwen2/config.json");
  EXPECT_EQ(qwen.architecture, LlamaArchitecture::kQwen2);
  EXPECT_TRUE(qwen.tie_word_embeddings);
  EXPECT_TRUE(qwen.qkv_bias);
  EXPECT_FALSE(qwen.output_bias);
  EXPECT_EQ(qwen.rope.type, "default");  // from "rope_scaling": null and a top-level rope_theta
  EXPECT_EQ(qwen.dtype, "float32");      // from "torch_dtype"
  const LlamaConfig mistral = read_llama_config(hf_fixtures() + "/mistral");
  EXPECT_EQ(mistral.architecture, LlamaArchitecture::kMistral);
  EXPECT_EQ(mistral.sliding_window, (std::vector<int64_t>{0, 0}));
}

// MFU's model FLOPs (LlamaConfig::training_flops_per_token): 6 per weight of the matrices a
// token passes through, counted here from the built model's own 2-D parameters (the LM head's
// table, which a tied model registers under the head's name too; not the embedding lookup's),
// plus 12 x layers x the query width x T for attention.
TEST(Llama, TrainingFlopsPerTokenCountSixPerMatrixWeightPlusAttention) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  for (const std::string name : {"llama", "qwen2"}) {
    const LlamaConfig config = read_llama_config(hf_fixtures() + "/" + name);
    const LlamaModel model = make_llama(config);
    double weights = 0;
    for (const auto& item : model.sequential->named_parameters()) {
      if (item.value().dim() == 2 && item.key().rfind("0.", 0) != 0) {
        weights += static_cast<double>(item.value().numel());
      }
    }
    const double attention =
        12.0 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * 32;
    EXPECT_DOUBLE_EQ(config.training_flops_per_token(32), 6 * weights + attention) << name;
  }
}

TEST(Llama, AModelBuiltInPartsHoldsMetaPlaceholdersAndTheSameValuesWhereMaterialized) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const LlamaModel whole = load_fixture("llama");
  const LlamaModel part =
      load_fixture("llama", LlamaBuildOptions().entries(std::vector<int64_t>{1, 4}));
  ASSERT_EQ(part.sequential->size(), 5u);
  const auto whole_params = whole.sequential->named_parameters();
  for (const auto& item : part.sequential->named_parameters()) {
    const int entry = std::stoi(item.key().substr(0, item.key().find('.')));
    if (entry == 1 || entry == 4) {
      ASSERT_FALSE(item.value().is_meta()) << item.key();
      EXPECT_TRUE(torch::equal(item.value(), whole_params[item.key()])) << item.key();
    } else {
      EXPECT_TRUE(item.value().is_meta()) << item.key();
      EXPECT_EQ(item.value().sizes(), whole_params[item.key()].sizes()) << item.key();
    }
  }
}

TEST(Llama, ATiedTableIsOneTensorRealWhenEitherEndIsMaterialized) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const LlamaModel part =
      load_fixture("qwen2", LlamaBuildOptions().entries(std::vector<int64_t>{4}));
  ASSERT_EQ(part.tied_parameters.size(), 1u);
  EXPECT_EQ(part.tied_parameters[0],
            std::make_pair(std::string("0.weight"), std::string("4.weight")));
  const auto params = part.sequential->named_parameters();
  EXPECT_TRUE(params["0.weight"].is_same(params["4.weight"]));
  EXPECT_FALSE(params["4.weight"].is_meta());
  EXPECT_TRUE(params["1.self_attn.q_proj.weight"].is_meta());
}

TEST(Llama, RandomInitIsTheSameForAnySubsetOfEntries) {
  LlamaConfig config = llama_config(50, 16, 24, /*layers=*/3, /*heads=*/4, /*kv_heads=*/2);
  config.pad_token_id = 3;
  LlamaModel whole = make_llama(config);
  init_llama_random(whole, 7);
  LlamaModel part = make_llama(config, LlamaBuildOptions().entries(std::vector<int64_t>{0, 2}));
  init_llama_random(part, 7);
  const auto expected = whole.sequential->named_parameters();
  for (const auto& item : part.sequential->named_parameters()) {
    if (item.value().is_meta()) continue;
    EXPECT_TRUE(torch::equal(item.value(), expected[item.key()])) << item.key();
  }
  EXPECT_TRUE(torch::equal(expected["2.input_layernorm.weight"], torch::ones({16})));
  EXPECT_TRUE(torch::equal(expected["0.weight"][3], torch::zeros({16})));  // the pad row
  const double std = expected["1.mlp.up_proj.weight"].std().item<double>();
  EXPECT_NEAR(std, 0.02, 0.004);
}

// A tied embedding and head holding `values`, and the count of gradients autograd carries to the
// table (those not added into .grad() from inside the operations).
struct TiedTable {
  LlamaEmbedding embedding;
  LlamaHead head;
  std::shared_ptr<int> handed = std::make_shared<int>(0);

  TiedTable(const std::shared_ptr<const LlamaConfig>& config, const torch::Tensor& values)
      : embedding(config), head(config, torch::TensorOptions(), embedding->weight) {
    torch::NoGradGuard no_grad;
    weight().copy_(values);
    weight().register_hook([handed = handed](const torch::Tensor& g) {
      if (g.defined()) ++*handed;
    });
  }
  torch::Tensor weight() const { return embedding->weight; }
};

// Two micro-batches for a tied 70000 x 128 table (two 32 MiB blocks of float32 rows): tokens that
// repeat (a row summed from several) and 3, the hidden states reaching the head (in `dtype`),
// and the gradients pushed back into the embedding and into the logits (in `dtype`).
struct TwoMicroBatches {
  std::shared_ptr<const LlamaConfig> config;
  std::vector<torch::Tensor> tokens, hidden, emb_grads, logit_grads;
  torch::Tensor values;  // the table's
};

TwoMicroBatches two_micro_batches(int64_t pad_token_id, torch::ScalarType dtype, uint64_t seed) {
  LlamaConfig config = llama_config(70000, 128, 32, /*layers=*/1, /*heads=*/4, /*kv_heads=*/2);
  config.tie_word_embeddings = true;
  config.pad_token_id = pad_token_id;
  TwoMicroBatches m;
  m.config = std::make_shared<const LlamaConfig>(config);
  torch::manual_seed(seed);
  m.tokens = {torch::tensor({5, 9, 5, 3, 69999, 5, 0, 9}, torch::kInt64).reshape({2, 4}),
              torch::tensor({9, 9, 3, 1, 2, 69999, 7, 7}, torch::kInt64).reshape({2, 4})};
  for (int i = 0; i < 2; ++i) {
    m.hidden.push_back(torch::randn({2, 4, 128}).to(dtype));
    m.emb_grads.push_back(torch::randn({2, 4, 128}));
    m.logit_grads.push_back(torch::randn({2, 4, 70000}).to(dtype));
  }
  m.values = torch::randn({70000, 128});
  return m;
}

// A clone of a tied model owns every tensor: its head is a table of its own with the embedding's
// values, and the original's table keeps its storage. (Cloneable's copy registered the
// original's table in every copy's head and replaced its data: the auto plan's copies calibrated
// on threads at once then shared one tensor's gradient, and crashed under load.)
TEST(Llama, ACloneOfATiedModelSharesNoTensorWithIt) {
  LlamaConfig config = llama_config(64, 16, 24, /*layers=*/1, /*heads=*/2, /*kv_heads=*/1);
  config.tie_word_embeddings = true;
  LlamaModel model = make_llama(config);
  init_llama_random(model, 3);
  const torch::Tensor table = model.sequential->ptr(0)->named_parameters()["weight"];
  const void* storage = table.data_ptr();
  const auto copy =
      std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model.sequential->clone(torch::kCPU));
  EXPECT_EQ(table.data_ptr(), storage);
  std::set<const void*> original;
  for (const torch::Tensor& p : model.sequential->parameters()) original.insert(p.data_ptr());
  for (const auto& item : copy->named_parameters()) {
    EXPECT_FALSE(original.count(item.value().data_ptr())) << item.key();
  }
  const torch::Tensor head = copy->ptr(copy->size() - 1)->named_parameters()["weight"];
  EXPECT_TRUE(torch::equal(head, table));
}

// The tied table's gradient over two micro-batches, the head's then the embedding's of each (the
// order a stage's backward takes them): where the backward's caller allows it, added into
// .grad() from inside the two operations (no table-sized gradient handed to autograd; the head's
// in blocks of the vocabulary, two here) with the bits of torch's own embedding and linear;
// elsewhere handed to autograd as before, with the same bits.
TEST(Llama, TheTableTakesItsGradientIntoGradInPlaceWithTorchsBits) {
  // 3 is the pad here: its row takes nothing.
  const TwoMicroBatches m = two_micro_batches(/*pad_token_id=*/3, torch::kFloat32, /*seed=*/0);
  const auto& [shared, tokens, hidden, emb_grads, logit_grads, values] = m;

  // torch's own operations, each backward accumulated into .grad() by autograd.
  torch::Tensor expected = values.clone().requires_grad_();
  std::vector<torch::Tensor> expected_x;
  for (int i = 0; i < 2; ++i) {
    torch::Tensor x = hidden[i].clone().requires_grad_();
    torch::linear(x, expected).backward(logit_grads[i]);
    torch::embedding(expected, tokens[i], 3).backward(emb_grads[i]);
    expected_x.push_back(x.grad());
  }

  for (const bool in_place : {true, false}) {
    SCOPED_TRACE(in_place ? "in place" : "handed to autograd");
    TiedTable table(shared, values);
    torch::Tensor w = table.weight();
    const void* first = nullptr;
    for (int i = 0; i < 2; ++i) {
      std::optional<InPlaceGradients> scope;
      if (in_place) scope.emplace(std::vector<torch::Tensor>{w});
      torch::Tensor x = hidden[i].clone().requires_grad_();
      table.head->forward(x).backward(logit_grads[i]);
      table.embedding->forward(tokens[i]).backward(emb_grads[i]);
      EXPECT_TRUE(torch::equal(x.grad(), expected_x[static_cast<size_t>(i)])) << i;
      if (i == 0) first = w.grad().data_ptr();
    }
    EXPECT_TRUE(torch::equal(w.grad(), expected.grad()));
    if (in_place) {
      EXPECT_EQ(*table.handed, 0);
      EXPECT_EQ(w.grad().data_ptr(), first);  // accumulated where it was
    } else {
      EXPECT_EQ(*table.handed, 4);
    }
  }
}

TEST(Llama, UnderBf16AutocastTheTableTakesItsGradientIntoGradInPlaceWithTorchsBits) {
  // Two blocks of the vocabulary (32 MiB of float32 rows each); the input wants no gradient (its
  // product, the slowest in bf16 on a CPU without AVX-512, is autocast_linear's, tested there).
  const TwoMicroBatches m = two_micro_batches(/*pad_token_id=*/-1, torch::kBFloat16, /*seed=*/1);
  const auto& [shared, tokens, hidden, emb_grads, logit_grads, values] = m;

  torch::Tensor expected = values.clone().requires_grad_();
  std::vector<torch::Tensor> expected_logits;
  for (int i = 0; i < 2; ++i) {
    torch::Tensor logits;
    {
      const AutocastGuard autocast(Precision::kBFloat16, torch::kCPU);
      logits = torch::linear(hidden[i], expected);
    }
    logits.backward(logit_grads[i]);
    torch::embedding(expected, tokens[i]).backward(emb_grads[i]);
    expected_logits.push_back(logits.detach());
  }

  for (const bool in_place : {true, false}) {
    SCOPED_TRACE(in_place ? "in place" : "handed to autograd");
    TiedTable table(shared, values);
    torch::Tensor w = table.weight();
    for (int i = 0; i < 2; ++i) {
      std::optional<InPlaceGradients> scope;
      if (in_place) scope.emplace(std::vector<torch::Tensor>{w});
      torch::Tensor logits;
      {
        const AutocastGuard autocast(Precision::kBFloat16, torch::kCPU);
        logits = table.head->forward(hidden[i]);
      }
      EXPECT_TRUE(torch::equal(logits, expected_logits[static_cast<size_t>(i)])) << i;
      logits.backward(logit_grads[i]);
      table.embedding->forward(tokens[i]).backward(emb_grads[i]);
    }
    EXPECT_EQ(w.grad().scalar_type(), torch::kFloat32);
    EXPECT_TRUE(torch::equal(w.grad(), expected.grad()))
        << (w.grad() - expected.grad()).abs().max();
    EXPECT_EQ(*table.handed, in_place ? 0 : 4);
  }
}

// Under bf16 autocast the input's gradient through a table of more than one block is summed by
// blocks of the vocabulary (no bf16 cast of the whole table in the backward): within one bf16
// rounding of torch's product, its products exact and summed in float32 in another order.
TEST(Llama, UnderBf16AutocastTheInputGradientThroughALargeTableIsWithinARoundingOfTorchs) {
  const TwoMicroBatches m = two_micro_batches(/*pad_token_id=*/-1, torch::kBFloat16, /*seed=*/2);
  TiedTable table(m.config, m.values);
  const torch::Tensor x = m.hidden[0].to(torch::kFloat32).requires_grad_();
  const torch::Tensor reference = x.detach().clone().requires_grad_();
  {
    const AutocastGuard autocast(Precision::kBFloat16, torch::kCPU);
    table.head->forward(x).backward(m.logit_grads[0]);
    torch::linear(reference, m.values).backward(m.logit_grads[0]);
  }
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().scalar_type(), torch::kFloat32);
  // Each value a bf16 one (rounded once), within one bf16 step (2^-7 relative) of torch's.
  EXPECT_TRUE(torch::equal(x.grad(), x.grad().to(torch::kBFloat16).to(torch::kFloat32)));
  const torch::Tensor step = reference.grad().abs() * std::ldexp(1.0, -7) + 1e-6;
  EXPECT_TRUE(((x.grad() - reference.grad()).abs() <= step).all().item<bool>())
      << ((x.grad() - reference.grad()).abs() / step).max();
}

TEST(Llama, HfNamesMapBothWays) {
  LlamaConfig config;
  config.num_hidden_layers = 4;
  EXPECT_EQ(hf_name_of("0.weight", config), "model.embed_tokens.weight");
  EXPECT_EQ(hf_name_of("3.mlp.up_proj.weight", config), "model.layers.2.mlp.up_proj.weight");
  EXPECT_EQ(hf_name_of("5.weight", config), "model.norm.weight");
  EXPECT_EQ(hf_name_of("6.weight", config), "lm_head.weight");
  EXPECT_EQ(entry_name_of("model.layers.3.self_attn.k_proj.bias", config),
            std::optional<std::string>("4.self_attn.k_proj.bias"));
  EXPECT_EQ(entry_name_of("lm_head.weight", config), std::optional<std::string>("6.weight"));
  EXPECT_EQ(entry_name_of("model.layers.4.mlp.up_proj.weight", config), std::nullopt);
  EXPECT_EQ(entry_name_of("transformer.wte.weight", config), std::nullopt);
}

TEST(Llama, SavedCheckpointsLoadInTransformersWithTheSameLogits) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  for (const std::string arch : {"llama", "qwen2"}) {
    LlamaModel model = load_fixture(arch);
    std::map<std::string, torch::Tensor> parameters;
    for (const auto& item : model.sequential->named_parameters()) {
      parameters[item.key()] = item.value();
    }
    const std::string out = testing::scratch_dir("llama-save-" + arch);
    // A small shard limit: the tied Qwen2 is written in several shards with an index.
    const auto files = save_llama_hf(
        out, *model.config, parameters,
        HfSaveOptions().max_shard_bytes(arch == "qwen2" ? 20000 : int64_t{5'000'000'000}));
    EXPECT_EQ(files.back(), "config.json");
    EXPECT_EQ(fs::exists(out + "/model.safetensors.index.json"), arch == "qwen2");
    const auto checkpoint = io::SafetensorsCheckpoint::open(out);
    EXPECT_EQ(checkpoint.contains("lm_head.weight"), arch == "llama");  // tied: left out
    const testing::CliRun logits =
        testing::hf_reference("logits " + out + " " + hf_fixtures() + "/prompt.safetensors " + out +
                              "/logits.safetensors");
    ASSERT_EQ(logits.exit_code, 0) << logits.output;
    const torch::Tensor got = io::SafetensorsCheckpoint::open(out + "/logits.safetensors")
                                  .load("logits", torch::kFloat32);
    EXPECT_LT(relative_error(got, fixture_tensor(arch + "_logits.safetensors", "logits")), 1e-6)
        << arch;
  }
}

TEST(Llama, ACheckpointOfAnotherShapeIsAnErrorNamingTheFileAndTensor) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  LlamaConfig config = read_llama_config(hf_fixtures() + "/llama");
  config.intermediate_size = 40;  // the checkpoint's MLP is 48 wide
  LlamaModel model = make_llama(config);
  try {
    load_llama_weights(model, io::SafetensorsCheckpoint::open(hf_fixtures() + "/llama"));
    FAIL() << "loaded a checkpoint of another shape";
  } catch (const io::SafetensorsError& error) {
    EXPECT_EQ(error.tensor(), "model.layers.0.mlp.gate_proj.weight");
    EXPECT_NE(error.file().find("model.safetensors"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("[48, 32]"), std::string::npos) << error.what();
  }
}

TEST(Llama, MissingAndExtraTensorsAreErrorsNamingThem) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const auto source = io::SafetensorsCheckpoint::open(hf_fixtures() + "/llama");
  io::NamedTensorList tensors;
  for (const std::string& name : source.names()) {
    if (name == "model.norm.weight") continue;
    tensors.emplace_back(name, source.load(name, torch::kFloat32));
  }
  const std::string missing = testing::scratch_dir("llama-missing");
  io::write_safetensors_checkpoint(missing, tensors);
  LlamaModel model = make_llama(read_llama_config(hf_fixtures() + "/llama"));
  try {
    load_llama_weights(model, io::SafetensorsCheckpoint::open(missing));
    FAIL() << "loaded a checkpoint without model.norm.weight";
  } catch (const io::SafetensorsError& error) {
    EXPECT_EQ(error.tensor(), "model.norm.weight");
    EXPECT_NE(std::string(error.what()).find("missing"), std::string::npos) << error.what();
  }
  tensors.emplace_back("model.norm.weight", torch::ones({32}));
  tensors.emplace_back("model.layers.7.mlp.up_proj.weight", torch::ones({48, 32}));
  const std::string extra = testing::scratch_dir("llama-extra");
  io::write_safetensors_checkpoint(extra, tensors);
  try {
    load_llama_weights(model, io::SafetensorsCheckpoint::open(extra));
    FAIL() << "loaded a checkpoint with a layer the config does not have";
  } catch (const io::SafetensorsError& error) {
    EXPECT_EQ(error.tensor(), "model.layers.7.mlp.up_proj.weight");
    EXPECT_NE(std::string(error.what()).find("extra"), std::string::npos) << error.what();
  }
}

TEST(Llama, Bf16WeightsLoadIntoFloat32) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string dir = testing::scratch_dir("llama-bf16");
  const testing::CliRun made =
      testing::hf_reference("make " + dir + "/model --arch llama --dtype bfloat16 --seed 1");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const auto checkpoint = io::SafetensorsCheckpoint::open(dir + "/model");
  EXPECT_EQ(checkpoint.entry("model.norm.weight").dtype, io::SafetensorsDtype::kBF16);
  LlamaModel model = make_llama(read_llama_config(dir + "/model"));
  load_llama_weights(model, checkpoint);
  const torch::Tensor q = model.sequential->named_parameters()["1.self_attn.q_proj.weight"];
  EXPECT_EQ(q.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(q, q.to(torch::kBFloat16).to(torch::kFloat32)));  // exact widening
}

}  // namespace
}  // namespace pipetrain::models

namespace pipetrain::models {
namespace {

// What ZeRO-3 may gather in bf16 (stage/autocast_parameters.h): every projection's weight, the
// biases a linear reads, the untied head; never a norm or the embedding, and not a head tied to
// the embedding.
TEST(Llama, TheParametersReadOnlyThroughAutocastsCastsAreTheProjectionsAndAnUntiedHead) {
  LlamaConfig config = llama_config(32, 16, 24, /*layers=*/2, /*heads=*/4, /*kv_heads=*/2);
  config.qkv_bias = true;
  config.output_bias = true;  // read inside o_proj's linear while tp does not split it
  config.mlp_bias = true;
  for (const bool tied : {false, true}) {
    config.tie_word_embeddings = tied;
    const LlamaModel model = make_llama(config);
    std::set<std::string> got;
    const auto cast = autocast_cast_parameters(*model.sequential);
    for (const auto& item : model.sequential->named_parameters()) {
      for (const torch::Tensor& t : cast) {
        if (t.is_same(item.value())) got.insert(item.key());
      }
    }
    std::set<std::string> want;
    for (const std::string layer : {"1", "2"}) {
      for (const std::string name :
           {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
            "self_attn.o_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.bias",
            "self_attn.v_proj.bias", "self_attn.o_proj.bias", "mlp.gate_proj.weight",
            "mlp.up_proj.weight", "mlp.down_proj.weight", "mlp.gate_proj.bias", "mlp.up_proj.bias",
            "mlp.down_proj.bias"}) {
        want.insert(layer + "." + name);
      }
    }
    if (!tied) want.insert("4.weight");
    EXPECT_EQ(got, want) << "tied " << tied;
  }
}

}  // namespace
}  // namespace pipetrain::models
