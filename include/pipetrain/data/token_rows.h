// The tensors of packed rows (data/packing.h): a language model's mini-batch of documents as the
// runtime takes it (data/batch.h).
//
//   a row of pieces p_1 .. p_n, I ids in all (at most T + 1), width W:
//     inputs[t]    its id t, for t < I - 1; pad_id after
//     targets[t]   its id t + 1 when ids t and t + 1 lie in the same piece and the mask marks id
//                  t + 1 learned; kIgnoredTarget (-100, data/batch.h) otherwise, and on padding
//     segments     the pieces' lengths as input positions (the last piece's last id is only a
//                  target, so it has one position less); attention and RoPE positions follow
//                  them (data/sequence_layout.h), unless cross-document attention is asked for
//     weight       the row's counted targets (the loss is their mean over the mini-batch)
//   W = T for split and whole packing; for none the batch's longest row rounded up to
//   pad_multiple (each micro-batch is then cut to its own, data/batch.h).
//
// Thread-safety: pure functions of their arguments (the datasets are read-only).
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

#include "pipetrain/data/batch.h"
#include "pipetrain/data/document_dataset.h"
#include "pipetrain/data/packing.h"

namespace pipetrain::data {

struct TokenRowOptions {
  int64_t seq_len = 0;       // T
  bool fixed_width = true;   // W = T (split, whole); false: the batch's longest (none)
  bool by_document = true;   // false: --cross-document-attention
  int64_t pad_multiple = 1;  // widths rounded up to this (tensor / sequence parallelism)
  int64_t pad_id = 0;        // the input id of padding
};

// A row and the dataset it comes from.
struct SourcedRow {
  const DocumentDataset* dataset = nullptr;
  Row row;
};

// The batch of `rows` (above). Throws BadInput when a row holds more than T + 1 ids.
Batch make_token_batch(const std::vector<SourcedRow>& rows, const TokenRowOptions& options);

}  // namespace pipetrain::data
