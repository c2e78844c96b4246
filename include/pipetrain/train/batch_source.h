// BatchSource: the mini-batch of global step k, which a Trainer (train/trainer.h) trains on; and
// TensorBatches, the batch source of in-memory tensors.
//
// A batch is a pure function of k, so a checkpoint's step is all a resumed run needs to go on with
// the same data, and every rank of a run computes the same batch without talking to the others.
//
// TensorBatches reads rows in stored order: step k takes rows (k*N .. k*N+N-1) mod R of the R rows,
// N = batch_size. An epoch is ceil(R / N) steps; a batch that runs past the last row wraps to the
// first ones, so every batch has N rows.
//
// Ownership: TensorBatches shares the tensors. Thread-safety: const methods, safe concurrently.
//
// Example:
//   train::TensorBatches batches(inputs, targets, 32);
//   train::Trainer trainer(model, *runner, batches, train::TrainerOptions(100));
#pragma once

#include <cstdint>
#include <utility>

#include <torch/types.h>

#include "pipetrain/data/batch.h"

namespace pipetrain::train {

// The mini-batch of global step k. Every rank of a run must return the same batch for the same k.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // (inputs, targets) of step k.
  virtual std::pair<torch::Tensor, torch::Tensor> at(int64_t k) const = 0;
  // Step k's batch as the runner takes it (data/batch.h): at(k)'s rows, or, from a source of
  // documents, their row weights and token layout too.
  virtual data::Batch batch(int64_t k) const {
    auto [inputs, targets] = at(k);
    return data::Batch(std::move(inputs), std::move(targets));
  }
  // A batch of the largest shape the source makes: what memory and plans are made for (at(0),
  // unless batches differ in shape: documents padded to their own longest row).
  virtual std::pair<torch::Tensor, torch::Tensor> largest() const { return at(0); }
  // Batches per epoch; 0 when the data has no epochs (a stream of sampled windows).
  virtual int64_t per_epoch() const = 0;

  int64_t epoch_of(int64_t k) const { return per_epoch() > 0 ? k / per_epoch() : 0; }
  bool ends_epoch(int64_t k) const { return per_epoch() > 0 && (k + 1) % per_epoch() == 0; }
  // Steps in `epochs` epochs (an epoch of a source without epochs counts one step).
  int64_t steps_in_epochs(int64_t epochs) const {
    return epochs * (per_epoch() > 0 ? per_epoch() : 1);
  }
  // Epochs that `steps` steps begin, the last maybe in part (1 for a source without epochs).
  int64_t epochs_begun(int64_t steps) const {
    return per_epoch() > 0 ? (steps + per_epoch() - 1) / per_epoch() : 1;
  }
};

class TensorBatches final : public BatchSource {
 public:
  // REQUIRES: inputs and targets have the same number of rows (dim 0), at least one; batch_size
  // >= 1. Throws pipetrain::BadInput naming both otherwise.
  TensorBatches(torch::Tensor inputs, torch::Tensor targets, int64_t batch_size);

  std::pair<torch::Tensor, torch::Tensor> at(int64_t k) const override;
  int64_t per_epoch() const override;  // ceil(rows / batch_size)

 private:
  torch::Tensor inputs_, targets_;
  int64_t batch_size_;
};

}  // namespace pipetrain::train
