// GPT: a decoder-only transformer language model as a flat Sequential.
//
//   tokens int64 [B,T]
//     -> GptEmbedding      token table [V,C] + learned positions [context,C]  -> [B,T,C]
//     -> GptBlock x layers pre-LN: x + attn(ln1(x)), then x + mlp(ln2(x))     -> [B,T,C]
//     -> LayerNorm ln_f                                                        -> [B,T,C]
//     -> GptHead           logits = x W^T, W [V,C]                             -> [B,T,V]
// Loss: gpt_loss = cross-entropy over [B*T, V] against next-token targets [B,T].
//
// Attention is written out with matmuls: scores = q k^T / sqrt(d), positions after t masked to
// -inf (causal), softmax, times v; so the output at position t depends on tokens 0..t only.
// Every boundary between entries carries one float tensor [B,T,C] (the first carries the int64
// tokens into the embedding).
//
// Tied embedding (tie_embeddings, default on): GptHead's `weight` IS the embedding's token table,
// the same tensor registered under two names (see Gpt::tied_parameters). In one process the
// shared leaf accumulates the gradients of both uses, which is the correct gradient. A runtime
// that puts the two layers on different processes holds two copies and must sum their gradients
// across the two ranks (and apply the same update to both) to keep them equal; and anything that
// walks `parameters()` sees the tensor twice, so optimizers, clipping and checkpoints must
// deduplicate (pipetrain::train::unique_parameters does). Cloning the module unties the copy.
//
// Thread-safety: returns fresh modules; no shared state between calls.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

namespace pipetrain::examples {

struct GptOptions {
  /* implicit */ GptOptions(int64_t vocab_size) : vocab_size_(vocab_size) {}
  /// Tokens in the vocabulary (V). REQUIRES > 0.
  TORCH_ARG(int64_t, vocab_size);
  /// Longest sequence (T <= context). Default 64.
  TORCH_ARG(int64_t, context) = 64;
  /// Embedding width (C). REQUIRES divisible by heads. Default 128.
  TORCH_ARG(int64_t, embed_dim) = 128;
  /// Attention heads. Default 4.
  TORCH_ARG(int64_t, heads) = 4;
  /// Transformer blocks. Default 4.
  TORCH_ARG(int64_t, layers) = 4;
  /// Share the token table between embedding and LM head. Default true.
  TORCH_ARG(bool, tie_embeddings) = true;
  /// Dropout on attention weights and residual branches while training. Default 0.
  TORCH_ARG(double, dropout) = 0.0;
};

// [B,T] int64 tokens -> [B,T,C]: token embedding plus learned position embedding.
class GptEmbeddingImpl : public torch::nn::Cloneable<GptEmbeddingImpl> {
 public:
  explicit GptEmbeddingImpl(const GptOptions& options);
  void reset() override;
  torch::Tensor forward(torch::Tensor tokens);

  GptOptions options;
  torch::nn::Embedding token_embedding{nullptr};
  torch::Tensor position_embedding;  // [context, C]
};
TORCH_MODULE(GptEmbedding);

// One pre-LN transformer block with causal multi-head self-attention. [B,T,C] -> [B,T,C].
class GptBlockImpl : public torch::nn::Cloneable<GptBlockImpl> {
 public:
  explicit GptBlockImpl(const GptOptions& options);
  void reset() override;
  torch::Tensor forward(torch::Tensor x);

  GptOptions options;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, attention_projection{nullptr};
  torch::nn::Linear mlp_in{nullptr}, mlp_out{nullptr};
  torch::nn::Dropout dropout{nullptr};

 private:
  torch::Tensor causal_attention(const torch::Tensor& x);
};
TORCH_MODULE(GptBlock);

// [B,T,C] -> logits [B,T,V] = x W^T. With `tied_weight` defined, W is that tensor (shared,
// not copied); otherwise the head owns a fresh [V,C] weight.
class GptHeadImpl : public torch::nn::Cloneable<GptHeadImpl> {
 public:
  GptHeadImpl(const GptOptions& options, torch::Tensor tied_weight = {});
  void reset() override;
  torch::Tensor forward(torch::Tensor x);

  GptOptions options;
  torch::Tensor weight;  // [V, C]

 private:
  torch::Tensor tied_weight_;
};
TORCH_MODULE(GptHead);

struct Gpt {
  torch::nn::Sequential model;  // embedding, block 0 .. block L-1, ln_f, head
  // Pairs of parameter names (in model->named_parameters()) that are one tensor:
  // {"0.token_embedding.weight", "<L+2>.weight"} when tied, else empty.
  std::vector<std::pair<std::string, std::string>> tied_parameters;
};

Gpt make_gpt(const GptOptions& options);

// Cross-entropy of logits [B,T,V] against targets [B,T], averaged over the B*T positions.
torch::Tensor gpt_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace pipetrain::examples
