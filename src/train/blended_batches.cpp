// Blended mini-batches of several token streams (train/blended_batches.h).
#include "pipetrain/train/blended_batches.h"

#include <cmath>
#include <string>

#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/base/shuffle.h"

namespace pipetrain::train {

BlendedTokenBatches::BlendedTokenBatches(std::vector<BlendPart> parts, int64_t seq_len,
                                         int64_t batch_size, bool shuffle, uint64_t seed)
    : parts_(std::move(parts)),
      seq_len_(seq_len),
      batch_size_(batch_size),
      shuffle_(shuffle),
      seed_(seed) {
  if (parts_.empty()) throw BadInput("a blend needs at least one dataset");
  if (seq_len_ < 1) {
    throw BadInput("sequence length must be at least 1, got " + std::to_string(seq_len_));
  }
  if (batch_size_ < 1) {
    throw BadInput("batch size must be at least 1, got " + std::to_string(batch_size_));
  }
  double total = 0;
  for (size_t d = 0; d < parts_.size(); ++d) {
    const BlendPart& part = parts_[d];
    if (!part.file) throw BadInput("blend dataset " + std::to_string(d) + " has no token file");
    if (!std::isfinite(part.weight) || part.weight <= 0) {
      throw BadInput("blend dataset " + std::to_string(d) + " ('" + part.file->path() +
                     "') has weight " + std::to_string(part.weight) + "; weights must be > 0");
    }
    const int64_t samples = (part.file->tokens() - 1) / seq_len_;
    if (samples < 1) {
      throw BadInput("blend dataset " + std::to_string(d) + " ('" + part.file->path() +
                     "') holds " + std::to_string(part.file->tokens()) +
                     " ids, fewer than one sample of --seq-len " + std::to_string(seq_len_) +
                     " needs (" + std::to_string(seq_len_ + 1) + ")");
    }
    samples_.push_back(samples);
    total += part.weight;
  }
  for (const BlendPart& part : parts_) weights_.push_back(part.weight / total);
  taken_.assign(parts_.size(), 0);
  orders_.assign(parts_.size(), {-1, {}});
}

int64_t BlendedTokenBatches::per_epoch() const {
  int64_t samples = 0;
  for (int64_t s : samples_) samples += s;
  return (samples + batch_size_ - 1) / batch_size_;
}

std::pair<size_t, int64_t> BlendedTokenBatches::source_of(int64_t g) const {
  if (g < 0) throw BadInput("blend sample " + std::to_string(g) + " is negative");
  std::lock_guard<std::mutex> lock(mutex_);
  if (g < walked_) {  // an earlier step (a resumed run reads forward from its step): walk again
    walked_ = 0;
    taken_.assign(parts_.size(), 0);
  }
  for (;; ++walked_) {
    const double at = static_cast<double>(std::max<int64_t>(walked_, 1));
    size_t best = 0;
    double best_error = weights_[0] * at - static_cast<double>(taken_[0]);
    for (size_t d = 1; d < parts_.size(); ++d) {
      const double error = weights_[d] * at - static_cast<double>(taken_[d]);
      if (error > best_error) {
        best = d;
        best_error = error;
      }
    }
    const int64_t count = taken_[best]++;
    if (walked_ == g) {
      ++walked_;
      return {best, count};
    }
  }
}

std::pair<torch::Tensor, torch::Tensor> BlendedTokenBatches::at(int64_t k) const {
  torch::Tensor inputs = torch::empty({batch_size_, seq_len_}, torch::kInt64);
  torch::Tensor targets = torch::empty({batch_size_, seq_len_}, torch::kInt64);
  for (int64_t n = 0; n < batch_size_; ++n) {
    const auto [d, count] = source_of(k * batch_size_ + n);
    const int64_t samples = samples_[d];
    int64_t s = count % samples;
    if (shuffle_) {
      const int64_t epoch = count / samples;
      std::lock_guard<std::mutex> lock(mutex_);
      auto& [cached, order] = orders_[d];
      if (cached != epoch) {
        order = shuffled_order(samples, mix_seed(seed_, d), static_cast<uint64_t>(epoch));
        cached = epoch;
      }
      s = order[static_cast<size_t>(s)];
    }
    const torch::Tensor ids = parts_[d].file->read(s * seq_len_, seq_len_ + 1);
    inputs[n].copy_(ids.narrow(0, 0, seq_len_));
    targets[n].copy_(ids.narrow(0, 1, seq_len_));
  }
  return {inputs, targets};
}

}  // namespace pipetrain::train
