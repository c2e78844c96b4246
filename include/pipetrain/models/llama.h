// The Llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM) as a pipeline of
// entries, computing what Hugging Face transformers computes for the same config.json
// (models/llama_config.h) and weights.
//
//   tokens int64 [B,T]
//     0      LlamaEmbedding        table [V,H]                                  -> x [B,T,H]
//     1..L   LlamaDecoderLayer     x += o_proj(attention(rope(q), rope(k), v))  -> [B,T,H]
//                                  of input_layernorm(x); x += down_proj(silu(gate_proj(h)) *
//                                  up_proj(h)), h = post_attention_layernorm(x)
//     L+1    RmsNorm               the final norm                               -> [B,T,H]
//     L+2    LlamaHead             logits = x W^T, W [V,H]                      -> [B,T,V]
//   loss: causal_lm_loss, mean cross-entropy over the counted target ids
//
// Packed documents: with a layout installed (data/sequence_layout.h, by document), the attention
// restarts RoPE positions at every document and never crosses one (models/document_attention.h),
// as transformers computes each document run as its own sequence.
//
// Attention is at::scaled_dot_product_attention, causal, scale head_dim^-1/2, with grouped-query
// attention (num_key_value_heads < heads: each key/value head serves heads/kv_heads query heads).
// RoPE is computed as transformers computes it: inv_freq = 1 / theta^(2i/d) in float32 (scaled
// for linear and llama3), angles = position * inv_freq, cos and sin of [angles, angles] in the
// dtype of the layer's input, q*cos + rotate_half(q)*sin. RMSNorm normalizes in float32 and
// multiplies its weight in the input's dtype. Every boundary between entries carries one tensor
// [B,T,H] (the first carries the int64 tokens).
//
// Parameter names: the entries register their tensors under Hugging Face's names below the
// entry index ("3.self_attn.q_proj.weight" is "model.layers.2.self_attn.q_proj.weight");
// hf_name_of and entry_name_of convert. With tie_word_embeddings the head's weight IS the
// embedding's table (one tensor, two names: LlamaModel::tied_parameters), as the GPT example's.
//
// Materializing part of a model: make_llama builds every entry, but only the entries listed in
// LlamaBuildOptions::entries get memory; the others hold their parameters on the meta device
// (shapes and names only). A rank of a multi-process run materializes its own stages' entries and
// loads only their tensors, so a model larger than one process's memory still builds on every
// rank. A random init draws each entry from its own stream (seed, entry), so any subset gets the
// values the whole model would have.
//
// Tensor parallelism (LlamaBuildOptions::tensor_parallel, parallel/tensor_parallel.h): each rank
// of the group holds 1/tp of the heads (q, k, v column-parallel by head, o_proj row-parallel), of
// the MLP width (gate/up column-parallel, down row-parallel) and of the vocabulary (the embedding
// and the head by rows; a tied head shares the embedding's slice); norms are replicated. A
// mixture's MoE layers are not split (Megatron's expert tensor-parallel size 1): every tp rank
// holds its router and experts whole and runs them on the tokens it holds (all of them, or under
// sequence parallelism its slice of the sequence, whose router and expert gradients are then
// summed over the group as the norms' are). With fewer key/value heads than ranks (tp a
// multiple of them) each key/value head is replicated on the tp / kv_heads consecutive ranks
// whose query heads use it, as Megatron does, and their
// gradients are summed over those ranks (parallel::sum_over_replicas). The head then returns this
// rank's slice of the logits [B,T,V/tp], and the loss is vocab_parallel_causal_lm_loss.
// Parameters keep their names with their local shapes; tensor_parallel_split says which dimension
// of which tensor is cut and over how many ranks a slice is shared.
//
// Thread-safety: a built model is used by one thread at a time per entry (the RoPE tables are
// cached per entry under a mutex).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "pipetrain/data/batch.h"
#include "pipetrain/io/safetensors.h"
#include "pipetrain/models/llama_config.h"
#include "pipetrain/parallel/expert_parallel.h"
#include "pipetrain/parallel/ring_attention.h"
#include "pipetrain/parallel/tensor_parallel.h"
#include "pipetrain/stage/autocast_parameters.h"

