// Reading and writing a Llama-family config.json (models/llama_config.h).
#include "pipetrain/models/llama_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "pipetrain/base/atomic_file.h"

namespace pipetrain::models {
namespace {

// More layers than any model has (the largest public ones have a few hundred): a bound that keeps
// a corrupt count from sizing allocations.
constexpr int64_t kMostLayers = 65536;

using Json = nlohmann::json;

// Keys of a PreTrainedConfig that change nothing pipetrain computes: ids of special tokens,
// generation settings, labels, bookkeeping of transformers itself.
const std::set<std::string> kInertKeys = {"_name_or_path",
                                          "transformers_version",
                                          "use_cache",
                                          "bos_token_id",
                                          "eos_token_id",
                                          "sep_token_id",
                                          "decoder_start_token_id",
                                          "return_dict",
                                          "output_hidden_states",
                                          "output_attentions",
                                          "torchscript",
                                          "id2label",
                                          "label2id",
                                          "problem_type",
                                          "tokenizer_class",
                                          "prefix",
                                          "task_specific_params",
                                          "finetuning_task",
                                          "max_length",
                                          "min_length",
                                          "do_sample",
                                          "early_stopping",
                                          "num_beams",
                                          "num_beam_groups",
                                          "diversity_penalty",
                                          "temperature",
                                          "top_k",
                                          "top_p",
                                          "typical_p",
                                          "repetition_penalty",
                                          "length_penalty",
                                          "no_repeat_ngram_size",
                                          "encoder_no_repeat_ngram_size",
                                          "bad_words_ids",
                                          "num_return_sequences",
                                          "output_scores",
                                          "return_dict_in_generate",
                                          "forced_bos_token_id",
                                          "forced_eos_token_id",
                                          "remove_invalid_values",
                                          "exponential_decay_length_penalty",
                                          "suppress_tokens",
                                          "begin_suppress_tokens",
                                          "tf_legacy_loss",
                                          "pruned_heads",
                                          "use_bfloat16",
                                          "chunk_size_feed_forward",
                                          "is_encoder_decoder",
                                          "is_decoder",
                                          "add_cross_attention",
                                          "tie_encoder_decoder",
                                          "cross_attention_hidden_size",
                                          "auto_map",
                                          "attn_implementation",
                                          "_attn_implementation",
                                          "_attn_implementation_autoset",
                                          "output_router_logits",
                                          "initializer_range",
                                          "pretraining_tp",
                                          "dtype",
                                          "torch_dtype",
                                          "architectures",
                                          "model_type",
                                          "max_position_embeddings"};

std::string value_text(const Json& value) {
  return value.dump();
}

class Reader {
 public:
  Reader(const Json& json, std::string file) : json_(json), file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& problem) const {
    throw ModelConfigError(file_, key, json_.contains(key) ? value_text(json_.at(key)) : "",
                           problem);
  }
  [[noreturn]] void fail_value(const std::string& key, const Json& value,
                               const std::string& problem) const {
    throw ModelConfigError(file_, key, value_text(value), problem);
  }

  bool has(const std::string& key) const {
    used_.insert(key);
    return json_.contains(key) && !json_.at(key).is_null();
  }
  int64_t count(const std::string& key, int64_t fallback, bool required = false) const {
    if (!has(key)) {
      if (required) fail(key, "is missing; a Llama-family config.json gives it");
      return fallback;
    }
    const Json& v = json_.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        (v.is_number_unsigned() && v.get<uint64_t>() > (uint64_t{1} << 40))) {
      fail(key, "is not a count (a non-negative integer below 2^40)");
    }
    return v.get<int64_t>();
  }
  double number(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    const Json& v = json_.at(key);
    if (!v.is_number() || !std::isfinite(v.get<double>())) fail(key, "is not a finite number");
    return v.get<double>();
  }
  bool flag(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!json_.at(key).is_boolean()) fail(key, "is not true or false");
    return json_.at(key).get<bool>();
  }
  std::string text(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!json_.at(key).is_string()) fail(key, "is not a string");
    return json_.at(key).get<std::string>();
  }
  const Json& at(const std::string& key) const {
    used_.insert(key);
    return json_.at(key);
  }
  // Keys neither read nor inert: each would change the computation in ways pipetrain does not
  // know, so the first is an error.
  void check_all_used(const std::set<std::string>& inert_here) const {
    for (const auto& item : json_.items()) {
      const std::string& key = item.key();
      if (used_.count(key) || kInertKeys.count(key) || inert_here.count(key)) continue;
      if (item.value().is_null()) continue;  // an unset setting changes nothing
      fail(key,
           "is not a key pipetrain's Llama port reads; it may change the computation, so "
           "the model is refused (docs/MODELS.md lists the keys it reads)");
    }
  }
  const std::string& file() const { return file_; }

 private:
  const Json& json_;
  std::string file_;
  mutable std::set<std::string> used_;
};

