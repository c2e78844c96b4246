// TokenBatches: the mini-batches of a language model's training run over a token file
// (io/token_file.h), as a Trainer's batch source (train/batch_source.h).
//
//   samples S = (tokens - 1) / T          sample s = ids [s*T, s*T + T]: input its first T ids,
//                                         target its last T (each position's next id)
//   per epoch ceil(S / N) batches         batch b of epoch e: samples order_e[(b*N + n) mod S],
//                                         n = 0..N-1 (a short last batch wraps to the first
//                                         samples, so every batch has N rows)
//   order_e = 0..S-1 in order, or with shuffle a permutation that depends only on (seed, e)
//             (base/shuffle.h), so a resumed run reads the same batches
//
// The loss over such a batch (models/llama.h, causal_lm_loss) is the mean cross-entropy over all
// N*T target ids; micro-batches of equal rows weight it the same, so pipelining does not change it.
//
// evaluate_tokens() is the held-out side: the mean loss over every sample of a file in order
// (no wrap), and its perplexity exp(loss).
//
// Ownership: shares the TokenFile. Thread-safety: at() is const; one order is cached per epoch
// under a mutex.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "pipetrain/io/token_file.h"
#include "pipetrain/train/batch_source.h"

namespace pipetrain::train {

class TokenBatches final : public BatchSource {
 public:
  // REQUIRES seq_len >= 1, batch_size >= 1 and at least one sample; throws BadInput naming the
  // file, its ids and the sequence length otherwise.
  TokenBatches(std::shared_ptr<const io::TokenFile> file, int64_t seq_len, int64_t batch_size,
               bool shuffle = false, uint64_t seed = 0);

  // (inputs int64 [N, T], targets int64 [N, T]) of global step k.
  std::pair<torch::Tensor, torch::Tensor> at(int64_t k) const override;
  int64_t per_epoch() const override;
  int64_t samples() const { return samples_; }
  // Sample s as (input [T], target [T]).
  std::pair<torch::Tensor, torch::Tensor> sample(int64_t s) const;

 private:
  std::shared_ptr<const io::TokenFile> file_;
  int64_t seq_len_, batch_size_, samples_;
  bool shuffle_;
  uint64_t seed_;
  mutable std::mutex mutex_;
  mutable int64_t cached_epoch_ = -1;  // guarded by mutex_
  mutable std::vector<int64_t> cached_order_;
};

struct TokenEvaluation {
  double loss = 0;        // mean cross-entropy per target id, nats
  double perplexity = 0;  // exp(loss)
  int64_t samples = 0;
  int64_t tokens = 0;  // target ids scored
};

// The mean loss of `forward` (int64 [n, T] -> logits [n, T, V], or an undefined tensor on a rank
// that does not hold the last stage) over every sample of `file`, `batch` samples per call, in
// order. `forward` runs in whatever mode the caller set (eval mode, no grad). Returns the loss
// where the logits were seen; where they never were (another rank's), samples and tokens are
// counted and loss stays 0.
TokenEvaluation evaluate_tokens(const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                                const io::TokenFile& file, int64_t seq_len, int64_t batch);

}  // namespace pipetrain::train