namespace pipetrain::models {

// RMSNorm: weight * (x / sqrt(mean(x^2) + eps)), normalized in float32. [.., H] -> [.., H].
// `summed_over` (a tensor-parallel group): each rank normalizes only its own heads with the whole
// weight (Qwen3's q_norm / k_norm under tensor parallelism), so the weight's gradient is summed
// over the group in the backward (parallel::sum_over_replicas).
class RmsNormImpl : public torch::nn::Cloneable<RmsNormImpl> {
 public:
  RmsNormImpl(int64_t size, double eps, torch::TensorOptions options = {},
              parallel::TensorParallel summed_over = {});
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

  int64_t size;
  double eps;
  torch::TensorOptions options;
  parallel::TensorParallel summed_over;
  torch::Tensor weight;  // [H]
};
TORCH_MODULE(RmsNorm);

// y = x W^T (+ b), as torch::nn::Linear, with its tensors made on options' device (meta for a
// placeholder) and left uninitialized (make_llama fills them).
class LlamaLinearImpl : public torch::nn::Cloneable<LlamaLinearImpl> {
 public:
  LlamaLinearImpl(int64_t in, int64_t out, bool bias, torch::TensorOptions options = {});
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

  int64_t in, out;
  bool has_bias;
  torch::TensorOptions options;
  torch::Tensor weight, bias;  // [out, in], [out] (undefined without bias)
};
TORCH_MODULE(LlamaLinear);

// The rotary tables of one attention: inv_freq from the config, and cos/sin [T, head_dim] per
// (T, device, dtype), cached.
class RotaryEmbedding {
 public:
  explicit RotaryEmbedding(const LlamaConfig& config);
  RotaryEmbedding(const RotaryEmbedding& other);
  RotaryEmbedding& operator=(const RotaryEmbedding&) = delete;
  // (cos, sin) for positions 0..t-1, each [t, head_dim], in `dtype` on `device`.
  std::pair<torch::Tensor, torch::Tensor> tables(int64_t t, const torch::Device& device,
                                                 torch::Dtype dtype) const;
  const torch::Tensor& inv_freq() const { return inv_freq_; }

 private:
  torch::Tensor inv_freq_;  // float32 [head_dim / 2], CPU
  mutable std::mutex mutex_;
  mutable std::map<std::string, std::pair<torch::Tensor, torch::Tensor>> cache_;  // by mutex_
};

// Causal self-attention with grouped-query heads and RoPE. [B,T,H] -> [B,T,H].
class LlamaAttentionImpl : public torch::nn::Cloneable<LlamaAttentionImpl>,
                           public AutocastCastParameters {
 public:
  LlamaAttentionImpl(std::shared_ptr<const LlamaConfig> config, torch::TensorOptions options = {},
                     parallel::TensorParallel tp = {}, parallel::ContextParallel cp = {});
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

  std::shared_ptr<const LlamaConfig> config;
  torch::TensorOptions options;
  // This rank's heads: heads / tp query, kv_heads / tp key/value (one, shared with
  // kv_replicas() - 1 neighbours, when kv_heads < tp).
  parallel::TensorParallel tp;
  // Context parallelism (parallel/ring_attention.h): this member's tokens of each sequence,
  // attended over the group's.
  parallel::ContextParallel cp;
  int kv_replicas() const;
  LlamaLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RmsNorm q_norm{nullptr}, k_norm{nullptr};  // LlamaConfig::qk_norm (null otherwise)
  // The projections' weights and the biases read inside a linear (o_proj's is added after the
  // tp sum, in float32, when tp splits it).
  std::vector<torch::Tensor> autocast_cast_parameters() const override;

 private:
  std::shared_ptr<RotaryEmbedding> rope_;
};
TORCH_MODULE(LlamaAttention);

// SwiGLU: down_proj(silu(gate_proj(x)) * up_proj(x)). [B,T,H] -> [B,T,H].
// `width`: the intermediate size (-1: the config's intermediate_size; an expert's or the shared
// expert's in a mixture). `mixtral_names`: registered as Mixtral's experts name them (w1 the
// gate, w3 the up, w2 the down projection).
class LlamaMlpImpl : public torch::nn::Cloneable<LlamaMlpImpl>, public AutocastCastParameters {
 public:
  LlamaMlpImpl(std::shared_ptr<const LlamaConfig> config, torch::TensorOptions options = {},
               parallel::TensorParallel tp = {}, int64_t width = -1, bool mixtral_names = false);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