LlamaArchitecture read_architecture(const Reader& r) {
  const std::vector<std::pair<std::string, LlamaArchitecture>> known = {
      {"LlamaForCausalLM", LlamaArchitecture::kLlama},
      {"MistralForCausalLM", LlamaArchitecture::kMistral},
      {"Qwen2ForCausalLM", LlamaArchitecture::kQwen2},
      {"Qwen2MoeForCausalLM", LlamaArchitecture::kQwen2Moe},
      {"Qwen3MoeForCausalLM", LlamaArchitecture::kQwen3Moe},
      {"MixtralForCausalLM", LlamaArchitecture::kMixtral}};
  bool found = false;
  LlamaArchitecture architecture = LlamaArchitecture::kLlama;
  if (r.has("architectures")) {
    const Json& list = r.at("architectures");
    if (!list.is_array() || list.size() != 1 || !list[0].is_string()) {
      r.fail("architectures",
             "must list one architecture: LlamaForCausalLM, MistralForCausalLM, "
             "Qwen2ForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM or MixtralForCausalLM");
    }
    const std::string name = list[0].get<std::string>();
    for (const auto& [text, value] : known) {
      if (name == text) {
        architecture = value;
        found = true;
      }
    }
    if (!found) {
      r.fail("architectures",
             "is not one pipetrain runs (LlamaForCausalLM, MistralForCausalLM, "
             "Qwen2ForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM)");
    }
  }
  if (r.has("model_type")) {
    const std::string type = r.text("model_type", "");
    bool type_known = false;
    for (const auto& item : known) {
      if (type == model_type_of(item.second)) {
        type_known = true;
        if (found && item.second != architecture) {
          r.fail("model_type",
                 std::string("disagrees with architectures (") + to_string(architecture) + ")");
        }
        if (!found) architecture = item.second;
        found = true;
      }
    }
    if (!type_known) {
      r.fail("model_type", "is not llama, mistral, qwen2, qwen2_moe, qwen3_moe or mixtral");
    }
  }
  if (!found) {
    r.fail("architectures", "is missing, and so is model_type: which model is this?");
  }
  return architecture;
}

