// The Llama family as pipeline entries (models/llama.h).
#include "pipetrain/models/llama.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <regex>
#include <set>

#include "pipetrain/base/atomic_file.h"
#include "pipetrain/base/check.h"
#include "pipetrain/base/error.h"
#include "pipetrain/base/shuffle.h"
#include "pipetrain/data/sequence_layout.h"
#include "pipetrain/models/document_attention.h"
#include "vocabulary_table.h"

namespace pipetrain::models {
namespace {

constexpr double kPi = 3.14159265358979323846;

torch::Tensor make_parameter(torch::IntArrayRef shape, const torch::TensorOptions& options) {
  return torch::empty(shape, options);
}

// [.., d] -> [-x2, x1] with x1, x2 the halves of the last dimension.
torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// transformers' inverse frequencies: default, linear (divided by factor), llama3 (low
// frequencies divided by factor, a smooth blend between the two cut-offs).
torch::Tensor rope_inverse_frequencies(const LlamaConfig& c) {
  const int64_t d = c.head_dim;
  torch::Tensor exponents =
      torch::arange(0, d, 2, torch::kInt64).to(torch::kFloat32) / static_cast<double>(d);
  torch::Tensor inv_freq = 1.0 / torch::pow(c.rope_theta, exponents);
  if (c.rope.type == "linear") return inv_freq / c.rope.factor;
  if (c.rope.type != "llama3") return inv_freq;
  const double old_context = static_cast<double>(c.rope.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / c.rope.low_freq_factor;
  const double high_freq_wavelen = old_context / c.rope.high_freq_factor;
  torch::Tensor wavelen = 2 * kPi / inv_freq;
  torch::Tensor scaled =
      torch::where(wavelen > low_freq_wavelen, inv_freq / c.rope.factor, inv_freq);
  torch::Tensor smooth = (old_context / wavelen - c.rope.low_freq_factor) /
                         (c.rope.high_freq_factor - c.rope.low_freq_factor);
  torch::Tensor smoothed = (1 - smooth) * scaled / c.rope.factor + smooth * scaled;
  torch::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return torch::where(medium, smoothed, scaled);
}

std::string shape_text(torch::IntArrayRef shape) {
  std::string text = "[";
  for (size_t d = 0; d < shape.size(); ++d) text += (d ? ", " : "") + std::to_string(shape[d]);
  return text + "]";
}

// A decoder layer's input_layernorm / post_attention_layernorm weight, or Qwen3's q_norm / k_norm
// (the final norm is an entry of its own): drawn as ones.
bool is_layer_norm_weight(const std::string& name) {
  return name.find("layernorm") != std::string::npos ||
         name.find("self_attn.q_norm.") != std::string::npos ||
         name.find("self_attn.k_norm.") != std::string::npos;
}

// How this model's tensor-parallel rank holds parameter `name` (the Sequential's), or nullopt for
// a whole tensor.
std::optional<parallel::TensorSplit> split_of(const LlamaModel& model, const std::string& name) {
  if (!model.tensor_parallel.split()) return std::nullopt;
  return tensor_parallel_split(name, *model.config, model.tensor_parallel.size());
}

// Key/value heads per rank: kv / tp, or the one head a rank shares when kv < tp.
int64_t local_kv_heads(const LlamaConfig& c, int tp) {
  return std::max<int64_t>(1, c.num_key_value_heads / tp);
}

}  // namespace

// ---- modules ------------------------------------------------------------------------------------

RmsNormImpl::RmsNormImpl(int64_t size_, double eps_, torch::TensorOptions options_,
                         parallel::TensorParallel summed_over_)
    : size(size_), eps(eps_), options(options_), summed_over(std::move(summed_over_)) {
  reset();
}

void RmsNormImpl::reset() {
  weight = register_parameter("weight", make_parameter({size}, options));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  const auto input_dtype = x.scalar_type();
  torch::Tensor h = x.to(torch::kFloat32);
  torch::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(variance + eps);
  const torch::Tensor w = summed_over.split()
                              ? parallel::sum_over_replicas(weight, summed_over.size(), summed_over)
                              : weight;
  return w * h.to(input_dtype);
}

LlamaLinearImpl::LlamaLinearImpl(int64_t in_, int64_t out_, bool bias_,
                                 torch::TensorOptions options_)
    : in(in_), out(out_), has_bias(bias_), options(options_) {
  reset();
}

void LlamaLinearImpl::reset() {
  weight = register_parameter("weight", make_parameter({out, in}, options));
  if (has_bias) bias = register_parameter("bias", make_parameter({out}, options));
}

torch::Tensor LlamaLinearImpl::forward(const torch::Tensor& x) {
  return torch::linear(x, weight, bias);
}

RotaryEmbedding::RotaryEmbedding(const LlamaConfig& config)
    : inv_freq_(rope_inverse_frequencies(config)) {}

RotaryEmbedding::RotaryEmbedding(const RotaryEmbedding& other) : inv_freq_(other.inv_freq_) {}

std::pair<torch::Tensor, torch::Tensor> RotaryEmbedding::tables(int64_t t,
                                                                const torch::Device& device,
                                                                torch::Dtype dtype) const {
  const std::string key =
      std::to_string(t) + "/" + device.str() + "/" + std::string(c10::toString(dtype));
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = cache_.find(key);
  if (found != cache_.end()) return found->second;
  torch::NoGradGuard no_grad;
  // As transformers: angles in float32 on the device, cos/sin there, then cast.
  torch::Tensor positions =
      torch::arange(t, torch::TensorOptions(torch::kInt64).device(device)).to(torch::kFloat32);
  torch::Tensor freqs = positions.unsqueeze(-1) * inv_freq_.to(device).unsqueeze(0);
  torch::Tensor angles = torch::cat({freqs, freqs}, -1);
  auto entry = std::make_pair(angles.cos().to(dtype), angles.sin().to(dtype));
  if (cache_.size() > 16) cache_.clear();  // generation grows t one by one
  cache_.emplace(key, entry);
  return entry;
}

LlamaAttentionImpl::LlamaAttentionImpl(std::shared_ptr<const LlamaConfig> config_,
                                       torch::TensorOptions options_, parallel::TensorParallel tp_,
                                       parallel::ContextParallel cp_)
    : config(std::move(config_)),
      options(options_),
      tp(std::move(tp_)),
      cp(std::move(cp_)),
      rope_(std::make_shared<RotaryEmbedding>(*config)) {
  reset();
}

int LlamaAttentionImpl::kv_replicas() const {
  return static_cast<int>(std::max<int64_t>(1, tp.size() / config->num_key_value_heads));
}

void LlamaAttentionImpl::reset() {
  const LlamaConfig& c = *config;
  const int64_t q = c.num_attention_heads / tp.size() * c.head_dim;
  const int64_t kv = local_kv_heads(c, tp.size()) * c.head_dim;
  q_proj = register_module("q_proj", LlamaLinear(c.hidden_size, q, c.qkv_bias, options));
  k_proj = register_module("k_proj", LlamaLinear(c.hidden_size, kv, c.qkv_bias, options));
  v_proj = register_module("v_proj", LlamaLinear(c.hidden_size, kv, c.qkv_bias, options));
  o_proj = register_module("o_proj", LlamaLinear(q, c.hidden_size, c.output_bias, options));
  if (c.qk_norm) {
    // Each tp rank normalizes its own heads: the weights' gradients are summed over the group.
    q_norm = register_module("q_norm", RmsNorm(c.head_dim, c.rms_norm_eps, options, tp));
    k_norm = register_module("k_norm", RmsNorm(c.head_dim, c.rms_norm_eps, options, tp));
  }
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x) {
  const LlamaConfig& c = *config;
  const int64_t heads = c.num_attention_heads / tp.size();
  const int64_t kv_heads = local_kv_heads(c, tp.size());
  // A key/value head shared by kv_replicas() ranks: each computes its query heads' share of the
  // projection's gradient, summed over those ranks in the backward.
  const int replicas = kv_replicas();
  auto shared = [&](const torch::Tensor& w) {
    return replicas > 1 && w.defined() ? parallel::sum_over_replicas(w, replicas, tp) : w;
  };
  // x is [B, T, H], or T/tp of it with sequence parallelism: the projections see the whole
  // sequence, and keep only this rank's slice of it for their backward.
  const std::vector<torch::Tensor> qkv = parallel::sequence_parallel_linears(
      x, {q_proj->weight, shared(k_proj->weight), shared(v_proj->weight)},
      {q_proj->bias, shared(k_proj->bias), shared(v_proj->bias)}, tp);
  const int64_t b = qkv[0].size(0), t = qkv[0].size(1), d = c.head_dim;
  torch::Tensor q = qkv[0].view({b, t, heads, d});
  torch::Tensor k = qkv[1].view({b, t, kv_heads, d});
  if (c.qk_norm) {  // Qwen3: each head normalized over head_dim, before RoPE
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  torch::Tensor v = qkv[2].view({b, t, kv_heads, d}).transpose(1, 2);
  // Packed documents (data/sequence_layout.h): positions restart at each document, and a token
  // attends only within its own. Context parallelism: this member's t tokens sit at their places
  // in the sequence of t x C and attend over the group.
  // With both, the layout is the whole rows' and this member's tokens are its columns.
  const data::SequenceLayout* layout = data::current_layout();
  const bool documents = layout != nullptr && layout->by_document();
  auto [cos, sin] = rope_->tables(t * cp.size(), x.device(), x.scalar_type());
  if (documents) {
    PIPETRAIN_CHECK_INPUT(layout->rows() == b && layout->width() == t * cp.size(),
                          "Llama attention over [", b, ", ", t, "] tokens",
                          cp.split() ? " of each row's " + std::to_string(t * cp.size()) : "",
                          " was given the layout of ", layout->describe());
    cos = rotary_at_positions(cos, *layout);
    sin = rotary_at_positions(sin, *layout);
  }
  if (cp.split()) {
    const torch::Tensor at = cp.positions(t).to(x.device());
    const int64_t along = documents ? 2 : 0;  // [B, 1, T, d] by document, else [T, d]
    cos = cos.index_select(along, at);
    sin = sin.index_select(along, at);
  }
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  torch::Tensor attended;
  if (cp.split()) {
    // The key/value heads repeated to the query heads.
    if (kv_heads != heads) {
      k = k.repeat_interleave(heads / kv_heads, 1);
      v = v.repeat_interleave(heads / kv_heads, 1);
    }
    if (documents) {
      attended = cp.attend(q, k, v, layout->segment_ids(x.device()),
                           [layout, scale](const torch::Tensor& qs, const torch::Tensor& ks,
                                           const torch::Tensor& vs) {
                             return document_causal_attention(qs, ks, vs, *layout, scale);
                           });
    } else {
      attended = cp.attend(q, k, v);
    }
  } else if (documents) {
    attended = document_causal_attention(q, k, v, *layout, scale);
  } else {
    attended = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                                /*is_causal=*/true, scale,
                                                /*enable_gqa=*/kv_heads != heads);
  }
  return parallel::row_parallel_linear(attended.transpose(1, 2).reshape({b, t, heads * d}),
                                       o_proj->weight, o_proj->bias, tp);
}

LlamaMlpImpl::LlamaMlpImpl(std::shared_ptr<const LlamaConfig> config_,
                           torch::TensorOptions options_, parallel::TensorParallel tp_,
                           int64_t width_, bool mixtral_names_)
    : config(std::move(config_)),
      options(options_),
      tp(std::move(tp_)),
      width(width_),
      mixtral_names(mixtral_names_) {
  reset();
}

void LlamaMlpImpl::reset() {
  const LlamaConfig& c = *config;
  const int64_t local = (width > 0 ? width : c.intermediate_size) / tp.size();
  const bool bias = c.mlp_bias && width <= 0;  // experts have no biases
  auto linear = [&](int64_t in, int64_t out) { return LlamaLinear(in, out, bias, options); };
  if (mixtral_names) {  // transformers' order: w1, w2, w3
    gate_proj = register_module("w1", linear(c.hidden_size, local));
    down_proj = register_module("w2", linear(local, c.hidden_size));
    up_proj = register_module("w3", linear(c.hidden_size, local));
    return;
  }
  gate_proj = register_module("gate_proj", linear(c.hidden_size, local));
  up_proj = register_module("up_proj", linear(c.hidden_size, local));
  down_proj = register_module("down_proj", linear(local, c.hidden_size));
}

std::vector<torch::Tensor> LlamaAttentionImpl::autocast_cast_parameters() const {
  std::vector<torch::Tensor> cast = {q_proj->weight, k_proj->weight, v_proj->weight,
                                     o_proj->weight};
  for (const LlamaLinear& in : {q_proj, k_proj, v_proj}) {
    if (in->bias.defined()) cast.push_back(in->bias);
  }
  if (o_proj->bias.defined() && !tp.split()) cast.push_back(o_proj->bias);
  return cast;
}

std::vector<torch::Tensor> LlamaMlpImpl::autocast_cast_parameters() const {
  std::vector<torch::Tensor> cast = {gate_proj->weight, up_proj->weight, down_proj->weight};
  for (const LlamaLinear& in : {gate_proj, up_proj}) {
    if (in->bias.defined()) cast.push_back(in->bias);
  }
  if (down_proj->bias.defined() && !tp.split()) cast.push_back(down_proj->bias);
  return cast;
}

torch::Tensor LlamaMlpImpl::forward(const torch::Tensor& x) {
  const std::vector<torch::Tensor> gate_up = parallel::sequence_parallel_linears(
      x, {gate_proj->weight, up_proj->weight}, {gate_proj->bias, up_proj->bias}, tp);
  return parallel::row_parallel_linear(torch::silu(gate_up[0]) * gate_up[1], down_proj->weight,
                                       down_proj->bias, tp);
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(std::shared_ptr<const LlamaConfig> config_,
                                             torch::TensorOptions options_,
                                             parallel::TensorParallel tp_, int64_t layer_,
                                             parallel::ExpertParallel ep_,
                                             parallel::ContextParallel cp_)
    : config(std::move(config_)),
      options(options_),
      tp(std::move(tp_)),
      ep(std::move(ep_)),
      cp(std::move(cp_)),
      layer(layer_) {
  reset();
}

void LlamaDecoderLayerImpl::reset() {
  const LlamaConfig& c = *config;
  // Registered in transformers' order, so named_parameters() lists them as its state dict does.
  self_attn = register_module("self_attn", LlamaAttention(config, options, tp, cp));
  if (c.is_moe_layer(layer)) {
    moe =
        register_module(c.architecture == LlamaArchitecture::kMixtral ? "block_sparse_moe" : "mlp",
                        LlamaMoe(config, options, layer, ep));
  } else {
    mlp = register_module("mlp", LlamaMlp(config, options, tp));
  }
  input_layernorm =
      register_module("input_layernorm", RmsNorm(c.hidden_size, c.rms_norm_eps, options));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RmsNorm(c.hidden_size, c.rms_norm_eps, options));
}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 3 && x.size(2) == config->hidden_size,
              "Llama decoder layer expects [B, T, ", config->hidden_size, "], got ", x.sizes());
  torch::Tensor h = x + self_attn->forward(input_layernorm->forward(x));
  const torch::Tensor normed = post_attention_layernorm->forward(h);
  return h + (moe ? moe->forward(normed) : mlp->forward(normed));
}