  std::shared_ptr<const LlamaConfig> config;
  torch::TensorOptions options;
  parallel::TensorParallel tp;  // this rank's intermediate_size / tp
  int64_t width;
  bool mixtral_names;
  LlamaLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  // As the attention's: every weight, and the biases a linear reads.
  std::vector<torch::Tensor> autocast_cast_parameters() const override;
};
TORCH_MODULE(LlamaMlp);

// A mixture of experts' MLP (LlamaConfig's MoE keys), as transformers computes it. [B,T,H] ->
// [B,T,H]. Per token x: logits = gate(x) [E]; p = softmax(logits) in float32; the top
// num_experts_per_tok of p (renormalized to sum 1 where norm_topk_prob), in the logits' dtype
// (Mixtral: float32); y = sum over them of p_e * expert_e(x), plus (Qwen2-MoE)
// sigmoid(shared_expert_gate(x)) * shared_expert(x). Dropless: every token reaches its experts.
// The experts compute grouped: the tokens are sorted by expert once, and each expert runs one
// SwiGLU over its tokens (a matrix product per expert, none per token); their outputs are added
// into y expert by expert in ascending order, as transformers adds them.
// Registered as transformers names them: gate, experts.{e}.(gate|up|down)_proj (Mixtral:
// experts.{e}.w1|w2|w3), shared_expert, shared_expert_gate.
// Expert parallelism (`ep` split, parallel/expert_parallel.h): this rank holds experts
// [ep.first(E), +ep.count(E)) only, under their global numbers; every token row goes to the rank
// of each of its experts in one all-to-all of rows over the group (sorted by expert, so each
// member receives its experts' rows grouped by sender), every local expert runs once over all the
// rows it received, and a second all-to-all brings the outputs back, where they are weighted and
// added as without it. The router, the shared expert and the load-balancing term stay local.
// With LlamaConfig::aux_loss, a training forward attaches router_aux_loss_coef x this layer's
// load_balancing_loss on these tokens to its output (stage/auxiliary_loss.h): each layer and each
// micro-batch adds its own term, weighted by the micro-batch's share of the loss, as Megatron
// adds them. transformers computes one term over every layer's and the whole batch's router
// logits at once, which a pipeline could reproduce only by waiting for every stage's forwards:
// with one layer and one micro-batch the two are the same term.
class LlamaMoeImpl : public torch::nn::Cloneable<LlamaMoeImpl>, public AutocastCastParameters {
 public:
  // `layer`: its decoder layer's index (routing_recorder's numbering).
  LlamaMoeImpl(std::shared_ptr<const LlamaConfig> config, torch::TensorOptions options = {},
               int64_t layer = 0, parallel::ExpertParallel ep = {});
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);
  // The router's choice for tokens x [N,H]: (weights [N,k], experts int64 [N,k]) and the
  // softmax of its logits in float32 [N,E] (what the load-balancing term reads).
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> route(const torch::Tensor& x);

  std::shared_ptr<const LlamaConfig> config;
  torch::TensorOptions options;
  int64_t layer = 0;
  parallel::ExpertParallel ep;
  LlamaLinear gate{nullptr};               // [E, H]
  torch::nn::ModuleDict experts{nullptr};  // this rank's, keyed by their global number
  // Expert e's MLP. REQUIRES: this rank holds it.
  LlamaMlpImpl& expert(int64_t e) const;
  LlamaMlp shared_expert{nullptr};          // Qwen2-MoE (null otherwise)
  LlamaLinear shared_expert_gate{nullptr};  // [1, H]
  std::vector<torch::Tensor> autocast_cast_parameters() const override;

 private:
  // y [N,H] of tokens `flat` [N,H] routed to `chosen` [N,k] with `weights`, the pairs sorted by
  // expert (`order`, `counts` per expert): locally, or over the expert-parallel group.
  torch::Tensor run_experts(const torch::Tensor& flat, const torch::Tensor& weights,
                            const torch::Tensor& order, const torch::Tensor& counts);
  torch::Tensor run_experts_parallel(const torch::Tensor& flat, const torch::Tensor& weights,
                                     const torch::Tensor& order, const torch::Tensor& counts);
};
TORCH_MODULE(LlamaMoe);