// rope_theta and rope_scaling (published checkpoints) or rope_parameters (transformers 5), read
// as transformers standardizes them.
void read_rope(const Reader& r, LlamaConfig& c) {
  const bool scaling = r.has("rope_scaling");
  const bool parameters = r.has("rope_parameters");
  const std::string key = scaling ? "rope_scaling" : "rope_parameters";
  Json rope = Json::object();
  if (scaling || parameters) {
    rope = r.at(key);
    if (!rope.is_object()) r.fail(key, "is not an object");
  }
  c.rope_theta = r.number("rope_theta", 10000.0);
  for (const auto& item : rope.items()) {
    if (item.value().is_object()) {
      r.fail(key, "holds RoPE settings per layer type ('" + item.key() +
                      "'); pipetrain's Llama port has one RoPE for every layer");
    }
  }
  auto number = [&](const std::string& field, double fallback, bool required) {
    if (!rope.contains(field) || rope[field].is_null()) {
      if (required) r.fail(key, "has no " + field + " for rope_type " + c.rope.type);
      return fallback;
    }
    if (!rope[field].is_number() || !std::isfinite(rope[field].get<double>())) {
      r.fail(key, field + " is not a finite number");
    }
    return rope[field].get<double>();
  };
  std::string type = "default";
  for (const char* field : {"type", "rope_type"}) {
    if (rope.contains(field) && !rope[field].is_null()) {
      if (!rope[field].is_string()) r.fail(key, std::string(field) + " is not a string");
      type = rope[field].get<std::string>();
    }
  }
  if (rope.contains("rope_type") && rope.contains("type") && rope["type"].is_string()) {
    type = rope["rope_type"].get<std::string>();  // transformers prefers rope_type
  }
  c.rope.type = type;
  c.rope_theta = number("rope_theta", c.rope_theta, false);
  if (!(c.rope_theta > 0)) r.fail(key, "rope_theta must be positive");
  std::set<std::string> allowed = {"type", "rope_type", "rope_theta"};
  if (type == "linear") {
    c.rope.factor = number("factor", 1.0, true);
    allowed.insert("factor");
  } else if (type == "llama3") {
    c.rope.factor = number("factor", 1.0, true);
    c.rope.low_freq_factor = number("low_freq_factor", 1.0, true);
    c.rope.high_freq_factor = number("high_freq_factor", 4.0, true);
    c.rope.original_max_position_embeddings = static_cast<int64_t>(number(
        "original_max_position_embeddings", static_cast<double>(c.max_position_embeddings), false));
    if (!(c.rope.high_freq_factor > c.rope.low_freq_factor) || !(c.rope.low_freq_factor > 0) ||
        c.rope.original_max_position_embeddings < 1) {
      r.fail(key,
             "llama3 scaling needs high_freq_factor > low_freq_factor > 0 and a positive "
             "original_max_position_embeddings");
    }
    allowed.insert(
        {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  } else if (type != "default") {
    r.fail(key, "rope_type '" + type + "' is not supported (default, linear, llama3)");
  }
  if ((type == "linear" || type == "llama3") && !(c.rope.factor > 0)) {
    r.fail(key, "factor must be positive");
  }
  for (const auto& item : rope.items()) {
    if (allowed.count(item.key())) continue;
    if (item.key() == "partial_rotary_factor" && item.value().is_number() &&
        item.value().get<double>() == 1.0) {
      continue;
    }
    r.fail(key, "has '" + item.key() + "' (" + value_text(item.value()) + "), which rope_type " +
                    type + " does not take in pipetrain");
  }
  if (r.has("partial_rotary_factor") && r.number("partial_rotary_factor", 1.0) != 1.0) {
    r.fail("partial_rotary_factor", "must be 1 (RoPE over the whole head)");
  }
}

// Sliding windows per layer: Mistral's on every layer, Qwen2's where layer_types say so.
void read_sliding_window(const Reader& r, LlamaConfig& c) {
  // The layer count sizes what follows, so it is checked first: a fuzzed config's 28888888188
  // layers asked for 231 GB here.
  if (c.num_hidden_layers < 1 || c.num_hidden_layers > kMostLayers) {
    r.fail("num_hidden_layers", "must be between 1 and " + std::to_string(kMostLayers));
  }
  c.sliding_window.assign(static_cast<size_t>(c.num_hidden_layers), 0);
  if (c.architecture == LlamaArchitecture::kLlama) return;  // an unknown key for Llama
  const int64_t window = r.count("sliding_window", 0);
  if (c.architecture == LlamaArchitecture::kMistral ||
      c.architecture == LlamaArchitecture::kMixtral) {
    if (window > 0) std::fill(c.sliding_window.begin(), c.sliding_window.end(), window);
    return;
  }
  if (c.architecture == LlamaArchitecture::kQwen3Moe) {  // every layer, with use_sliding_window
    if (r.flag("use_sliding_window", false) && window > 0) {
      std::fill(c.sliding_window.begin(), c.sliding_window.end(), window);
    }
    return;
  }
  // Qwen2: the window applies only with use_sliding_window, to the layers marked sliding.
  const bool use = r.flag("use_sliding_window", false);
  const int64_t max_window_layers = r.count("max_window_layers", 28);
  std::vector<std::string> types;
  if (r.has("layer_types")) {
    const Json& list = r.at("layer_types");
    if (!list.is_array() || static_cast<int64_t>(list.size()) != c.num_hidden_layers) {
      r.fail("layer_types",
             "must list one type per layer (" + std::to_string(c.num_hidden_layers) + ")");
    }
    for (const Json& type : list) {
      if (!type.is_string() || (type.get<std::string>() != "full_attention" &&
                                type.get<std::string>() != "sliding_attention")) {
        r.fail("layer_types",
               "holds " + value_text(type) + "; each must be full_attention or sliding_attention");
      }
      types.push_back(type.get<std::string>());
    }
  }
  if (!use || window == 0) return;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const bool sliding = types.empty() ? l >= max_window_layers
                                       : types[static_cast<size_t>(l)] == "sliding_attention";
    if (sliding) c.sliding_window[static_cast<size_t>(l)] = window;
  }
}

// The experts of a mixture (is_moe), with transformers' defaults per architecture.
void read_experts(const Reader& r, LlamaConfig& c) {
  const LlamaArchitecture a = c.architecture;
  const bool mixtral = a == LlamaArchitecture::kMixtral;
  const int64_t default_experts = mixtral ? 8 : a == LlamaArchitecture::kQwen2Moe ? 60 : 128;
  // transformers 5 writes num_local_experts for every family (its attribute_map's alias).
  c.num_experts = r.has("num_experts") ? r.count("num_experts", default_experts)
                                       : r.count("num_local_experts", default_experts);
  r.has("num_local_experts");  // read, under either name
  c.num_experts_per_tok = r.count("num_experts_per_tok", mixtral                             ? 2
                                                         : a == LlamaArchitecture::kQwen2Moe ? 4
                                                                                             : 8);
  c.expert_intermediate_size =
      mixtral ? c.intermediate_size
              : r.count("moe_intermediate_size", a == LlamaArchitecture::kQwen2Moe ? 1408 : 768);
  if (a == LlamaArchitecture::kQwen2Moe) {
    c.shared_expert_intermediate_size = r.count("shared_expert_intermediate_size", 5632);
  }
  c.norm_topk_prob = mixtral || r.flag("norm_topk_prob", false);
  c.router_aux_loss_coef = r.number("router_aux_loss_coef", 0.001);
  c.aux_loss = r.flag("output_router_logits", false);
  if (mixtral && r.number("router_jitter_noise", 0.0) != 0.0) {
    r.fail("router_jitter_noise", "must be 0: pipetrain routes without noise");
  }
  const int64_t step = mixtral ? 1 : r.count("decoder_sparse_step", 1);
  if (step < 1) r.fail("decoder_sparse_step", "must be at least 1");
  std::set<int64_t> dense;
  if (!mixtral && r.has("mlp_only_layers")) {
    const Json& list = r.at("mlp_only_layers");
    if (!list.is_array()) r.fail("mlp_only_layers", "is not a list of layer indices");
    for (const Json& l : list) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0) {
        r.fail("mlp_only_layers", "holds " + value_text(l) + ", not a layer index");
      }
      dense.insert(l.get<int64_t>());
    }
  }
  c.moe_layer.assign(static_cast<size_t>(std::max<int64_t>(c.num_hidden_layers, 0)), 0);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    c.moe_layer[static_cast<size_t>(l)] =
        !dense.count(l) && c.num_experts > 0 && (l + 1) % step == 0 ? 1 : 0;
  }
}

