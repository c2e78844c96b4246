// Model registry (model_registry.h).
#include "pipetrain/examples/model_registry.h"

#include <set>

#include <torch/nn/functional/loss.h>

#include "pipetrain/examples/cnn.h"
#include "pipetrain/examples/gpt.h"
#include "pipetrain/examples/mlp.h"

namespace pipetrain::examples {
namespace {

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// Checks that `options` is an object holding only `keys`, then merges it over `defaults`.
nlohmann::json resolve(const std::string& model, const nlohmann::json& options,
                       const nlohmann::json& defaults) {
  if (options.is_null()) return defaults;
  if (!options.is_object()) {
    throw ModelOptionError("options of model '" + model + "' must be a JSON object, got " +
                           options.dump());
  }
  nlohmann::json resolved = defaults;
  for (const auto& [key, value] : options.items()) {
    if (!defaults.contains(key)) {
      std::vector<std::string> valid;
      for (const auto& entry : defaults.items()) valid.push_back(entry.key());
      throw ModelOptionError("model '" + model + "' has no option '" + key +
                             "'; valid options: " + join(valid));
    }
    const nlohmann::json& expected = defaults.at(key);
    bool same_kind = (expected.is_number() && value.is_number()) ||
                     (expected.is_boolean() && value.is_boolean()) ||
                     (expected.is_array() && value.is_array());
    if (!same_kind || (expected.is_number_integer() && !value.is_number_integer())) {
      throw ModelOptionError("option '" + key + "' of model '" + model + "' must be like " +
                             expected.dump() + ", got " + value.dump());
    }
    resolved[key] = value;
  }
  return resolved;
}

torch::Tensor class_cross_entropy(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(output, target);
}

}  // namespace

std::vector<std::string> model_names() {
  return {"mlp", "cnn", "gpt"};
}

ExampleModel make_model(const std::string& name, const nlohmann::json& options) {
  ExampleModel result;
  result.name = name;
  try {
    if (name == "mlp") {
      result.options = resolve(name, options, {{"widths", {784, 512, 256, 10}}});
      for (const auto& width : result.options["widths"]) {
        if (!width.is_number_integer()) {
          throw ModelOptionError("option 'widths' of model 'mlp' must hold integers, got " +
                                 result.options["widths"].dump());
        }
      }
      result.sequential =
          make_mlp(MlpOptions().widths(result.options["widths"].get<std::vector<int64_t>>()));
      result.loss = class_cross_entropy;
    } else if (name == "cnn") {
      result.options = resolve(name, options, {{"width", 32}, {"blocks", 1}, {"classes", 10}});
      result.sequential = make_cnn(CnnOptions()
                                       .width(result.options["width"].get<int64_t>())
                                       .blocks(result.options["blocks"].get<int64_t>())
                                       .classes(result.options["classes"].get<int64_t>()));
      result.loss = class_cross_entropy;
    } else if (name == "gpt") {
      result.options = resolve(name, options,
                               {{"vocab_size", 256},
                                {"context", 64},
                                {"embed_dim", 128},
                                {"heads", 4},
                                {"layers", 4},
                                {"tie_embeddings", true},
                                {"dropout", 0.0}});
      const nlohmann::json& o = result.options;
      Gpt gpt = make_gpt(GptOptions(o["vocab_size"].get<int64_t>())
                             .context(o["context"].get<int64_t>())
                             .embed_dim(o["embed_dim"].get<int64_t>())
                             .heads(o["heads"].get<int64_t>())
                             .layers(o["layers"].get<int64_t>())
                             .tie_embeddings(o["tie_embeddings"].get<bool>())
                             .dropout(o["dropout"].get<double>()));
      result.sequential = gpt.model;
      result.tied_parameters = gpt.tied_parameters;
      result.loss = gpt_loss;
    } else {
      throw ModelOptionError("unknown model '" + name + "'; valid models: " + join(model_names()));
    }
  } catch (const nlohmann::json::exception& e) {
    throw ModelOptionError("options of model '" + name + "': " + e.what());
  }
  return result;
}

int64_t count_parameters(const torch::nn::Module& module) {
  std::set<const void*> seen;
  int64_t total = 0;
  for (const auto& parameter : module.parameters()) {
    if (seen.insert(parameter.unsafeGetTensorImpl()).second) total += parameter.numel();
  }
  return total;
}

}  // namespace pipetrain::examples
