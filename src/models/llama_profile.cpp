// A Llama-family model's profile from one decoder layer (models/llama_profile.h).
#include "pipetrain/models/llama_profile.h"

#include <algorithm>
#include <cmath>

#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/models/llama.h"
#include "pipetrain/stage/allocation_counter.h"

namespace pipetrain::models {

namespace {

// Whether a mixture of experts has dense layers beside its MoE layers: it is then profiled on two
// decoder layers, an MoE one and a dense one (expand_llama_profile maps each layer to its kind's).
bool mixed_layers(const LlamaConfig& config) {
  if (!is_moe(config.architecture)) return false;
  const auto moe = std::count(config.moe_layer.begin(), config.moe_layer.end(), char{1});
  return moe > 0 && moe < static_cast<std::ptrdiff_t>(config.moe_layer.size());
}

// The profile of `config` cut to one decoder layer (entries: embedding, decoder, norm, head), or
// to two for a mixture with dense layers (the MoE layer first).
partition::ModelProfile profile_one_layer(const LlamaConfig& config, const torch::Tensor& sample,
                                          const partition::ProfileOptions& options, uint64_t seed,
                                          const parallel::TensorParallel& tp,
                                          const parallel::ExpertParallel& ep,
                                          const parallel::ContextParallel& cp) {
  LlamaConfig one = config;
  const bool mixed = mixed_layers(config);
  one.num_hidden_layers = mixed ? 2 : 1;
  one.sliding_window.assign(static_cast<size_t>(one.num_hidden_layers),
                            config.sliding_window.empty() ? 0 : config.sliding_window.back());
  if (is_moe(config.architecture)) {
    one.moe_layer =
        mixed ? std::vector<char>{1, 0}
              : std::vector<char>{config.moe_layer.empty() ? char{0} : config.moe_layer.back()};
  }
  LlamaModel model = make_llama(
      one, LlamaBuildOptions()
               .tensor_parallel(tp)
               .expert_parallel(is_moe(config.architecture) ? ep : parallel::ExpertParallel{})
               .context_parallel(cp));
  init_llama_random(model, seed);
  return partition::profile_sequential(model.sequential, sample, options);
}

// The value at `x` of the line through (x1, y1) and (x2, y2).
double on_line(double x1, double y1, double x2, double y2, double x) {
  return y1 + (y2 - y1) * (x - x1) / (x2 - x1);
}

std::int64_t on_line(double x1, std::int64_t y1, double x2, std::int64_t y2, double x) {
  return std::llround(on_line(x1, static_cast<double>(y1), x2, static_cast<double>(y2), x));
}

// `large`'s entry extended from its size `x2` (a vocabulary, an MLP width; `small`'s `x1`) to `x`.
partition::LayerProfile extend_layer(const partition::LayerProfile& small, double x1,
                                     const partition::LayerProfile& large, double x2, double x) {
  partition::LayerProfile out = large;
  out.parameter_bytes = on_line(x1, small.parameter_bytes, x2, large.parameter_bytes, x);
  out.cast_parameter_bytes =
      on_line(x1, small.cast_parameter_bytes, x2, large.cast_parameter_bytes, x);
  for (size_t i = 0; i < out.parameter_sizes.size(); ++i) {
    out.parameter_sizes[i] =
        on_line(x1, small.parameter_sizes.at(i), x2, large.parameter_sizes[i], x);
  }
  auto time = [&](double a, double b) { return std::max(0.0, on_line(x1, a, x2, b, x)); };
  out.update_seconds = time(small.update_seconds, large.update_seconds);
  for (size_t c = 0; c < out.costs.size(); ++c) {
    const partition::LayerCost& s = small.costs.at(c);
    partition::LayerCost& l = out.costs[c];
    l.forward_seconds = time(s.forward_seconds, l.forward_seconds);
    l.backward_seconds = time(s.backward_seconds, l.backward_seconds);
    l.backward_input_seconds = time(s.backward_input_seconds, l.backward_input_seconds);
    l.backward_weight_seconds = time(s.backward_weight_seconds, l.backward_weight_seconds);
    l.activation_bytes = on_line(x1, s.activation_bytes, x2, l.activation_bytes, x);
    l.split_activation_bytes =
        on_line(x1, s.split_activation_bytes, x2, l.split_activation_bytes, x);
    l.split_first_activation_bytes =
        on_line(x1, s.split_first_activation_bytes, x2, l.split_first_activation_bytes, x);
    l.output_bytes = on_line(x1, s.output_bytes, x2, l.output_bytes, x);
  }
  return out;
}

}  // namespace

partition::ModelProfile profile_llama(const LlamaConfig& config, const torch::Tensor& sample,
                                      const partition::ProfileOptions& options, uint64_t seed,
                                      const parallel::TensorParallel& tp, std::int64_t table_rows,
                                      std::int64_t mlp_rows, const parallel::ExpertParallel& ep,
                                      const parallel::ContextParallel& cp) {
  if (sample.dim() != 2 || sample.scalar_type() != torch::kInt64) {
    throw BadInput("profile_llama: the sample must be int64 token ids [B, T], got " +
                   std::string(c10::toString(sample.scalar_type())) + " of " +
                   std::to_string(sample.dim()) + " dimensions");
  }
  const std::int64_t unit = 2 * static_cast<std::int64_t>(tp.size());
  const std::int64_t rows = std::max(unit, table_rows / unit * unit);
  const std::int64_t widths = std::max(unit, mlp_rows / unit * unit);
  const bool cut_table = table_rows > 0 && config.vocab_size > rows;
  // A mixture's layers are profiled at their width (its experts' width is not intermediate_size).
  const bool cut_mlp =
      mlp_rows > 0 && config.intermediate_size > widths && !is_moe(config.architecture);
  if (!cut_table && !cut_mlp) {
    return expand_llama_profile(profile_one_layer(config, sample, options, seed, tp, ep, cp),
                                config);
  }
  // Two models, the smaller one's table of `rows` / 2 rows and MLP of `widths` / 2, the larger's
  // `rows` and `widths` (where cut), on the same ids (below the smaller vocabulary). The tables'
  // entries depend on the vocabulary alone and the decoder layer's on the MLP width alone, so the
  // two measurements give both lines.
  LlamaConfig small = config;
  LlamaConfig large = config;
  if (cut_table) {
    small.vocab_size = rows / 2;
    if (small.pad_token_id >= 0) small.pad_token_id %= small.vocab_size;
    large.vocab_size = rows;
    large.pad_token_id = small.pad_token_id;
  }
  if (cut_mlp) {
    small.intermediate_size = widths / 2;
    large.intermediate_size = widths;
  }
  const torch::Tensor ids = cut_table ? sample.remainder(small.vocab_size) : sample;
  const partition::ModelProfile a = profile_one_layer(small, ids, options, seed, tp, ep, cp);
  partition::ModelProfile measured = profile_one_layer(large, ids, options, seed, tp, ep, cp);
  if (cut_table) {
    const double x = static_cast<double>(config.vocab_size);
    for (const size_t e : {size_t{0}, measured.layers.size() - 1}) {
      measured.layers[e] =
          extend_layer(a.layers.at(e), static_cast<double>(small.vocab_size), measured.layers[e],
                       static_cast<double>(large.vocab_size), x);
    }
  }
  if (cut_mlp) {
    measured.layers[1] =
        extend_layer(a.layers.at(1), static_cast<double>(small.intermediate_size),
                     measured.layers[1], static_cast<double>(large.intermediate_size),
                     static_cast<double>(config.intermediate_size));
  }
  return expand_llama_profile(measured, config);
}

partition::ModelProfile expand_llama_profile(const partition::ModelProfile& profile,
                                             const LlamaConfig& config) {
  const int64_t measured = profile.num_layers() - 3;
  if (measured < 1) {
    throw BadInput("expand_llama_profile: the profile has " + std::to_string(profile.num_layers()) +
                   " entries; a Llama model's has the embedding, a decoder layer, the norm and "
                   "the head at least");
  }
  partition::ModelProfile expanded = profile;
  expanded.layers.clear();
  const int64_t layers = config.num_hidden_layers;
  // A mixture measured on an MoE layer and a dense one: each layer takes its kind's.
  const bool by_kind = measured == 2 && mixed_layers(config);
  expanded.layers.push_back(profile.layers.front());
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t m = by_kind ? (config.is_moe_layer(l) ? 0 : 1) : std::min(l, measured - 1);
    expanded.layers.push_back(profile.layers[static_cast<size_t>(m + 1)]);
  }
  expanded.layers.push_back(profile.layers[static_cast<size_t>(measured + 1)]);
  expanded.layers.push_back(profile.layers[static_cast<size_t>(measured + 2)]);
  for (size_t e = 0; e < expanded.layers.size(); ++e) {  // "3:LlamaDecoderLayer", as profiled
    std::string& name = expanded.layers[e].name;
    const auto colon = name.find(':');
    name = std::to_string(e) + (colon == std::string::npos ? "" : name.substr(colon));
  }
  expanded.process_layer_scale.clear();  // per measured layer: no longer lines up
  expanded.validate();
  return expanded;
}