std::vector<int64_t> read_eos(const Reader& r) {
  if (!r.has("eos_token_id")) return {};
  const Json& value = r.at("eos_token_id");
  std::vector<int64_t> ids;
  auto add = [&](const Json& id) {
    if (!id.is_number_integer()) r.fail("eos_token_id", "is not a token id or a list of them");
    ids.push_back(id.get<int64_t>());
  };
  if (value.is_array()) {
    for (const Json& id : value) add(id);
  } else {
    add(value);
  }
  return ids;
}

}  // namespace

ModelConfigError::ModelConfigError(const std::string& file, const std::string& key,
                                   const std::string& value, const std::string& problem)
    : BadInput(file + ": key \"" + key + "\"" + (value.empty() ? "" : " = " + value) + ": " +
               problem),
      file_(file),
      key_(key) {}

const char* to_string(LlamaArchitecture architecture) {
  switch (architecture) {
    case LlamaArchitecture::kMistral:
      return "MistralForCausalLM";
    case LlamaArchitecture::kQwen2:
      return "Qwen2ForCausalLM";
    case LlamaArchitecture::kQwen2Moe:
      return "Qwen2MoeForCausalLM";
    case LlamaArchitecture::kQwen3Moe:
      return "Qwen3MoeForCausalLM";
    case LlamaArchitecture::kMixtral:
      return "MixtralForCausalLM";
    case LlamaArchitecture::kLlama:
      break;
  }
  return "LlamaForCausalLM";
}