// transformers' load_balancing_loss_func for one layer's router logits [N, E] (no attention
// mask): E x sum over experts of (the fraction of the N x top_k choices that went to the expert,
// over N) x (the mean over tokens of its softmax probability). The choices: the top_k of the
// softmax (float32); the probabilities carry the gradient. A float32 scalar.
torch::Tensor load_balancing_loss(const torch::Tensor& router_logits, int64_t top_k);
// The same from the softmax already taken and the choices already made (`chosen` [N, k]).
torch::Tensor load_balancing_loss_of(const torch::Tensor& probabilities,
                                     const torch::Tensor& chosen);

// One decoder layer, pre-norm. [B,T,H] -> [B,T,H]. Its MLP is `mlp`, or in a mixture's MoE layer
// `moe` (registered as "mlp", Mixtral's as "block_sparse_moe").
class LlamaDecoderLayerImpl : public torch::nn::Cloneable<LlamaDecoderLayerImpl> {
 public:
  LlamaDecoderLayerImpl(std::shared_ptr<const LlamaConfig> config,
                        torch::TensorOptions options = {}, parallel::TensorParallel tp = {},
                        int64_t layer = 0, parallel::ExpertParallel ep = {},
                        parallel::ContextParallel cp = {});
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

  std::shared_ptr<const LlamaConfig> config;
  torch::TensorOptions options;
  parallel::TensorParallel tp;
  parallel::ExpertParallel ep;
  parallel::ContextParallel cp;
  RmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  LlamaMlp mlp{nullptr};
  LlamaMoe moe{nullptr};
  int64_t layer = 0;  // its index among the decoder layers
};
TORCH_MODULE(LlamaDecoderLayer);

// Token ids int64 [B,T] -> [B,T,H]; ids at pad_token_id get no gradient, as nn.Embedding's
// padding_idx. This layer and LlamaHead (without tensor parallelism) add their weight gradient
// into .grad() themselves where the backward's caller allows it (stage/in_place_gradients.h: a
// Stage does for the weights whose gradient it only accumulates), with torch's bits.
class LlamaEmbeddingImpl : public torch::nn::Cloneable<LlamaEmbeddingImpl> {
 public:
  LlamaEmbeddingImpl(std::shared_ptr<const LlamaConfig> config, torch::TensorOptions options = {},
                     parallel::TensorParallel tp = {});
  void reset() override;
  torch::Tensor forward(const torch::Tensor& tokens);

  std::shared_ptr<const LlamaConfig> config;
  torch::TensorOptions options;
  parallel::TensorParallel tp;
  torch::Tensor weight;  // [V/tp, H]: rows tp.rank() * V/tp ..
};
TORCH_MODULE(LlamaEmbedding);

// [B,T,H] -> logits [B,T,V] = x W^T. With `tied` defined, W is that tensor (the embedding's).
class LlamaHeadImpl : public torch::nn::Cloneable<LlamaHeadImpl>, public AutocastCastParameters {
 public:
  LlamaHeadImpl(std::shared_ptr<const LlamaConfig> config, torch::TensorOptions options = {},
                torch::Tensor tied = {}, parallel::TensorParallel tp = {});
  void reset() override;
  // A copy that owns its table. Cloneable's would register the tied table itself again (the
  // embedding's tensor, whose data it then replaced), so that copies made together, the auto
  // plan's concurrent calibration, shared one tensor and its gradient across threads. A cloned
  // Sequential's head is therefore untied from its embedding, with the same values.
  std::shared_ptr<torch::nn::Module> clone(
      const std::optional<torch::Device>& device = std::nullopt) const override;
  torch::Tensor forward(const torch::Tensor& x);  // [B,T,V/tp]: this rank's vocabulary slice

  std::shared_ptr<const LlamaConfig> config;
  torch::TensorOptions options;
  parallel::TensorParallel tp;
  torch::Tensor weight;  // [V/tp, H]
  std::vector<torch::Tensor> autocast_cast_parameters() const override { return {weight}; }

