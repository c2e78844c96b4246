// The GPT example model (gpt.h).
#include "pipetrain/examples/gpt.h"

#include <cmath>

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>

namespace pipetrain::examples {
namespace {

constexpr double kInitStd = 0.02;  // GPT-2's initialization

void init_linear(torch::nn::Linear& linear) {
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(linear->weight, 0.0, kInitStd);
  if (linear->bias.defined()) torch::nn::init::zeros_(linear->bias);
}

void check_options(const GptOptions& o) {
  TORCH_CHECK(o.vocab_size() > 0 && o.context() > 0 && o.embed_dim() > 0 && o.heads() > 0 &&
                  o.layers() >= 0,
              "GPT needs positive vocab_size, context, embed_dim, heads and layers >= 0; got ",
              "vocab_size ", o.vocab_size(), ", context ", o.context(), ", embed_dim ",
              o.embed_dim(), ", heads ", o.heads(), ", layers ", o.layers());
  TORCH_CHECK(o.embed_dim() % o.heads() == 0, "GPT embed_dim ", o.embed_dim(),
              " is not divisible by heads ", o.heads(), "; pick embed_dim = heads * head size");
  TORCH_CHECK(o.dropout() >= 0.0 && o.dropout() < 1.0, "GPT dropout must be in [0, 1), got ",
              o.dropout());
}

}  // namespace

GptEmbeddingImpl::GptEmbeddingImpl(const GptOptions& options_) : options(options_) {
  reset();
}

void GptEmbeddingImpl::reset() {
  check_options(options);
  token_embedding = register_module(
      "token_embedding", torch::nn::Embedding(options.vocab_size(), options.embed_dim()));
  position_embedding = register_parameter("position_embedding",
                                          torch::zeros({options.context(), options.embed_dim()}));
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(token_embedding->weight, 0.0, kInitStd);
  torch::nn::init::normal_(position_embedding, 0.0, kInitStd);
}

torch::Tensor GptEmbeddingImpl::forward(torch::Tensor tokens) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kInt64,
              "GPT embedding expects int64 tokens [B, T], got ", tokens.scalar_type(), " ",
              tokens.sizes());
  const int64_t t = tokens.size(1);
  TORCH_CHECK(t <= options.context(), "GPT: sequence length ", t, " exceeds the context ",
              options.context(), "; use shorter windows or a larger context");
  return token_embedding->forward(tokens) + position_embedding.narrow(0, 0, t);
}

GptBlockImpl::GptBlockImpl(const GptOptions& options_) : options(options_) {
  reset();
}

void GptBlockImpl::reset() {
  check_options(options);
  const int64_t c = options.embed_dim();
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c})));
  qkv = register_module("qkv", torch::nn::Linear(c, 3 * c));
  attention_projection = register_module("attention_projection", torch::nn::Linear(c, c));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c})));
  mlp_in = register_module("mlp_in", torch::nn::Linear(c, 4 * c));
  mlp_out = register_module("mlp_out", torch::nn::Linear(4 * c, c));
  dropout = register_module("dropout", torch::nn::Dropout(options.dropout()));
  for (torch::nn::Linear* linear : {&qkv, &attention_projection, &mlp_in, &mlp_out}) {
    init_linear(*linear);
  }
}

torch::Tensor GptBlockImpl::causal_attention(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  const int64_t h = options.heads(), d = c / h;
  // [B,T,3C] -> 3 x [B,h,T,d]
  std::vector<torch::Tensor> parts = qkv->forward(x).view({b, t, 3, h, d}).unbind(2);
  torch::Tensor q = parts[0].transpose(1, 2);
  torch::Tensor k = parts[1].transpose(1, 2);
  torch::Tensor v = parts[2].transpose(1, 2);
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
  // Position t may attend to 0..t only: mask the strict upper triangle (keys after the query).
  torch::Tensor future =
      torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  torch::Tensor weights = dropout->forward(torch::softmax(scores, -1));
  torch::Tensor out = torch::matmul(weights, v).transpose(1, 2).reshape({b, t, c});
  return dropout->forward(attention_projection->forward(out));
}

torch::Tensor GptBlockImpl::forward(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 3 && x.size(2) == options.embed_dim(), "GPT block expects [B, T, ",
              options.embed_dim(), "], got ", x.sizes());
  x = x + causal_attention(ln1->forward(x));
  torch::Tensor hidden = torch::gelu(mlp_in->forward(ln2->forward(x)));
  return x + dropout->forward(mlp_out->forward(hidden));
}

GptHeadImpl::GptHeadImpl(const GptOptions& options_, torch::Tensor tied_weight)
    : options(options_), tied_weight_(std::move(tied_weight)) {
  reset();
}

void GptHeadImpl::reset() {
  check_options(options);
  if (tied_weight_.defined()) {
    TORCH_CHECK(
        tied_weight_.sizes() == torch::IntArrayRef({options.vocab_size(), options.embed_dim()}),
        "GPT head: the tied weight has shape ", tied_weight_.sizes(), ", expected [",
        options.vocab_size(), ", ", options.embed_dim(), "]");
    weight = register_parameter("weight", tied_weight_);
  } else {
    weight =
        register_parameter("weight", torch::empty({options.vocab_size(), options.embed_dim()}));
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(weight, 0.0, kInitStd);
  }
}

torch::Tensor GptHeadImpl::forward(torch::Tensor x) {
  return torch::matmul(x, weight.t());
}

Gpt make_gpt(const GptOptions& options) {
  check_options(options);
  Gpt gpt;
  GptEmbedding embedding(options);
  gpt.model->push_back(embedding);
  for (int64_t l = 0; l < options.layers(); ++l) gpt.model->push_back(GptBlock(options));
  gpt.model->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({options.embed_dim()})));
  torch::Tensor tied =
      options.tie_embeddings() ? embedding->token_embedding->weight : torch::Tensor();
  gpt.model->push_back(GptHead(options, tied));
  if (options.tie_embeddings()) {
    gpt.tied_parameters.emplace_back("0.token_embedding.weight",
                                     std::to_string(options.layers() + 2) + ".weight");
  }
  return gpt;
}

torch::Tensor gpt_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  TORCH_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
                  logits.size(1) == targets.size(1),
              "gpt_loss expects logits [B, T, V] and targets [B, T], got ", logits.sizes(), " and ",
              targets.sizes());
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(2)}),
                                              targets.reshape({-1}));
}

}  // namespace pipetrain::examples