const char* model_type_of(LlamaArchitecture architecture) {
  switch (architecture) {
    case LlamaArchitecture::kMistral:
      return "mistral";
    case LlamaArchitecture::kQwen2:
      return "qwen2";
    case LlamaArchitecture::kQwen2Moe:
      return "qwen2_moe";
    case LlamaArchitecture::kQwen3Moe:
      return "qwen3_moe";
    case LlamaArchitecture::kMixtral:
      return "mixtral";
    case LlamaArchitecture::kLlama:
      break;
  }
  return "llama";
}

bool is_moe(LlamaArchitecture architecture) {
  return architecture == LlamaArchitecture::kQwen2Moe ||
         architecture == LlamaArchitecture::kQwen3Moe ||
         architecture == LlamaArchitecture::kMixtral;
}

namespace {

// Weights of layer l's MLP: all of them, or (active) those one token passes through.
int64_t mlp_weights(const LlamaConfig& c, int64_t l, bool active) {
  const int64_t h = c.hidden_size;
  if (!c.is_moe_layer(l)) return 3 * h * c.intermediate_size;
  const int64_t experts = active ? c.num_experts_per_tok : c.num_experts;
  int64_t weights = h * c.num_experts + experts * 3 * h * c.expert_intermediate_size;
  if (c.shared_expert_intermediate_size > 0)
    weights += 3 * h * c.shared_expert_intermediate_size + h;
  return weights;
}

}  // namespace

int64_t LlamaConfig::parameter_count() const {
  const int64_t h = hidden_size, d = head_dim;
  const int64_t q = num_attention_heads * d, kv = num_key_value_heads * d;
  int64_t attention = h * q + 2 * h * kv + q * h;
  if (qkv_bias) attention += q + 2 * kv;
  if (output_bias) attention += h;
  if (qk_norm) attention += 2 * d;
  int64_t layers = 0;
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    int64_t mlp = mlp_weights(*this, l, false);
    if (mlp_bias) mlp += 2 * intermediate_size + h;
    layers += attention + mlp + 2 * h;
  }
  const int64_t table = vocab_size * h;
  return table + layers + h + (tie_word_embeddings ? 0 : table);
}

double LlamaConfig::training_flops_per_token(int64_t seq_len) const {
  const double h = static_cast<double>(hidden_size), d = static_cast<double>(head_dim);
  const double q = static_cast<double>(num_attention_heads) * d;
  const double kv = static_cast<double>(num_key_value_heads) * d;
  double layers = 0;  // a mixture of experts counts the experts a token passes through
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    layers += h * q + 2 * h * kv + q * h + static_cast<double>(mlp_weights(*this, l, true));
  }
  const double matrices = layers + static_cast<double>(vocab_size) * h;
  return 6 * matrices +
         12 * static_cast<double>(num_hidden_layers) * q * static_cast<double>(seq_len);
}