LlamaEmbeddingImpl::LlamaEmbeddingImpl(std::shared_ptr<const LlamaConfig> config_,
                                       torch::TensorOptions options_, parallel::TensorParallel tp_)
    : config(std::move(config_)), options(options_), tp(std::move(tp_)) {
  reset();
}

void LlamaEmbeddingImpl::reset() {
  weight = register_parameter(
      "weight", make_parameter({config->vocab_size / tp.size(), config->hidden_size}, options));
}

torch::Tensor LlamaEmbeddingImpl::forward(const torch::Tensor& tokens) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kInt64,
              "Llama embedding expects int64 token ids [B, T], got ", tokens.scalar_type(), " ",
              tokens.sizes());
  if (!tp.split()) return table_lookup(weight, tokens, config->pad_token_id);
  return parallel::vocab_parallel_embedding(
      tokens, weight, tp.rank() * weight.size(0),
      config->pad_token_id >= 0 ? std::optional<int64_t>(config->pad_token_id) : std::nullopt, tp);
}

LlamaHeadImpl::LlamaHeadImpl(std::shared_ptr<const LlamaConfig> config_,
                             torch::TensorOptions options_, torch::Tensor tied,
                             parallel::TensorParallel tp_)
    : config(std::move(config_)), options(options_), tp(std::move(tp_)), tied_(std::move(tied)) {
  reset();
}

