// DocumentBatches: a language model's mini-batches of documents -- one Megatron indexed dataset or
// a blend of several (`--data-path 0.7 A 0.3 B`) -- packed into rows (data/packing.h) and made into
// the runtime's batches with their counted targets and token layout (data/token_rows.h), as a
// Trainer's batch source (train/batch_source.h).
//
//   each dataset d: a DocumentPacker of its documents, R_d rows per epoch
//   per epoch ceil(sum_d R_d / N) batches (N the batch size)
//   one dataset: batch b of epoch e (step k = e * per_epoch + b) holds rows (b*N + n) mod R of
//     e's order, n = 0..N-1, as a token file's batches (train/token_batches.h)
//   a blend: sample g = k*N + n is dataset d's c-th row by the blend walk (data/blend.h): row
//     c mod R_d of d's epoch c / R_d (each dataset's epochs shuffle with a seed of their own,
//     mix_seed(seed, d))
//
// So a batch is a pure function of k (a resumed run reads on where it stood, every rank computes
// the same batch), and micro-batching, pipelining and data-parallel replicas do not change the
// loss: the sum of cross-entropy over the batch's counted targets over their count.
//
// A mini-batch without one counted target (every row padding, prompts or document ends) cannot be
// learned from: batch() throws BadInput naming the step and what its rows hold.
//
// evaluate_documents() is the held-out side: the loss and perplexity over every row of one dataset
// in stored order, over its counted targets.
//
// Ownership: shares the datasets. Thread-safety: const methods are safe concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/arg.h>
#include <torch/types.h>

#include "pipetrain/data/blend.h"
#include "pipetrain/data/document_dataset.h"
#include "pipetrain/data/packing.h"
#include "pipetrain/data/token_rows.h"
#include "pipetrain/train/batch_source.h"

namespace pipetrain::train {

struct DocumentSource {
  double weight = 1;  // its share of a blend (> 0)
  std::shared_ptr<const data::DocumentDataset> dataset;
};

struct DocumentBatchOptions {
  /// REQUIRES seq_len >= 1, batch_size >= 1.
  DocumentBatchOptions(int64_t seq_len, int64_t batch_size)
      : seq_len_(seq_len), batch_size_(batch_size) {}
  /// T: a row's inputs are at most T ids (T + 1 with the last target).
  TORCH_ARG(int64_t, seq_len);
  /// N: rows per mini-batch.
  TORCH_ARG(int64_t, batch_size);
  /// split (default), whole or none (data/packing.h).
  TORCH_ARG(data::Packing, packing) = data::Packing::kSplit;
  /// Documents (split) or rows (whole, none) in a seeded order per epoch. Default false.
  TORCH_ARG(bool, shuffle) = false;
  TORCH_ARG(uint64_t, seed) = 0;
  /// A token attends only within its document and RoPE restarts at each (default); false:
  /// --cross-document-attention, whole rows.
  TORCH_ARG(bool, by_document) = true;
  /// Widths rounded up to a multiple of this (sequence parallelism needs the tp size). Default 1.
  TORCH_ARG(int64_t, pad_multiple) = 1;
  /// --pack none: within windows of 50 mini-batches, longest rows first. Default false.
  TORCH_ARG(bool, group_by_length) = false;
  /// The input id of padding. Default 0.
  TORCH_ARG(int64_t, pad_id) = 0;
};

class DocumentBatches final : public BatchSource {
 public:
  // Throws BadInput naming the dataset for a bad weight, a dataset that packs into no row, or
  // options the packer refuses.
  DocumentBatches(std::vector<DocumentSource> sources, DocumentBatchOptions options);

  data::Batch batch(int64_t k) const override;
  // batch(k)'s inputs and targets.
  std::pair<torch::Tensor, torch::Tensor> at(int64_t k) const override;
  // at(0) padded to the widest row there can be (T rounded up to the pad multiple).
  std::pair<torch::Tensor, torch::Tensor> largest() const override;
  int64_t per_epoch() const override;

  const DocumentBatchOptions& options() const { return options_; }
  // Rows per epoch of dataset d.
  int64_t rows(size_t d = 0) const { return packers_.at(d)->rows(); }
  // Documents longer than T + 1 cut into pieces, over every dataset (whole and none).
  int64_t split_documents() const;
  // "--pack whole, 59 rows of 16 inputs at most an epoch (27 documents longer than a row cut into
  // pieces), attention within each document".
  std::string describe() const;
  // Rows [first, first + count) of dataset d's epoch 0, in order (an evaluation's).
  data::Batch rows_of(size_t d, int64_t first, int64_t count) const;

 private:
  std::vector<DocumentSource> sources_;
  DocumentBatchOptions options_;
  std::vector<std::unique_ptr<data::DocumentPacker>> packers_;
  data::BlendWalk walk_;
  data::TokenRowOptions row_options_;
};

struct DocumentEvaluation {
  double loss = 0;        // mean cross-entropy per counted target, nats
  double perplexity = 0;  // exp(loss)
  int64_t rows = 0;
  int64_t counted_targets = 0;
};

// The loss of `forward` (a batch of token rows, its layout installed -> logits [n, W, V], or an
// undefined tensor on a rank without the last stage) over every row of `batches`' one dataset in
// order, `rows_per_call` rows at a time. Where the logits were never seen, rows and targets are
// counted and loss stays 0.
DocumentEvaluation evaluate_documents(
    const std::function<torch::Tensor(const data::Batch&)>& forward, const DocumentBatches& batches,
    int64_t rows_per_call);

}  // namespace pipetrain::train