void check_llama_config(const LlamaConfig& c, const std::string& file) {
  auto fail = [&](const std::string& key, int64_t value, const std::string& problem) {
    throw ModelConfigError(file, key, std::to_string(value), problem);
  };
  if (c.vocab_size < 1) fail("vocab_size", c.vocab_size, "must be at least 1");
  if (c.hidden_size < 1) fail("hidden_size", c.hidden_size, "must be at least 1");
  if (c.intermediate_size < 1) fail("intermediate_size", c.intermediate_size, "must be at least 1");
  if (c.num_hidden_layers < 1 || c.num_hidden_layers > kMostLayers) {
    fail("num_hidden_layers", c.num_hidden_layers,
         "must be between 1 and " + std::to_string(kMostLayers));
  }
  if (c.num_attention_heads < 1) {
    fail("num_attention_heads", c.num_attention_heads, "must be at least 1");
  }
  if (c.num_key_value_heads < 1 || c.num_attention_heads % c.num_key_value_heads != 0) {
    fail("num_key_value_heads", c.num_key_value_heads,
         "must divide num_attention_heads (" + std::to_string(c.num_attention_heads) +
             "): each group of query heads shares one key/value head");
  }
  if (c.head_dim < 2 || c.head_dim % 2 != 0) {
    fail("head_dim", c.head_dim, "must be even and at least 2 (RoPE rotates pairs)");
  }
  if (!(c.rms_norm_eps > 0)) {
    throw ModelConfigError(file, "rms_norm_eps", std::to_string(c.rms_norm_eps),
                           "must be positive");
  }
  if (static_cast<int64_t>(c.sliding_window.size()) != c.num_hidden_layers) {
    fail("sliding_window", static_cast<int64_t>(c.sliding_window.size()),
         "needs one entry per layer (0: full attention)");
  }
  if (is_moe(c.architecture)) {
    if (c.num_experts < 1) fail("num_experts", c.num_experts, "must be at least 1");
    if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.num_experts) {
      fail("num_experts_per_tok", c.num_experts_per_tok,
           "must be between 1 and num_experts (" + std::to_string(c.num_experts) +
               "): each token goes to that many of the experts");
    }
    if (c.expert_intermediate_size < 1) {
      fail(c.architecture == LlamaArchitecture::kMixtral ? "intermediate_size"
                                                         : "moe_intermediate_size",
           c.expert_intermediate_size, "must be at least 1");
    }
    if (static_cast<int64_t>(c.moe_layer.size()) != c.num_hidden_layers) {
      fail("mlp_only_layers", static_cast<int64_t>(c.moe_layer.size()),
           "needs one MoE/dense entry per layer");
    }
  }
}

LlamaConfig llama_config(int64_t vocab_size, int64_t hidden_size, int64_t intermediate_size,
                         int64_t layers, int64_t heads, int64_t kv_heads) {
  LlamaConfig c;
  c.vocab_size = vocab_size;
  c.hidden_size = hidden_size;
  c.intermediate_size = intermediate_size;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = heads > 0 ? hidden_size / heads : 0;
  c.sliding_window.assign(static_cast<size_t>(std::max<int64_t>(layers, 0)), 0);
  check_llama_config(c);
  return c;
}