void LlamaHeadImpl::reset() {
  if (tied_.defined()) {
    weight = register_parameter("weight", tied_);
  } else {
    weight = register_parameter(
        "weight", make_parameter({config->vocab_size / tp.size(), config->hidden_size}, options));
  }
}

std::shared_ptr<torch::nn::Module> LlamaHeadImpl::clone(
    const std::optional<torch::Device>& device) const {
  torch::NoGradGuard no_grad;
  // Untied: a fresh table of the copy's own, given this one's values.
  auto copy = std::make_shared<LlamaHeadImpl>(config, options, torch::Tensor(), tp);
  copy->weight.set_data(device && weight.device() != *device ? weight.to(*device) : weight.clone());
  copy->train(is_training());
  return copy;
}

torch::Tensor LlamaHeadImpl::forward(const torch::Tensor& x) {
  if (!tp.split()) return table_logits(x, weight);
  return parallel::sequence_parallel_linears(x, {weight}, {}, tp)[0];
}

// ---- building
// -------------------------------------------------------------------------------------

LlamaModel make_llama(const LlamaConfig& config, const LlamaBuildOptions& options) {
  check_llama_config(config);
  const parallel::TensorParallel& tp = options.tensor_parallel();
  if (tp.split()) check_llama_tensor_parallel(config, tp.size());
  LlamaModel model;
  model.config = std::make_shared<const LlamaConfig>(config);
  model.tensor_parallel = tp;
  const int64_t entries = config.entries();
  model.materialized.assign(static_cast<size_t>(entries), !options.entries().has_value());
  if (options.entries()) {
    for (int64_t e : *options.entries()) {
      TORCH_CHECK(e >= 0 && e < entries, "Llama: entry ", e, " to materialize is outside 0..",
                  entries - 1);
      model.materialized[static_cast<size_t>(e)] = true;
    }
  }
  auto options_of = [&](int64_t e) {
    torch::TensorOptions o = torch::TensorOptions().dtype(options.dtype());
    return model.materialized[static_cast<size_t>(e)] ? o : o.device(torch::kMeta);
  };
  const int64_t layers = config.num_hidden_layers;
  // A tied table is one tensor for both ends: real when either end is materialized.
  const bool tied = config.tie_word_embeddings;
  if (tied) {
    const bool either =
        model.materialized[0] || model.materialized[static_cast<size_t>(layers + 2)];
    model.materialized[0] = model.materialized[static_cast<size_t>(layers + 2)] = either;
  }
  LlamaEmbedding embedding(model.config, options_of(0), tp);
  model.sequential->push_back(embedding);
  const parallel::ExpertParallel& ep = options.expert_parallel();
  if (ep.split()) {
    PIPETRAIN_CHECK_INPUT(is_moe(config.architecture),
                          "expert parallelism splits a mixture's experts, and this model has none");
    parallel::check_expert_parallel(config.num_experts, ep.size(), ep.size());
  }
  model.expert_parallel = ep;
  for (int64_t l = 0; l < layers; ++l) {
    model.sequential->push_back(
        LlamaDecoderLayer(model.config, options_of(l + 1), tp, l, ep, options.context_parallel()));
  }
  model.sequential->push_back(
      RmsNorm(config.hidden_size, config.rms_norm_eps, options_of(layers + 1)));
  model.sequential->push_back(LlamaHead(model.config, options_of(layers + 2),
                                        tied ? embedding->weight : torch::Tensor(), tp));
  if (tied) {
    model.tied_parameters.emplace_back("0.weight", std::to_string(layers + 2) + ".weight");
  }
  return model;
}

