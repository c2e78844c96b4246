// DataLoader: seeded, resumable mini-batches over in-memory tensors.
//
// The order of epoch e is a pure function of (seed, e): a Fisher-Yates shuffle driven by a
// std::mt19937_64 seeded from the pair, with our own bounded draw (not std::shuffle, whose draws
// are implementation-defined). So the same seed gives the same batches on every run, on every
// thread count, and resuming at (epoch, batch) needs no saved generator state: seek() and go.
//
//   epoch 0: order(0) = [17, 3, 42, ...]  -> batch 0 = rows order(0)[0 .. B-1], batch 1 = ...
//   epoch 1: order(1) = [8, 55, 0, ...]   (a fresh shuffle, independent of how epoch 0 was read)
//
// The last batch of an epoch holds the remainder (size < B) unless drop_last is set.
//
// Ownership: holds (shares) the input and target tensors. Thread-safety: const methods may be
// called concurrently; next()/seek() mutate the position and need external synchronization.
//
// Example:
//   DataLoader loader(train.images, train.labels, DataLoaderOptions(128).seed(7));
//   loader.seek({resume_epoch, resume_batch});
//   while (loader.position().epoch < epochs) { Batch b = loader.next(); ... }
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/arg.h>
#include <torch/types.h>

#include "pipetrain/base/shuffle.h"
#include "pipetrain/train/batch_source.h"

namespace pipetrain::examples {

struct DataLoaderOptions {
  /* implicit */ DataLoaderOptions(int64_t batch_size) : batch_size_(batch_size) {}
  /// Samples per mini-batch. REQUIRES > 0.
  TORCH_ARG(int64_t, batch_size);
  /// Shuffle every epoch; false reads the samples in stored order. Default true.
  TORCH_ARG(bool, shuffle) = true;
  /// Seed of the per-epoch shuffles. Default 0.
  TORCH_ARG(uint64_t, seed) = 0;
  /// Drop the last batch of an epoch when it holds fewer than batch_size samples. Default false.
  TORCH_ARG(bool, drop_last) = false;
};

// Where the loader stands: the next batch next() returns is batch `batch` of epoch `epoch`.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t batch = 0;
  friend bool operator==(const LoaderPosition& a, const LoaderPosition& b) {
    return a.epoch == b.epoch && a.batch == b.batch;
  }
};

struct Batch {
  torch::Tensor inputs;   // rows of the inputs tensor
  torch::Tensor targets;  // the matching rows of the targets tensor
  int64_t epoch = 0;
  int64_t index = 0;  // batch index within the epoch
};

class DataLoader {
 public:
  // REQUIRES: inputs.size(0) == targets.size(0) > 0; batch_size > 0; with drop_last, at least
  // one full batch. Checked with TORCH_CHECK.
  DataLoader(torch::Tensor inputs, torch::Tensor targets, DataLoaderOptions options);

  int64_t num_samples() const { return inputs_.size(0); }
  int64_t batches_per_epoch() const;
  const DataLoaderOptions& options() const { return options_; }

  // The sample order of `epoch` (a permutation of 0..N-1, or the identity without shuffle).
  std::vector<int64_t> order(int64_t epoch) const;

  // Random access: batch `index` of `epoch`. REQUIRES 0 <= index < batches_per_epoch().
  Batch batch(int64_t epoch, int64_t index) const;

  // Sequential access: returns the batch at position() and advances, rolling over to batch 0 of
  // the next epoch after the last batch.
  Batch next();
  LoaderPosition position() const { return position_; }
  // REQUIRES: position.epoch >= 0 and 0 <= position.batch <= batches_per_epoch() (== rolls over).
  void seek(LoaderPosition position);

  // The loader's resumable state as text for a checkpoint's loader_state:
  //   {"seed": 7, "batch_size": 128, "shuffle": true, "drop_last": false, "samples": 60000,
  //    "epoch": 1, "batch": 42}
  // restore_state() seeks to the saved position after checking that the seed, batch size,
  // shuffle, drop_last and sample count match this loader's (a mismatch would silently train on
  // other batches); throws c10::Error naming the field that differs.
  std::string state() const;
  void restore_state(const std::string& state);

 private:
  const std::vector<int64_t>& cached_order(int64_t epoch) const;

  torch::Tensor inputs_;
  torch::Tensor targets_;
  DataLoaderOptions options_;
  LoaderPosition position_;
  mutable int64_t cached_epoch_ = -1;  // guarded by the caller (see thread-safety above)
  mutable std::vector<int64_t> cached_order_;
};

// The seeded draws shared by the samplers here (pipetrain/base/shuffle.h).
using pipetrain::mix_seed;
using pipetrain::uniform_below;

// The loader's batches as a Trainer's batch source (train/batch_source.h): step k is batch
// k % batches_per_epoch() of epoch k / batches_per_epoch(), shuffled as the loader shuffles.
class LoaderBatches final : public train::BatchSource {
 public:
  explicit LoaderBatches(DataLoader loader) : loader_(std::move(loader)) {}
  std::pair<torch::Tensor, torch::Tensor> at(int64_t k) const override {
    const Batch b = loader_.batch(k / per_epoch(), k % per_epoch());
    return {b.inputs, b.targets};
  }
  int64_t per_epoch() const override { return loader_.batches_per_epoch(); }

 private:
  DataLoader loader_;
};

}  // namespace pipetrain::examples
