// Mini-batches of a token file, and its evaluation (train/token_batches.h).
#include "pipetrain/train/token_batches.h"

#include <cmath>

#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/base/shuffle.h"

namespace pipetrain::train {

TokenBatches::TokenBatches(std::shared_ptr<const io::TokenFile> file, int64_t seq_len,
                           int64_t batch_size, bool shuffle, uint64_t seed)
    : file_(std::move(file)),
      seq_len_(seq_len),
      batch_size_(batch_size),
      samples_(0),
      shuffle_(shuffle),
      seed_(seed) {
  if (!file_) throw BadInput("TokenBatches needs a token file");
  if (seq_len_ < 1)
    throw BadInput("sequence length must be at least 1, got " + std::to_string(seq_len_));
  if (batch_size_ < 1) {
    throw BadInput("batch size must be at least 1, got " + std::to_string(batch_size_));
  }
  samples_ = (file_->tokens() - 1) / seq_len_;
  if (samples_ < 1) {
    throw BadInput("token file '" + file_->path() + "' holds " + std::to_string(file_->tokens()) +
                   " ids, fewer than one sample of --seq-len " + std::to_string(seq_len_) +
                   " needs (" + std::to_string(seq_len_ + 1) + ")");
  }
}

int64_t TokenBatches::per_epoch() const {
  return (samples_ + batch_size_ - 1) / batch_size_;
}

std::pair<torch::Tensor, torch::Tensor> TokenBatches::sample(int64_t s) const {
  torch::Tensor ids = file_->read(s * seq_len_, seq_len_ + 1);
  return {ids.narrow(0, 0, seq_len_), ids.narrow(0, 1, seq_len_)};
}

std::pair<torch::Tensor, torch::Tensor> TokenBatches::at(int64_t k) const {
  const int64_t epoch = k / per_epoch(), b = k % per_epoch();
  std::vector<int64_t> chosen(static_cast<size_t>(batch_size_));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (shuffle_ && cached_epoch_ != epoch) {
      cached_order_ = shuffled_order(samples_, seed_, static_cast<uint64_t>(epoch));
      cached_epoch_ = epoch;
    }
    for (int64_t n = 0; n < batch_size_; ++n) {
      const int64_t position = (b * batch_size_ + n) % samples_;
      chosen[static_cast<size_t>(n)] =
          shuffle_ ? cached_order_[static_cast<size_t>(position)] : position;
    }
  }
  torch::Tensor inputs = torch::empty({batch_size_, seq_len_}, torch::kInt64);
  torch::Tensor targets = torch::empty({batch_size_, seq_len_}, torch::kInt64);
  for (int64_t n = 0; n < batch_size_; ++n) {
    auto [input, target] = sample(chosen[static_cast<size_t>(n)]);
    inputs[n].copy_(input);
    targets[n].copy_(target);
  }
  return {inputs, targets};
}

TokenEvaluation evaluate_tokens(const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                                const io::TokenFile& file, int64_t seq_len, int64_t batch) {
  if (batch < 1)
    throw BadInput("evaluation batch must be at least 1, got " + std::to_string(batch));
  // Every sample once, in order: a TokenBatches without wrap-around.
  const TokenBatches samples(std::shared_ptr<const io::TokenFile>(&file, [](const auto*) {}),
                             seq_len, 1);
  TokenEvaluation result;
  double loss_sum = 0;  // summed over target ids
  bool seen = false;
  torch::NoGradGuard no_grad;
  for (int64_t first = 0; first < samples.samples(); first += batch) {
    const int64_t n = std::min(batch, samples.samples() - first);
    torch::Tensor inputs = torch::empty({n, seq_len}, torch::kInt64);
    torch::Tensor targets = torch::empty({n, seq_len}, torch::kInt64);
    for (int64_t s = 0; s < n; ++s) {
      auto [input, target] = samples.sample(first + s);
      inputs[s].copy_(input);
      targets[s].copy_(target);
    }
    torch::Tensor logits = forward(inputs);
    if (logits.defined()) {
      seen = true;
      logits = logits.to(torch::kCPU, torch::kFloat32);
      loss_sum += torch::nn::functional::cross_entropy(
                      logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}),
                      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                      .item<double>();
    }
    result.samples += n;
    result.tokens += n * seq_len;
  }
  if (seen) {
    result.loss = loss_sum / static_cast<double>(result.tokens);
    result.perplexity = std::exp(result.loss);
  }
  return result;
}

}  // namespace pipetrain::train