namespace {

// Entry e's parameters as the whole model lists them: (name, this rank's tensor), the tensor
// undefined for an expert another expert-parallel rank holds (its shape then in `shapes`).
struct EntryParameter {
  std::string name;
  torch::Tensor tensor;
  std::vector<int64_t> shape;
};
std::vector<EntryParameter> entry_parameters(const LlamaModel& model, size_t e) {
  std::vector<EntryParameter> out;
  const auto held = model.sequential->ptr(e)->named_parameters();
  const int64_t layers = model.config->num_hidden_layers;
  const bool split_experts = model.expert_parallel.split() && e >= 1 &&
                             static_cast<int64_t>(e) <= layers &&
                             model.config->is_moe_layer(static_cast<int64_t>(e) - 1);
  if (!split_experts) {
    for (const auto& item : held)
      out.push_back({item.key(), item.value(), item.value().sizes().vec()});
    return out;
  }
  // The layer as one rank holding every expert builds it, on the meta device: its order.
  const LlamaDecoderLayer whole(model.config, torch::TensorOptions().device(torch::kMeta),
                                model.tensor_parallel, static_cast<int64_t>(e) - 1);
  for (const auto& item : whole->named_parameters()) {
    const torch::Tensor* mine = held.find(item.key());
    out.push_back({item.key(), mine ? *mine : torch::Tensor(), item.value().sizes().vec()});
  }
  return out;
}

}  // namespace

