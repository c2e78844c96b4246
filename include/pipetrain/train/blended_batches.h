// BlendedTokenBatches: mini-batches drawn from several token streams by weight, as Megatron's
// blended dataset (`--data-path 0.7 A 0.3 B`) draws its samples: a Trainer's batch source
// (train/batch_source.h) over the samples of train/token_batches.h.
//
//   weights w_d, normalized to sum 1        dataset d's samples S_d = (ids_d - 1) / T
//   blend sample g (g = k*N + n, over the   dataset: the d with the largest w_d * max(g, 1) - c_d,
//   whole run, epochs included)             the first on a tie, where c_d counts the samples
//                                           taken from d before g; then c_d += 1
//   the c-th sample taken from d            its sample c mod S_d, or with shuffle the
//                                           (c mod S_d)-th of a permutation of 0..S_d-1 that
//                                           depends only on (seed, d, c / S_d) (base/shuffle.h)
//   per epoch ceil(sum_d S_d / N) batches
//
// So after g samples each dataset has given within one of w_d * g, the blend is a pure function of
// the step (a resumed run reads the same batches), and every rank computes the same one.
//
// Ownership: shares the token files. Thread-safety: at() is const; its cache of the walk so far
// is guarded by a mutex.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "pipetrain/io/token_file.h"
#include "pipetrain/train/batch_source.h"

namespace pipetrain::train {

struct BlendPart {
  double weight = 1;
  std::shared_ptr<const io::TokenFile> file;
};

class BlendedTokenBatches final : public BatchSource {
 public:
  // REQUIRES at least one part, each weight finite and > 0, each file holding a sample of
  // seq_len; seq_len, batch_size >= 1. Throws BadInput naming the part otherwise.
  BlendedTokenBatches(std::vector<BlendPart> parts, int64_t seq_len, int64_t batch_size,
                      bool shuffle = false, uint64_t seed = 0);

  // (inputs int64 [N, T], targets int64 [N, T]) of global step k.
  std::pair<torch::Tensor, torch::Tensor> at(int64_t k) const override;
  int64_t per_epoch() const override;
  // The dataset and its sample index of blend sample g (above).
  std::pair<size_t, int64_t> source_of(int64_t g) const;

 private:
  std::vector<BlendPart> parts_;
  std::vector<double> weights_;   // normalized
  std::vector<int64_t> samples_;  // S_d
  int64_t seq_len_, batch_size_;
  bool shuffle_;
  uint64_t seed_;
  // The walk: counts c_d after walked_ samples (guarded by mutex_).
  mutable std::mutex mutex_;
  mutable int64_t walked_ = 0;
  mutable std::vector<int64_t> taken_;
  // Per dataset: the epoch whose shuffled order is cached, and that order (guarded by mutex_).
  mutable std::vector<std::pair<int64_t, std::vector<int64_t>>> orders_;
};

}  // namespace pipetrain::train
