// LlamaConfig: the shape of a Llama-family decoder (LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM) as Hugging Face's config.json describes it, read with the defaults
// transformers gives each architecture, and written back.
//
// What is read, per key (every other key that would change the computation is refused):
//   architectures / model_type    which of the six; they must agree
//   vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads   required
//   num_key_value_heads           grouped-query attention; default per architecture (Llama: the
//                                 heads, Mistral 8, Qwen2 32), must divide the heads
//   head_dim                      default hidden_size / heads
//   rms_norm_eps hidden_act       eps default 1e-6; the activation must be silu (SwiGLU)
//   attention_bias mlp_bias       Llama's biases (q, k, v, o; gate, up, down); Qwen2 always has
//                                 q/k/v biases and none elsewhere; Mistral none
//   tie_word_embeddings           the LM head is the embedding's table (default false)
//   rope_theta + rope_scaling     the form of published checkpoints, or
//   rope_parameters               {rope_type, rope_theta, ...}, the form transformers 5 writes;
//                                 rope_scaling wins where both are given, as in transformers.
//                                 Types: default, linear (factor), llama3 (factor,
//                                 low_freq_factor, high_freq_factor,
//                                 original_max_position_embeddings)
//   sliding_window                Mistral: every layer; Qwen2: with use_sliding_window, the layers
//                                 layer_types (or max_window_layers) marks. Supported where the
//                                 window is not shorter than the sequence (check_sequence_length)
//   attention_dropout             must be 0
//   pad_token_id                  that row of the embedding gets no gradient (nn.Embedding's
//                                 padding_idx, as transformers builds it) and starts at 0
//   dtype / torch_dtype           the stored weights' dtype (kept, written back)
//   Mixtures of experts (Qwen2-MoE, Qwen3-MoE, Mixtral; transformers' defaults):
//   num_experts (or num_local_experts), num_experts_per_tok, moe_intermediate_size,
//   shared_expert_intermediate_size (Qwen2-MoE), norm_topk_prob, decoder_sparse_step,
//   mlp_only_layers, router_aux_loss_coef, output_router_logits (the load-balancing term, per
//   layer and micro-batch: LlamaMoe); Mixtral's router_jitter_noise must be 0. Qwen3-MoE's
//   attention normalizes each query and key head (q_norm, k_norm) and has attention_bias; Qwen2-MoE
//   has qkv_bias (default true).
// Keys that change nothing pipetrain computes (token ids, generation settings, bookkeeping) are
// accepted and written back as they were. An unknown key, a value of the wrong type or out of
// range, or a supported key with an unsupported value is a ModelConfigError naming the file, the
// key and its value (CLI exit 2).
//
// Torch-free (pipetrain::schedule's library; fuzzed by fuzz/llama_config_fuzzer.cpp).
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipetrain/base/error.h"

namespace pipetrain::models {

// A config.json that pipetrain cannot run: names the file, the key and the value.
class ModelConfigError : public BadInput {
 public:
  ModelConfigError(const std::string& file, const std::string& key, const std::string& value,
                   const std::string& problem);
  const std::string& file() const { return file_; }
  const std::string& key() const { return key_; }