void init_llama_random(LlamaModel& model, uint64_t seed, const LlamaEntryFilter& only) {
  const LlamaConfig& c = *model.config;
  const double std = c.initializer_range;
  torch::NoGradGuard no_grad;
  for (size_t e = 0; e < model.sequential->size(); ++e) {
    if (!model.materialized[e] || (only && !only(static_cast<int64_t>(e)))) continue;
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(mix_seed(seed, e));
    for (const EntryParameter& item : entry_parameters(model, e)) {
      torch::Tensor p = item.tensor;
      const std::string& name = item.name;
      if (!p.defined()) {
        // Another expert-parallel rank's expert: drawn and dropped, so that the experts this rank
        // holds get the values of the whole model's init.
        torch::empty(item.shape, torch::kFloat32).normal_(0.0, std, generator);
        continue;
      }
      // A tied table is drawn once, by the embedding (entry 0), never by the head (also when
      // only the head's entry is asked for).
      if (c.tie_word_embeddings && e == static_cast<size_t>(c.num_hidden_layers + 2) &&
          name == "weight") {
        continue;
      }
      if (is_layer_norm_weight(name) || e == static_cast<size_t>(c.num_hidden_layers + 1)) {
        p.fill_(1.0);
      } else if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
        p.zero_();
      } else {
        // Drawn in float32 on the CPU whatever the parameter's dtype, so every dtype starts from
        // the same values.
        // A tensor-parallel rank draws the whole tensor and keeps its slice, so that every tp
        // starts from the values of tp 1.
        const auto split = split_of(model, std::to_string(e) + "." + name);
        if (!split && p.scalar_type() == torch::kFloat32 && p.is_contiguous()) {
          // Drawn in place: the same values as into a tensor of its own, without a second copy
          // of the tensor (an embedding's 933 MB at Qwen2-1.5B's size) at the process's peak.
          p.normal_(0.0, std, generator);
          if (e == 0 && c.pad_token_id >= 0) p[c.pad_token_id].zero_();
          continue;
        }
        const int tp = model.tensor_parallel.size();
        std::vector<int64_t> whole = p.sizes().vec();
        if (split) whole[split->dim] *= split->parts(tp);
        torch::Tensor draw = torch::empty(whole, torch::kFloat32);
        draw.normal_(0.0, std, generator);
        if (e == 0 && c.pad_token_id >= 0) draw[c.pad_token_id].zero_();
        if (split) {
          const int64_t length = p.size(split->dim);
          draw = draw.narrow(split->dim, split->part_of(model.tensor_parallel.rank()) * length,
                             length);
        }
        p.copy_(draw);
      }
    }
  }
}

