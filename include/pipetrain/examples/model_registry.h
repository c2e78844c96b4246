// make_model: the example models by name ("mlp", "cnn", "gpt"), with JSON options.
//
// The CLI's `--model NAME` goes through here. Options are a JSON object whose keys are the
// fields of the model's options struct (MlpOptions, CnnOptions, GptOptions); unknown keys and
// names are errors that list what is valid. The resolved options (defaults filled in) come back
// in ExampleModel::options, ready for a checkpoint's metadata, so a run can be rebuilt exactly.
//
// Initial weights come from torch's global generator: call torch::manual_seed(seed) right before
// make_model to get the same weights in every process of a multi-process run.
//
// Thread-safety: no shared state beyond torch's global generator.
//
// Example:
//   ExampleModel m = make_model("cnn", {{"width", 32}});
//   torch::Tensor loss = m.loss(m.sequential->forward(images), labels);
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/modules/container/sequential.h>
#include <nlohmann/json.hpp>

#include "pipetrain/base/error.h"

namespace pipetrain::examples {

// Bad model name or options: user input, exit code 2 in the CLI.
class ModelOptionError : public pipetrain::BadInput {
 public:
  using pipetrain::BadInput::BadInput;
};

using LossFunction =
    std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;

struct ExampleModel {
  std::string name;
  torch::nn::Sequential sequential;
  // Parameter names (in sequential->named_parameters()) that are one shared tensor; see gpt.h.
  std::vector<std::pair<std::string, std::string>> tied_parameters;
  // cross_entropy over classes [B, classes] for mlp and cnn; gpt_loss over [B*T, V] for gpt.
  LossFunction loss;
  // The options used, every field present (defaults filled in).
  nlohmann::json options;
};

// "mlp", "cnn", "gpt".
std::vector<std::string> model_names();

// Options per model (all optional):
//   mlp: widths [int...]                         default [784, 512, 256, 10]
//   cnn: width int, blocks int, classes int      default 32, 1, 10
//   gpt: vocab_size int (default 256; set it to the corpus's), context 64, embed_dim 128,
//        heads 4, layers 4, tie_embeddings true, dropout 0.0
// Throws ModelOptionError for an unknown name (listing the valid ones), an unknown option key
// (listing the model's keys), or a value of the wrong JSON type; c10::Error for invalid values.
ExampleModel make_model(const std::string& name,
                        const nlohmann::json& options = nlohmann::json::object());

// Number of distinct parameter elements (a tied tensor counts once).
int64_t count_parameters(const torch::nn::Module& module);

}  // namespace pipetrain::examples