 private:
  std::string file_, key_;
};

// The three dense families and three mixtures of experts (the MoE keys below).
enum class LlamaArchitecture { kLlama, kMistral, kQwen2, kQwen2Moe, kQwen3Moe, kMixtral };

// "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen2MoeForCausalLM",
// "Qwen3MoeForCausalLM", "MixtralForCausalLM".
const char* to_string(LlamaArchitecture architecture);
// "llama", "mistral", "qwen2", "qwen2_moe", "qwen3_moe", "mixtral".
const char* model_type_of(LlamaArchitecture architecture);
// A mixture of experts: Qwen2-MoE, Qwen3-MoE or Mixtral.
bool is_moe(LlamaArchitecture architecture);

struct RopeScaling {
  std::string type = "default";  // default | linear | llama3
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
};

struct LlamaConfig {
  LlamaArchitecture architecture = LlamaArchitecture::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope;
  bool qkv_bias = false;     // biases of q_proj, k_proj, v_proj
  bool output_bias = false;  // bias of o_proj
  bool mlp_bias = false;     // biases of gate_proj, up_proj, down_proj
  bool tie_word_embeddings = false;
  // Per decoder layer: its sliding window, 0 for full causal attention.
  std::vector<int64_t> sliding_window;
  int64_t pad_token_id = -1;        // -1: none
  double initializer_range = 0.02;  // std of a random init's normal draws
  std::string dtype = "float32";    // of the stored weights: float32, bfloat16, float16
  std::vector<int64_t> eos_token_ids;
  // Qwen3's attention: an RMSNorm over head_dim of each query and key head (q_norm, k_norm),
  // before RoPE.
  bool qk_norm = false;
  // Mixtures of experts (is_moe): each MoE layer's MLP is a router (a linear to num_experts
  // logits, softmax in float32, the top num_experts_per_tok, renormalized where norm_topk_prob)
  // and num_experts SwiGLU experts of expert_intermediate_size, each token's output the weighted
  // sum of its experts'; Qwen2-MoE adds a shared expert of shared_expert_intermediate_size scaled
  // by sigmoid(shared_expert_gate(x)). moe_layer[l]: layer l has the MoE block (else a dense MLP
  // of intermediate_size): not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0.
  int64_t num_experts = 0;  // 0: dense
  int64_t num_experts_per_tok = 0;
  int64_t expert_intermediate_size = 0;  // moe_intermediate_size (Mixtral: intermediate_size)
  int64_t shared_expert_intermediate_size = 0;  // Qwen2-MoE (0: none)
  bool norm_topk_prob = false;                  // Mixtral: always
  std::vector<char> moe_layer;                  // per layer
  double router_aux_loss_coef = 0.001;
  // output_router_logits: training adds router_aux_loss_coef x each MoE layer's load-balancing
  // term per micro-batch (LlamaMoe; transformers adds one term over all layers and the batch).
  bool aux_loss = false;
  // Whether layer l has the MoE block.
  bool is_moe_layer(int64_t l) const {
    return l >= 0 && l < static_cast<int64_t>(moe_layer.size()) &&
           moe_layer[static_cast<size_t>(l)] != 0;
  }
  // The config.json as read ({} for a config made in code): written back with the dtype updated.
  nlohmann::json source = nlohmann::json::object();

  // Entries of the pipeline's Sequential: embedding, the decoder layers, final norm, LM head.
  int64_t entries() const { return num_hidden_layers + 3; }
  // Parameters of the whole model (a tied table counted once).
  int64_t parameter_count() const;
  // The model FLOPs of training on one token of a sequence of `seq_len`, forward and backward, as
  // MFU counts them (PaLM's appendix B): 6 per weight a token passes through (every matrix of the
  // decoder layers and the LM head; not the embedding lookup, norms or biases) plus the
  // attention's 12 x layers x (query width) x seq_len. Recomputation is not counted.
  double training_flops_per_token(int64_t seq_len) const;
};

// A config made in code rather than read: a LlamaForCausalLM of these sizes, the rest as
// transformers defaults it (head_dim = hidden / heads, no biases, default RoPE of theta 10000,
// an untied head, no sliding window). Throws ModelConfigError where check_llama_config does.
LlamaConfig llama_config(int64_t vocab_size, int64_t hidden_size, int64_t intermediate_size,
                         int64_t layers, int64_t heads, int64_t kv_heads);

// Reads `json` (the content of `file`, named in errors) with the rules above.
LlamaConfig parse_llama_config(const nlohmann::json& json, const std::string& file = "config.json");
// Reads `path`: a config.json, or a directory holding one. Throws FileError when it cannot be
// read, ModelConfigError when it is not JSON or not a supported config.
LlamaConfig read_llama_config(const std::string& path);

// Checks the shape (counts positive, heads divisible, head_dim even) of a config made in code;
// parse_llama_config applies the same checks. Throws ModelConfigError.
void check_llama_config(const LlamaConfig& config, const std::string& file = "config");

// Throws ModelConfigError naming sliding_window when a layer's window is shorter than `seq_len`
// (pipetrain runs full causal attention, which equals sliding-window attention only then).
void check_sequence_length(const LlamaConfig& config, int64_t seq_len,
                           const std::string& file = "config.json");

// The config.json to write beside weights stored as `dtype` ("float32", "bfloat16", "float16"):
// the source with "dtype" (and "torch_dtype", where the source has it) set, or, for a config
// made in code, every key transformers 5 writes for it.
nlohmann::json llama_config_json(const LlamaConfig& config, const std::string& dtype);

}  // namespace pipetrain::models