std::int64_t expert_row_bytes(const LlamaConfig& config, Precision precision) {
  auto shared = std::make_shared<LlamaConfig>(config);
  LlamaMlp expert(shared, torch::TensorOptions(), parallel::TensorParallel{},
                  config.expert_intermediate_size);
  // What a forward over `rows` rows keeps for its backward: all it allocated and still holds
  // (the rows themselves, made inside the layer as its dispatch makes them, where a projection
  // saves them), less the output (the combine's, on the sender).
  // A training forward's bytes whatever the caller's mode (a report after training runs without
  // grad, or in inference mode).
  const c10::InferenceMode not_inference(false);
  const torch::AutoGradMode grad(true);
  auto kept_by = [&](int64_t rows) {
    const torch::Tensor base = torch::randn({rows, config.hidden_size}).requires_grad_(true);
    AllocationCounter kept;
    torch::Tensor out;
    {
      const CountAllocations counting(kept);
      const AutocastGuard autocast(precision, torch::kCPU);
      const torch::Tensor x = base.clone();
      out = expert->forward(x);
    }
    return kept.live_bytes() - kept.counted_bytes_of(out);
  };
  // Per row: the slope between two counts, so that what a forward keeps once (autocast's weight
  // casts) is not spread over the rows.
  constexpr int64_t kRows = 64;
  return std::max<int64_t>(0, kept_by(2 * kRows) - kept_by(kRows)) / kRows;
}

void apply_routing_imbalance(partition::ModelProfile& profile, const LlamaConfig& config,
                             std::int64_t tokens_per_row, int ep, double imbalance,
                             Precision precision) {
  if (imbalance == 1.0) return;
  parallel::check_routing_imbalance(imbalance, is_moe(config.architecture), config.num_experts,
                                    config.num_experts_per_tok, ep);
  const double row = static_cast<double>(expert_row_bytes(config, precision));
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    if (!config.is_moe_layer(l)) continue;
    partition::LayerProfile& layer = profile.layers.at(static_cast<size_t>(l + 1));
    for (size_t p = 0; p < layer.costs.size(); ++p) {
      const double tokens = static_cast<double>(profile.microbatch_sizes.at(p) * tokens_per_row);
      const auto more = static_cast<int64_t>(
          std::llround((imbalance - 1.0) * tokens * config.num_experts_per_tok * row));
      layer.costs[p].activation_bytes += more;
      layer.costs[p].split_activation_bytes += more;
      layer.costs[p].split_first_activation_bytes += more;
    }
  }
}

}  // namespace pipetrain::models
