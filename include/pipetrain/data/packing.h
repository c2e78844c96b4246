// Packing documents into the rows of a language model's mini-batches: which ids of which
// documents each row holds. A row holds at most T + 1 ids (T = the sequence length): its inputs
// are its first ids, its targets the ids one further (data/document_rows.h makes the tensors).
//
//   split  the documents of the epoch's order laid end to end as one stream and cut as a token
//          file is: row r = stream ids [r*T, r*T + T] (consecutive rows share one id). A
//          document crosses rows where the cut falls.           rows = (ids - 1) / T
//   whole  every document placed whole into one row by best fit: each, in order, into the open
//          row with the least room that still holds it, else into a new row. A document longer
//          than T + 1 is first cut into pieces [p*T, p*T + T] (each a row of its own), and
//          split_documents() says how many were.
//   none   one document (or one piece of a long one, as above) per row; the row is padded.
//
//   order  documents in stored order, or with shuffle:
//            split   a permutation of the documents per epoch, (seed, epoch)
//            whole   the documents packed once in a (seed)-permuted order; rows in a permutation
//                    per epoch, (seed, epoch)
//            none    rows in a permutation per epoch, (seed, epoch)
//          group_by_length (none only): within each window of `group_window` consecutive rows
//          of the epoch's order, longest first (stable), as Hugging Face's length-grouped
//          sampler does, so a mini-batch's rows are alike in length and pad little.
//
// Empty documents hold nothing and are left out. Every order is a pure function of (seed, epoch),
// base/shuffle.h, so a resumed run and every rank see the same rows.
//
// Torch-free. Thread-safety: const methods are safe concurrently (split's per-epoch stream is
// cached under a mutex).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace pipetrain::data {

enum class Packing { kSplit, kWhole, kNone };

// "split", "whole", "none".
const char* to_string(Packing packing);
// The names above; throws BadInput naming `flag` and the names otherwise.
Packing parse_packing(const std::string& name, const std::string& flag = "--pack");

// Ids [offset, offset + length) of document `document`.
struct Piece {
  int64_t document = 0;
  int64_t offset = 0;
  int64_t length = 0;
  bool operator==(const Piece& other) const {
    return document == other.document && offset == other.offset && length == other.length;
  }
};

// The pieces of one row, laid end to end in this order.
using Row = std::vector<Piece>;

// Ids a row holds.
int64_t row_ids(const Row& row);

struct PackingOptions {
  Packing packing = Packing::kSplit;
  int64_t seq_len = 0;  // T; REQUIRES >= 1
  bool shuffle = false;
  uint64_t seed = 0;
  bool group_by_length = false;  // REQUIRES packing none
  int64_t group_window = 1;      // rows per window of group_by_length; REQUIRES >= 1
};

class DocumentPacker {
 public:
  // `lengths`: ids per document. Throws BadInput when the options do not hold (above) or the
  // documents make no row (all empty, or a split stream of T ids or fewer).
  DocumentPacker(std::vector<int64_t> lengths, PackingOptions options);

  const PackingOptions& options() const { return options_; }
  // Rows per epoch (the same in every epoch).
  int64_t rows() const { return rows_; }
  // Row r of epoch e. REQUIRES 0 <= r < rows(), e >= 0.
  Row row(int64_t epoch, int64_t r) const;
  // Documents longer than T + 1 cut into pieces (whole and none; 0 for split).
  int64_t split_documents() const { return split_documents_; }
  // Documents the packer was given (empty ones included).
  int64_t documents() const { return static_cast<int64_t>(lengths_.size()); }

 private:
  // whole and none: the pieces of every document, in stored order.
  void cut_pieces();
  void pack_whole();
  // split: the row of the stream of epoch e's order.
  Row split_row(int64_t epoch, int64_t r) const;
  // none: the piece index behind position r of epoch e's order.
  int64_t none_piece(int64_t epoch, int64_t r) const;

  std::vector<int64_t> lengths_;
  PackingOptions options_;
  int64_t rows_ = 0;
  int64_t split_documents_ = 0;
  std::vector<Piece> pieces_;                   // whole, none
  std::vector<int64_t> row_begin_;              // whole: rows' first index into row_pieces_, + end
  std::vector<Piece> row_pieces_;               // whole: every row's pieces, row after row
  mutable std::mutex mutex_;                    // guards the caches below
  mutable int64_t cached_epoch_ = -1;           // the epoch whose order is cached
  mutable std::vector<int64_t> cached_order_;   // split: documents; whole, none: rows
  mutable std::vector<int64_t> cached_starts_;  // split: stream offset of each ordered document
};

}  // namespace pipetrain::data
