// Which parameters reach the computation only through autocast's casts
// (stage/autocast_parameters.h): the linears' and convolutions' weights and biases, what a module
// declares for itself or its children, and nothing a float32 reader also holds.
#include "pipetrain/stage/autocast_parameters.h"

#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace pipetrain {
namespace {

std::set<const void*> keys(const std::vector<torch::Tensor>& tensors) {
  std::set<const void*> out;
  for (const torch::Tensor& t : tensors) out.insert(t.unsafeGetTensorImpl());
  return out;
}

// A head that reads a weight through a linear (and says so), and a model whose head holds the
// embedding's table (a tied weight).
struct HeadImpl : torch::nn::Module, AutocastCastParameters {
  explicit HeadImpl(torch::Tensor tied) { weight = register_parameter("weight", std::move(tied)); }
  std::vector<torch::Tensor> autocast_cast_parameters() const override { return {weight}; }
  torch::Tensor weight;
};

struct TiedImpl : torch::nn::Module {
  TiedImpl() {
    embedding = register_module("embedding", torch::nn::Embedding(10, 4));
    head = register_module("head", std::make_shared<HeadImpl>(embedding->weight));
  }
  torch::nn::Embedding embedding{nullptr};
  std::shared_ptr<HeadImpl> head;
};

// A plain holder of a weight and a bias (as a Llama projection is), and a parent that reads the
// weight through a linear and adds the bias itself, in float32.
struct HolderImpl : torch::nn::Module {
  HolderImpl() {
    weight = register_parameter("weight", torch::ones({3, 3}));
    bias = register_parameter("bias", torch::zeros({3}));
  }
  torch::Tensor weight, bias;
};

struct DeclaringImpl : torch::nn::Module, AutocastCastParameters {
  DeclaringImpl() {
    inner = register_module("inner", std::make_shared<HolderImpl>());
    scale = register_parameter("scale", torch::ones({3}));
  }
  std::vector<torch::Tensor> autocast_cast_parameters() const override { return {inner->weight}; }
  std::shared_ptr<HolderImpl> inner;
  torch::Tensor scale;
};

TEST(AutocastCastParameters, LinearsAndConvolutionsQualifyAndNormsAndEmbeddingsDoNot) {
  torch::nn::Sequential model(
      torch::nn::Linear(4, 8), torch::nn::LayerNorm(std::vector<int64_t>{8}),
      torch::nn::Conv2d(1, 2, 3), torch::nn::Embedding(5, 8), torch::nn::BatchNorm1d(8));
  const std::set<const void*> got = keys(autocast_cast_parameters(*model));
  std::set<const void*> want;
  for (const std::string name : {"0.weight", "0.bias", "2.weight", "2.bias"}) {
    want.insert(model->named_parameters()[name].unsafeGetTensorImpl());
  }
  EXPECT_EQ(got, want);
}

TEST(AutocastCastParameters, ATiedWeightAnEmbeddingReadsDoesNotQualify) {
  auto tied = std::make_shared<TiedImpl>();
  EXPECT_TRUE(autocast_cast_parameters(*tied).empty());
  // The head alone names it.
  EXPECT_EQ(keys(autocast_cast_parameters(*tied->head)), keys({tied->embedding->weight}));
}

TEST(AutocastCastParameters, AModuleNamesItsChildrensParametersTheWayItsForwardUsesThem) {
  auto module = std::make_shared<DeclaringImpl>();
  EXPECT_EQ(keys(autocast_cast_parameters(*module)), keys({module->inner->weight}));
  // The holder on its own names nothing.
  EXPECT_TRUE(autocast_cast_parameters(*module->inner).empty());
}

}  // namespace
}  // namespace pipetrain