LlamaConfig parse_llama_config(const nlohmann::json& json, const std::string& file) {
  if (!json.is_object()) {
    throw ModelConfigError(file, "", "", "the config is not a JSON object");
  }
  const Reader r(json, file);
  LlamaConfig c;
  c.source = json;
  c.architecture = read_architecture(r);
  const bool llama = c.architecture == LlamaArchitecture::kLlama;
  c.vocab_size = r.count("vocab_size", 0, true);
  c.hidden_size = r.count("hidden_size", 0, true);
  c.intermediate_size = r.count("intermediate_size", 0, true);
  c.num_hidden_layers = r.count("num_hidden_layers", 0, true);
  c.num_attention_heads = r.count("num_attention_heads", 0, true);
  if (c.num_attention_heads < 1) r.fail("num_attention_heads", "must be at least 1");
  const LlamaArchitecture a = c.architecture;
  const int64_t default_kv = a == LlamaArchitecture::kMistral || a == LlamaArchitecture::kMixtral
                                 ? 8
                             : a == LlamaArchitecture::kQwen2    ? 32
                             : a == LlamaArchitecture::kQwen2Moe ? 16
                             : a == LlamaArchitecture::kQwen3Moe ? 4
                                                                 : c.num_attention_heads;
  c.num_key_value_heads = r.count("num_key_value_heads", default_kv);
  c.head_dim = r.count("head_dim", c.hidden_size / c.num_attention_heads);
  c.max_position_embeddings =
      r.count("max_position_embeddings",
              a == LlamaArchitecture::kMistral || a == LlamaArchitecture::kMixtral ? 131072
              : a == LlamaArchitecture::kLlama                                     ? 2048
                                                                                   : 32768);
  c.rms_norm_eps = r.number("rms_norm_eps", a == LlamaArchitecture::kMixtral ? 1e-5 : 1e-6);
  const std::string activation = r.text("hidden_act", "silu");
  if (activation != "silu") {
    r.fail("hidden_act", "must be silu: the Llama family's MLP is SwiGLU");
  }
  if (r.number("attention_dropout", 0.0) != 0.0) {
    r.fail("attention_dropout", "must be 0; pipetrain's Llama port has no attention dropout");
  }
  if (llama || a == LlamaArchitecture::kQwen3Moe) {
    c.qkv_bias = c.output_bias = r.flag("attention_bias", false);
    if (llama) c.mlp_bias = r.flag("mlp_bias", false);
  } else if (a == LlamaArchitecture::kQwen2Moe) {
    c.qkv_bias = r.flag("qkv_bias", true);
  } else {
    c.qkv_bias = a == LlamaArchitecture::kQwen2;
  }
  c.qk_norm = a == LlamaArchitecture::kQwen3Moe;
  if (is_moe(a)) read_experts(r, c);
  c.tie_word_embeddings = r.flag("tie_word_embeddings", false);
  read_rope(r, c);
  read_sliding_window(r, c);
  if (r.has("use_mrope") && r.flag("use_mrope", false)) {
    r.fail("use_mrope", "multimodal RoPE is not supported");
  }
  c.initializer_range = r.number("initializer_range", 0.02);
  c.pad_token_id = r.has("pad_token_id") ? r.count("pad_token_id", 0) : -1;
  if (c.pad_token_id >= c.vocab_size) {
    r.fail("pad_token_id", "is not below vocab_size (" + std::to_string(c.vocab_size) + ")");
  }
  const std::string dtype_key = json.contains("dtype") ? "dtype" : "torch_dtype";
  c.dtype = r.text(dtype_key, "float32");
  c.eos_token_ids = read_eos(r);
  // transformers reads these only for some architectures; where it ignores them, so do we.
  std::set<std::string> inert_here;
  if (!llama) inert_here = {"attention_bias", "mlp_bias"};
  if (a == LlamaArchitecture::kQwen3Moe) inert_here.erase("attention_bias");
  if (a == LlamaArchitecture::kQwen2 || a == LlamaArchitecture::kQwen2Moe) {
    inert_here.insert({"use_sliding_window", "max_window_layers", "layer_types", "use_mrope"});
  }
  if (a == LlamaArchitecture::kQwen3Moe) inert_here.insert({"use_sliding_window", "layer_types"});
  if (a == LlamaArchitecture::kMistral || a == LlamaArchitecture::kMixtral ||
      a == LlamaArchitecture::kQwen3Moe) {
    inert_here.insert("sliding_window");
  }
  inert_here.insert("partial_rotary_factor");
  r.check_all_used(inert_here);
  check_llama_config(c, file);
  return c;
}

LlamaConfig read_llama_config(const std::string& path) {
  std::string file = path;
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    file = (std::filesystem::path(path) / "config.json").string();
  }
  const std::string text = read_file(file);  // FileError naming it
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ModelConfigError(file, "", "", std::string("not JSON: ") + e.what());
  }
  return parse_llama_config(json, file);
}

void check_sequence_length(const LlamaConfig& config, int64_t seq_len, const std::string& file) {
  for (size_t l = 0; l < config.sliding_window.size(); ++l) {
    const int64_t window = config.sliding_window[l];
    if (window > 0 && window < seq_len) {
      throw ModelConfigError(
          file, "sliding_window", std::to_string(window),
          "layer " + std::to_string(l) + " attends to a window shorter than the sequence length " +
              std::to_string(seq_len) +
              "; pipetrain runs full causal attention, which equals it only when the window is not "
              "shorter: use --seq-len " +
              std::to_string(window) + " or less");
    }
  }
}

