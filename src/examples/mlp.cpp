// The MLP example model (mlp.h).
#include "pipetrain/examples/mlp.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>

namespace pipetrain::examples {

torch::nn::Sequential make_mlp(const MlpOptions& options) {
  const std::vector<int64_t>& widths = options.widths();
  TORCH_CHECK(widths.size() >= 2, "MLP needs at least 2 widths (input and output), got ",
              widths.size());
  for (int64_t width : widths) {
    TORCH_CHECK(width > 0, "MLP widths must be positive, got ", width);
  }
  torch::nn::Sequential model;
  model->push_back(torch::nn::Flatten());
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    model->push_back(torch::nn::Linear(widths[l], widths[l + 1]));
    if (l + 2 < widths.size()) model->push_back(torch::nn::ReLU());
  }
  return model;
}

}  // namespace pipetrain::examples
