// DocumentDataset: the documents of a Megatron indexed dataset (io/indexed_dataset.h), with the
// loss mask that fine-tuning data carries beside it, as the packer (data/packing.h) and the batch
// maker (data/token_rows.h) read them.
//
//   PREFIX.idx/.bin                 the token ids, document by document
//   MASK.idx/.bin (optional)        uint8, the same documents of the same lengths: 1 where the
//                                   token is to be learned (a completion), 0 where it is not (a
//                                   prompt); scripts/prepare-data writes it as PREFIX_loss_mask
//                                   for prompt/completion records
//
// Checked on opening, each a BadInput naming the file: both datasets as io::IndexedDataset checks
// them, at least one document, a mask of another document count or another length for some
// document, a mask of another dtype than uint8 (a token dataset given as the mask), a mask value
// other than 0 or 1 (named with its document and position; every value is read once, a
// memory-bound pass over a byte per token). check_vocabulary() names the document and offset of
// an id outside the model's vocabulary.
//
// Torch-free. Ownership: owns the maps. Thread-safety: read-only after construction.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/data/packing.h"
#include "pipetrain/io/indexed_dataset.h"

namespace pipetrain::data {

class DocumentDataset {
 public:
  // `loss_mask_prefix` "": no mask (every token is learned).
  explicit DocumentDataset(const std::string& prefix, const std::string& loss_mask_prefix = "");

  const std::string& prefix() const { return tokens_.prefix(); }
  bool has_loss_mask() const { return mask_ != nullptr; }
  const std::string& loss_mask_prefix() const;
  int64_t documents() const { return tokens_.documents(); }
  int64_t tokens() const { return tokens_.tokens(); }
  // Ids per document, in stored order.
  const std::vector<int64_t>& lengths() const { return lengths_; }
  // The piece's ids into ids[0 .. piece.length), and (when `mask` is not null) its mask into
  // mask[0 .. piece.length): 1 where learned (every token without a mask dataset).
  void read(const Piece& piece, int64_t* ids, int64_t* mask) const;
  // Throws BadInput naming the document, offset and id of the first id outside
  // 0..vocab_size-1 (reads every id once).
  void check_vocabulary(int64_t vocab_size) const { tokens_.check_vocabulary(vocab_size); }

 private:
  void check_mask_values() const;  // BadInput unless the mask is uint8 of 0 and 1

  io::IndexedDataset tokens_;
  std::unique_ptr<io::IndexedDataset> mask_;
  std::vector<int64_t> lengths_;
};

}  // namespace pipetrain::data