// ---- names --------------------------------------------------------------------------------------

std::string hf_name_of(const std::string& name, const LlamaConfig& config) {
  const auto dot = name.find('.');
  TORCH_CHECK(dot != std::string::npos, "not a Llama parameter name: '", name, "'");
  const int64_t entry = std::stoll(name.substr(0, dot));
  const std::string rest = name.substr(dot + 1);
  const int64_t layers = config.num_hidden_layers;
  if (entry == 0) return "model.embed_tokens." + rest;
  if (entry <= layers) return "model.layers." + std::to_string(entry - 1) + "." + rest;
  if (entry == layers + 1) return "model.norm." + rest;
  TORCH_CHECK(entry == layers + 2, "not a Llama parameter name: '", name, "'");
  return "lm_head." + rest;
}

std::optional<std::string> entry_name_of(const std::string& hf_name, const LlamaConfig& config) {
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.+))");
  const int64_t layers = config.num_hidden_layers;
  std::smatch match;
  if (std::regex_match(hf_name, match, layer)) {
    if (match[1].str().size() > 9) return std::nullopt;
    const int64_t l = std::stoll(match[1].str());
    if (l >= layers) return std::nullopt;
    return std::to_string(l + 1) + "." + match[2].str();
  }
  auto strip = [&](const std::string& prefix) -> std::optional<std::string> {
    if (hf_name.rfind(prefix, 0) != 0) return std::nullopt;
    return hf_name.substr(prefix.size());
  };
  if (auto rest = strip("model.embed_tokens.")) return "0." + *rest;
  if (auto rest = strip("model.norm.")) return std::to_string(layers + 1) + "." + *rest;
  if (auto rest = strip("lm_head.")) return std::to_string(layers + 2) + "." + *rest;
  return std::nullopt;
}

// ---- loading and saving
// ---------------------------------------------------------------------------

void load_llama_weights(LlamaModel& model, const io::SafetensorsCheckpoint& checkpoint,
                        const LlamaEntryFilter& only) {
  const LlamaConfig& c = *model.config;
  const std::string lm_head = "lm_head.weight";
  std::set<std::string> expected;
  torch::NoGradGuard no_grad;
  for (size_t e = 0; e < model.sequential->size(); ++e) {
    for (const auto& item : model.sequential->ptr(e)->named_parameters()) {
      const std::string hf = hf_name_of(std::to_string(e) + "." + item.key(), c);
      if (c.tie_word_embeddings && hf == lm_head) continue;  // the embedding's table
      expected.insert(hf);
      torch::Tensor p = item.value();
      if (!checkpoint.contains(hf)) {
        throw io::SafetensorsError(checkpoint.path(), hf,
                                   "missing: the model config.json describes has it, the "
                                   "checkpoint does not (a checkpoint of another model?)");
      }
      const io::SafetensorsEntry& entry = checkpoint.entry(hf);
      if (entry.dtype != io::SafetensorsDtype::kF32 && entry.dtype != io::SafetensorsDtype::kF16 &&
          entry.dtype != io::SafetensorsDtype::kBF16 && entry.dtype != io::SafetensorsDtype::kF64) {
        throw io::SafetensorsError(checkpoint.file_of(hf), hf,
                                   std::string("dtype ") + io::to_string(entry.dtype) +
                                       " is not a weight dtype pipetrain reads (F32, F16, BF16, "
                                       "F64; a quantized checkpoint?)");
      }
      // A tensor-parallel rank's tensor is a slice of the checkpoint's: compare the whole shape.
      const auto split = split_of(model, std::to_string(e) + "." + item.key());
      std::vector<int64_t> whole = p.sizes().vec();
      if (split) whole[split->dim] *= split->parts(model.tensor_parallel.size());
      if (entry.shape != whole) {
        throw io::SafetensorsError(checkpoint.file_of(hf), hf,
                                   "has shape " + shape_text(entry.shape) +
                                       " but config.json gives the model " + shape_text(whole));
      }
      if (p.is_meta()) continue;  // another rank's entry: checked, not read
      if (only && !only(static_cast<int64_t>(e))) continue;
      if (split) {  // only this rank's slice is read
        const int64_t length = p.size(split->dim);
        p.copy_(checkpoint.load_slice(hf, split->dim,
                                      split->part_of(model.tensor_parallel.rank()) * length, length,
                                      p.scalar_type(), p.device()));
      } else {
        p.copy_(checkpoint.load(hf, p.scalar_type(), p.device()));
      }
    }
  }
  // Other expert-parallel ranks' experts: theirs to check and read.
  if (model.expert_parallel.split()) {
    for (size_t e = 0; e < model.sequential->size(); ++e) {
      for (const EntryParameter& item : entry_parameters(model, e)) {
        if (!item.tensor.defined())
          expected.insert(hf_name_of(std::to_string(e) + "." + item.name, c));
      }
    }
  }
  static const std::regex rotary_table(R"(model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq)");
  for (const std::string& name : checkpoint.names()) {
    if (expected.count(name)) continue;
    if (c.tie_word_embeddings && name == lm_head) {
      const io::SafetensorsEntry& entry = checkpoint.entry(name);
      if (entry.shape != std::vector<int64_t>{c.vocab_size, c.hidden_size}) {
        throw io::SafetensorsError(checkpoint.file_of(name), name,
                                   "has shape " + shape_text(entry.shape) +
                                       " but the tied LM head is the embedding's table " +
                                       shape_text({c.vocab_size, c.hidden_size}));
      }
      continue;  // tie_word_embeddings: transformers ties the head over it too
    }
    if (std::regex_match(name, rotary_table)) continue;  // recomputed from config.json
    throw io::SafetensorsError(checkpoint.file_of(name), name,
                               "extra: the checkpoint has it, the model config.json describes does "
                               "not (a checkpoint of another model or config?)");
  }
}