 private:
  torch::Tensor tied_;
};
TORCH_MODULE(LlamaHead);

struct LlamaBuildOptions {
  /// dtype of the parameters. Default float32 (bf16 training keeps float32 weights and runs the
  /// layers under autocast: stage/precision.h).
  TORCH_ARG(torch::Dtype, dtype) = torch::kFloat32;
  /// Seed of a random init (init_llama_random): entry e draws from mix_seed(seed, e).
  TORCH_ARG(uint64_t, seed) = 0;
  /// The entries to give memory; the others hold meta tensors. nullopt: every entry.
  TORCH_ARG(std::optional<std::vector<int64_t>>, entries) = std::nullopt;
  /// The tensor-parallel group this model's ranks form (none: every rank holds whole tensors).
  /// check_llama_tensor_parallel must accept the config at the group's size.
  TORCH_ARG(parallel::TensorParallel, tensor_parallel) = {};
  /// The expert-parallel group a mixture's experts are split over (parallel/expert_parallel.h;
  /// none: every rank holds every expert). check_expert_parallel must accept its size.
  TORCH_ARG(parallel::ExpertParallel, expert_parallel) = {};
  /// The context-parallel group each sequence's tokens are split over (parallel/ring_attention.h;
  /// none: every rank holds whole sequences). The model's input is then this member's tokens.
  TORCH_ARG(parallel::ContextParallel, context_parallel) = {};
};

struct LlamaModel {
  std::shared_ptr<const LlamaConfig> config;
  torch::nn::Sequential sequential;  // config->entries() entries
  // {"0.weight", "<L+2>.weight"} with tie_word_embeddings, else empty.
  std::vector<std::pair<std::string, std::string>> tied_parameters;
  std::vector<bool> materialized;            // per entry
  parallel::TensorParallel tensor_parallel;  // as built
  parallel::ExpertParallel expert_parallel;  // as built
};

// Throws BadInput naming the numbers when `tp` does not divide the attention heads, the
// vocabulary or the MLP width, or neither divides nor is a multiple of the key/value heads, and
// saying which tensor-parallel sizes would.
void check_llama_tensor_parallel(const LlamaConfig& config, int tp);

// How a rank of a tensor-parallel group of `tp` holds a parameter (Sequential name): its
// dimension cut ("3.self_attn.o_proj.weight" -> 1) and, for key/value projections with fewer
// key/value heads than tp, the tp / kv_heads ranks sharing each slice; nullopt for a whole tensor
// on every rank (norms, row-parallel biases).
std::optional<parallel::TensorSplit> tensor_parallel_split(const std::string& name,
                                                           const LlamaConfig& config, int tp);

// Of `named` (Sequential names, e.g. DistributedPipe::named_parameters()), the tensors every rank
// of a tensor-parallel group of `tp` holds whole, each once: under sequence parallelism their
// gradients are each rank's share, to be summed over the group after the backward
// (Distributed::allreduce_tensor_parallel_gradients). Qwen3's q_norm / k_norm are left out: their
// backward sums them over the group already (RmsNormImpl::summed_over).
// True for a whole tensor whose gradient the backward sums over the tensor-parallel group itself
// (Qwen3's q_norm / k_norm: RmsNormImpl::summed_over).
bool tensor_parallel_summed_in_backward(const std::string& name);

std::vector<torch::Tensor> tensor_parallel_whole_parameters(
    const std::vector<std::pair<std::string, torch::Tensor>>& named, const LlamaConfig& config,
    int tp);

// The model's entries, uninitialized (fill them with init_llama_random or load_llama_weights).
// Throws ModelConfigError for a config check_llama_config refuses.
LlamaModel make_llama(const LlamaConfig& config, const LlamaBuildOptions& options = {});

// Fills the materialized entries as transformers initializes a new model: linear weights and the
// table ~ N(0, initializer_range^2) (the pad row 0), biases 0, norms 1; entry e from its own
// generator seeded mix_seed(seed, e). `only` (optional): the entries to fill (each draws what it
// draws in the whole model's init; a tied table is the embedding's, entry 0).
using LlamaEntryFilter = std::function<bool(int64_t entry)>;
void init_llama_random(LlamaModel& model, uint64_t seed, const LlamaEntryFilter& only = {});

