// The ResNet-style CNN example model (cnn.h).
#include "pipetrain/examples/cnn.h"

#include <string>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include "pipetrain/stage/skip_layers.h"

namespace pipetrain::examples {
namespace {

torch::nn::Conv2d conv3x3(int64_t in, int64_t out, int64_t stride = 1) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

void add_residual_block(torch::nn::Sequential& model, const std::string& name, int64_t channels) {
  model->push_back(SkipStash(name));
  model->push_back(conv3x3(channels, channels));
  model->push_back(torch::nn::BatchNorm2d(channels));
  model->push_back(torch::nn::ReLU());
  model->push_back(conv3x3(channels, channels));
  model->push_back(torch::nn::BatchNorm2d(channels));
  model->push_back(SkipPopAdd(name));
  model->push_back(torch::nn::ReLU());
}

}  // namespace

torch::nn::Sequential make_cnn(const CnnOptions& options) {
  const int64_t w = options.width();
  TORCH_CHECK(w > 0 && options.blocks() >= 0 && options.classes() > 0,
              "CNN needs width > 0, blocks >= 0 and classes > 0, got width ", w, ", blocks ",
              options.blocks(), ", classes ", options.classes());
  torch::nn::Sequential model;
  model->push_back(conv3x3(1, w));
  model->push_back(torch::nn::BatchNorm2d(w));
  model->push_back(torch::nn::ReLU());
  model->push_back(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)));
  for (int64_t k = 0; k < options.blocks(); ++k) {
    add_residual_block(model, "res0." + std::to_string(k), w);
  }
  model->push_back(conv3x3(w, 2 * w, /*stride=*/2));
  model->push_back(torch::nn::BatchNorm2d(2 * w));
  model->push_back(torch::nn::ReLU());
  for (int64_t k = 0; k < options.blocks(); ++k) {
    add_residual_block(model, "res1." + std::to_string(k), 2 * w);
  }
  model->push_back(torch::nn::Flatten());
  model->push_back(torch::nn::Linear(2 * w * 7 * 7, options.classes()));
  return model;
}

}  // namespace pipetrain::examples