torch::Dtype parse_hf_dtype(const std::string& dtype) {
  if (dtype == "float32") return torch::kFloat32;
  if (dtype == "bfloat16") return torch::kBFloat16;
  if (dtype == "float16") return torch::kFloat16;
  throw BadInput("unknown dtype '" + dtype + "'; valid: float32, bfloat16, float16");
}

std::vector<HfTensorName> llama_hf_tensors(const LlamaConfig& config) {
  // The names and shapes the config implies, from a placeholder model (meta: no memory).
  LlamaModel shape = make_llama(config, LlamaBuildOptions().entries(std::vector<int64_t>{}));
  const std::string head = std::to_string(config.num_hidden_layers + 2) + ".weight";
  std::vector<HfTensorName> out;
  for (const auto& item : shape.sequential->named_parameters()) {
    if (config.tie_word_embeddings && item.key() == head) continue;
    out.push_back({hf_name_of(item.key(), config), item.key(), item.value().sizes().vec()});
  }
  return out;
}

std::string write_llama_hf_config(const std::string& directory, const LlamaConfig& config,
                                  const std::string& dtype) {
  parse_hf_dtype(dtype);
  write_file_atomically(directory + "/config.json",
                        llama_config_json(config, dtype).dump(2) + "\n");
  return "config.json";
}

std::vector<std::string> save_llama_hf(const std::string& directory, const LlamaConfig& config,
                                       const std::map<std::string, torch::Tensor>& parameters,
                                       const HfSaveOptions& options) {
  const torch::Dtype dtype = parse_hf_dtype(options.dtype());
  io::NamedTensorList tensors;
  std::set<std::string> known;
  for (const HfTensorName& t : llama_hf_tensors(config)) {
    known.insert(t.name);
    auto found = parameters.find(t.name);
    if (found == parameters.end()) {
      throw BadInput("saving " + std::string(to_string(config.architecture)) + " to '" + directory +
                     "': parameter '" + t.name + "' (" + t.hf_name + ") is missing");
    }
    if (found->second.sizes().vec() != t.shape) {
      throw BadInput("saving to '" + directory + "': parameter '" + t.name + "' has shape " +
                     shape_text(found->second.sizes()) + " but config.json implies " +
                     shape_text(t.shape));
    }
    tensors.emplace_back(t.hf_name, found->second.detach().to(torch::kCPU, dtype));
  }
  // The tied head is the embedding's table: given or not, it is not written.
  if (config.tie_word_embeddings)
    known.insert(std::to_string(config.num_hidden_layers + 2) + ".weight");
  for (const auto& item : parameters) {
    if (!known.count(item.first)) {
      throw BadInput("saving to '" + directory + "': parameter '" + item.first +
                     "' is not one of the model's (config.json)");
    }
  }
  std::vector<std::string> files = io::write_safetensors_checkpoint(
      directory, tensors, io::SafetensorsWriteOptions().max_shard_bytes(options.max_shard_bytes()));
  files.push_back(write_llama_hf_config(directory, config, options.dtype()));
  return files;
}