// Hugging Face's name of a parameter ("0.weight" -> "model.embed_tokens.weight", "3.mlp.up_proj.
// weight" -> "model.layers.2.mlp.up_proj.weight", "<L+1>.weight" -> "model.norm.weight",
// "<L+2>.weight" -> "lm_head.weight"), and back (nullopt for a name no entry has).
std::string hf_name_of(const std::string& name, const LlamaConfig& config);
std::optional<std::string> entry_name_of(const std::string& hf_name, const LlamaConfig& config);

// Loads the materialized entries' parameters from `checkpoint`, converting to their dtype, and
// checks every entry's names and shapes against it (materialized or not): a tensor the model
// needs and the checkpoint lacks, one it has and the model does not know, or one of another
// shape is a SafetensorsError naming the file and the tensor. Ignored: "lm_head.weight" when the
// embedding is tied (transformers ties over it) and the rotary tables old checkpoints stored
// ("*.rotary_emb.inv_freq"). `only` (optional): the materialized entries to read (every entry
// is still checked).
void load_llama_weights(LlamaModel& model, const io::SafetensorsCheckpoint& checkpoint,
                        const LlamaEntryFilter& only = {});

struct HfSaveOptions {
  /// dtype of the tensors written ("float32", "bfloat16", "float16"). Default float32.
  TORCH_ARG(std::string, dtype) = "float32";
  /// Largest shard (io/safetensors.h). Default 5 GB.
  TORCH_ARG(int64_t, max_shard_bytes) = 5'000'000'000;
};

// Writes `parameters` (the Sequential's names, e.g. a gathered checkpoint's; a tied head may be
// present or not) as a Hugging Face checkpoint in `directory`: the safetensors files under
// Hugging Face's names (the tied head left out, as transformers saves it), then config.json
// (llama_config_json) last, each atomically. Throws BadInput for a missing or unknown name, a
// wrong shape or an unknown dtype; FileError when a file cannot be written. Returns the files
// written.
std::vector<std::string> save_llama_hf(const std::string& directory, const LlamaConfig& config,
                                       const std::map<std::string, torch::Tensor>& parameters,
                                       const HfSaveOptions& options = {});

// A tensor of a Hugging Face checkpoint of `config`: its name there, the Sequential's parameter
// name, and its shape.
struct HfTensorName {
  std::string hf_name;
  std::string name;
  std::vector<int64_t> shape;
};
// Every tensor save_llama_hf writes for `config`, in the order it writes them (a tied head left
// out, as transformers saves it). No memory: the shapes come from a meta model.
std::vector<HfTensorName> llama_hf_tensors(const LlamaConfig& config);
// Writes `directory`/config.json (llama_config_json with torch_dtype `dtype`) atomically; returns
// its name. BadInput for an unknown dtype.
std::string write_llama_hf_config(const std::string& directory, const LlamaConfig& config,
                                  const std::string& dtype);

// A target that is not learned: -100, as transformers' labels mark it (data/batch.h).
using data::kIgnoredTarget;

// Mean cross-entropy of logits [B,T,V] against next-token targets [B,T] over the counted targets
// (those not kIgnoredTarget); 0 when none is counted. A runtime weights each micro-batch by its
// counted targets (data/batch.h), so a step's loss is the sum over the whole mini-batch's over
// their count.
torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& targets);
// The targets that count (not kIgnoredTarget): an int64 scalar tensor.
torch::Tensor counted_targets(const torch::Tensor& targets);
// The same from each rank's vocabulary slice [B,T,V/tp] of a tensor-parallel model's logits
// (parallel::vocab_parallel_cross_entropy); the same value on every rank of the group.
torch::Tensor vocab_parallel_causal_lm_loss(const torch::Tensor& logits,
                                            const torch::Tensor& targets,
                                            const parallel::TensorParallel& tp);

// "float32" -> kFloat32, "bfloat16" -> kBFloat16, "float16" -> kFloat16; BadInput otherwise.
torch::Dtype parse_hf_dtype(const std::string& dtype);

}  // namespace pipetrain::models