nlohmann::json llama_config_json(const LlamaConfig& c, const std::string& dtype) {
  if (!c.source.empty()) {
    nlohmann::json json = c.source;
    json["dtype"] = dtype;
    if (json.contains("torch_dtype")) json["torch_dtype"] = dtype;
    return json;
  }
  nlohmann::json json = {{"architectures", {to_string(c.architecture)}},
                         {"model_type", model_type_of(c.architecture)},
                         {"vocab_size", c.vocab_size},
                         {"hidden_size", c.hidden_size},
                         {"intermediate_size", c.intermediate_size},
                         {"num_hidden_layers", c.num_hidden_layers},
                         {"num_attention_heads", c.num_attention_heads},
                         {"num_key_value_heads", c.num_key_value_heads},
                         {"head_dim", c.head_dim},
                         {"hidden_act", "silu"},
                         {"max_position_embeddings", c.max_position_embeddings},
                         {"rms_norm_eps", c.rms_norm_eps},
                         {"initializer_range", c.initializer_range},
                         {"attention_dropout", 0.0},
                         {"tie_word_embeddings", c.tie_word_embeddings},
                         {"use_cache", true},
                         {"dtype", dtype}};
  nlohmann::json rope = {{"rope_type", c.rope.type}, {"rope_theta", c.rope_theta}};
  if (c.rope.type == "linear" || c.rope.type == "llama3") rope["factor"] = c.rope.factor;
  if (c.rope.type == "llama3") {
    rope["low_freq_factor"] = c.rope.low_freq_factor;
    rope["high_freq_factor"] = c.rope.high_freq_factor;
    rope["original_max_position_embeddings"] = c.rope.original_max_position_embeddings;
  }
  json["rope_parameters"] = rope;
  const int64_t window = c.sliding_window.empty()
                             ? 0
                             : *std::max_element(c.sliding_window.begin(), c.sliding_window.end());
  switch (c.architecture) {
    case LlamaArchitecture::kLlama:
      json["attention_bias"] = c.qkv_bias;
      json["mlp_bias"] = c.mlp_bias;
      break;
    case LlamaArchitecture::kMistral:
      json["sliding_window"] = window > 0 ? nlohmann::json(window) : nlohmann::json();
      break;
    case LlamaArchitecture::kQwen2: {
      json["use_sliding_window"] = window > 0;
      json["sliding_window"] = window > 0 ? nlohmann::json(window) : nlohmann::json();
      nlohmann::json types = nlohmann::json::array();
      for (int64_t w : c.sliding_window) {
        types.push_back(w > 0 ? "sliding_attention" : "full_attention");
      }
      json["layer_types"] = types;
      if (c.head_dim == c.hidden_size / c.num_attention_heads) json.erase("head_dim");
      break;
    }
    case LlamaArchitecture::kQwen2Moe:
    case LlamaArchitecture::kQwen3Moe:
    case LlamaArchitecture::kMixtral: {
      json["num_local_experts"] = c.num_experts;
      json["num_experts_per_tok"] = c.num_experts_per_tok;
      json["router_aux_loss_coef"] = c.router_aux_loss_coef;
      json["output_router_logits"] = c.aux_loss;
      json["sliding_window"] = window > 0 ? nlohmann::json(window) : nlohmann::json();
      if (c.architecture == LlamaArchitecture::kMixtral) break;
      json["moe_intermediate_size"] = c.expert_intermediate_size;
      json["norm_topk_prob"] = c.norm_topk_prob;
      json["decoder_sparse_step"] = 1;
      nlohmann::json dense = nlohmann::json::array();
      for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        if (!c.is_moe_layer(l)) dense.push_back(l);
      }
      json["mlp_only_layers"] = dense;
      json["use_sliding_window"] = window > 0;
      if (c.architecture == LlamaArchitecture::kQwen2Moe) {
        json["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
        json["qkv_bias"] = c.qkv_bias;
      } else {
        json["attention_bias"] = c.qkv_bias;
      }
      break;
    }
  }
  if (c.pad_token_id >= 0) json["pad_token_id"] = c.pad_token_id;
  if (!c.eos_token_ids.empty()) {
    json["eos_token_id"] = c.eos_token_ids.size() == 1 ? nlohmann::json(c.eos_token_ids[0])
                                                       : nlohmann::json(c.eos_token_ids);
  }
  return json;
}

}  // namespace pipetrain::models
