// A Llama-family model's profile from one decoder layer (models/llama_profile.h).
#include "pipetrain/models/llama_profile.h"

#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/models/llama.h"

namespace pipetrain::models {

partition::ModelProfile profile_llama(const LlamaConfig& config, const torch::Tensor& sample,
                                      const partition::ProfileOptions& options, uint64_t seed,
                                      const parallel::TensorParallel& tp) {
  if (sample.dim() != 2 || sample.scalar_type() != torch::kInt64) {
    throw BadInput("profile_llama: the sample must be int64 token ids [B, T], got " +
                   std::string(c10::toString(sample.scalar_type())) + " of " +
                   std::to_string(sample.dim()) + " dimensions");
  }
  LlamaConfig one = config;
  one.num_hidden_layers = 1;
  one.sliding_window.assign(1, config.sliding_window.empty() ? 0 : config.sliding_window.back());
  LlamaModel model = make_llama(one, LlamaBuildOptions().tensor_parallel(tp));
  init_llama_random(model, seed);
  const partition::ModelProfile measured =
      partition::profile_sequential(model.sequential, sample, options);
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
  expanded.layers.push_back(profile.layers.front());
  for (int64_t l = 0; l < layers; ++l) {
    expanded.layers.push_back(profile.layers[static_cast<size_t>(std::min(l, measured - 1) + 1)]);
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

}  // namespace pipetrain::models