torch::Tensor vocab_parallel_causal_lm_loss(const torch::Tensor& logits,
                                            const torch::Tensor& targets,
                                            const parallel::TensorParallel& tp) {
  TORCH_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
                  logits.size(1) == targets.size(1),
              "causal_lm_loss expects logits [B, T, V/tp] and targets [B, T], got ", logits.sizes(),
              " and ", targets.sizes());
  const int64_t width = logits.size(2);
  const torch::Tensor flat = targets.reshape({-1});
  const torch::Tensor per_token = parallel::vocab_parallel_cross_entropy(
      logits.reshape({-1, width}), flat, tp.rank() * width, tp);
  const torch::Tensor counted = flat != kIgnoredTarget;
  return (per_token * counted).sum() / counted.sum().clamp_min(1);
}

void check_llama_tensor_parallel(const LlamaConfig& c, int tp) {
  PIPETRAIN_CHECK_INPUT(tp >= 1, "--tp must be >= 1 (got ", tp, ")");
  const std::vector<std::pair<const char*, int64_t>> cut = {
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"vocab_size", c.vocab_size},
      {"intermediate_size", c.intermediate_size}};
  // Key/value heads: tp divides them, or they divide tp (each replicated on tp / kv ranks).
  auto fits = [&](const char* key, int64_t value, int t) {
    if (std::string(key) == "num_key_value_heads") return value % t == 0 || t % value == 0;
    return value % t == 0;
  };
  std::string works;
  for (int t = 1; t <= c.num_attention_heads; ++t) {
    bool all = true;
    for (const auto& [key, value] : cut) all = all && fits(key, value, t);
    if (all) works += (works.empty() ? "" : ", ") + std::to_string(t);
  }
  for (const auto& [key, value] : cut) {
    if (fits(key, value, tp)) continue;
    std::string why = std::string("--tp ") + std::to_string(tp) + " does not divide " + key + " (" +
                      std::to_string(value) + ") of config.json";
    if (std::string(key) == "num_key_value_heads") {
      why += " and is not a multiple of it (each key/value head replicated on tp / kv ranks)";
    }
    throw BadInput(why +
                   "; tensor-parallel sizes that divide heads, vocabulary and MLP width and "
                   "divide or are a multiple of the key/value heads: " +
                   works);
  }
}

std::optional<parallel::TensorSplit> tensor_parallel_split(const std::string& name,
                                                           const LlamaConfig& c, int tp) {
  const auto dot = name.find('.');
  TORCH_CHECK(dot != std::string::npos, "not a Llama parameter name: '", name, "'");
  const int64_t entry = std::stoll(name.substr(0, dot));
  const std::string rest = name.substr(dot + 1);
  using parallel::TensorSplit;
  if (entry == 0 || entry == c.num_hidden_layers + 2) {
    return TensorSplit{0, 1};  // the table and the head: rows
  }
  if (entry == c.num_hidden_layers + 1) return std::nullopt;  // the final norm
  for (const char* key_value : {"self_attn.k_proj.", "self_attn.v_proj."}) {
    if (rest.rfind(key_value, 0) == 0) {  // weight rows and bias, maybe shared
      return TensorSplit{0, static_cast<int>(std::max<int64_t>(1, tp / c.num_key_value_heads))};
    }
  }
  for (const char* column : {"self_attn.q_proj.", "mlp.gate_proj.", "mlp.up_proj."}) {
    if (rest.rfind(column, 0) == 0) return TensorSplit{0, 1};  // weight rows and bias
  }
  for (const char* row : {"self_attn.o_proj.weight", "mlp.down_proj.weight"}) {
    if (rest == row) return TensorSplit{1, 1};
  }
  return std::nullopt;  // norms, o_proj/down_proj biases
}

bool tensor_parallel_summed_in_backward(const std::string& name) {
  return name.find("self_attn.q_norm.") != std::string::npos ||
         name.find("self_attn.k_norm.") != std::string::npos;
}

std::vector<torch::Tensor> tensor_parallel_whole_parameters(
    const std::vector<std::pair<std::string, torch::Tensor>>& named, const LlamaConfig& config,
    int tp) {
  std::vector<torch::Tensor> whole;
  std::set<const void*> seen;
  for (const auto& [name, tensor] : named) {
    if (tensor_parallel_summed_in_backward(name)) continue;
    if (!tensor_parallel_split(name, config, tp) &&
        seen.insert(tensor.unsafeGetTensorImpl()).second) {
      whole.push_back(tensor);
    }
  }
  return whole;
}

torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  TORCH_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
                  logits.size(1) == targets.size(1),
              "causal_lm_loss expects logits [B, T, V] and targets [B, T], got ", logits.sizes(),
              " and ", targets.sizes());
  const torch::Tensor flat = targets.reshape({-1});
  const torch::Tensor summed =
      torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(2)}), flat,
                                           torch::nn::functional::CrossEntropyFuncOptions()
                                               .reduction(torch::kSum)
                                               .ignore_index(kIgnoredTarget));
  return summed / counted_targets(flat).clamp_min(1);
}

torch::Tensor counted_targets(const torch::Tensor& targets) {
  return (targets != kIgnoredTarget).sum();
}

}  // namespace pipetrain::models
