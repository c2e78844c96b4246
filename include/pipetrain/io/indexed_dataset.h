// IndexedDataset: a tokenized corpus of documents in the memory-mapped layout Megatron-LM writes
// (and NeMo and GPT-NeoX after it), so datasets people already have are read as they are. A
// dataset is two files with one prefix:
//
//   PREFIX.idx   "MMIDIDX\0\0"                      9 bytes, the magic
//                version                            uint64, 1
//                dtype code                         uint8: 1 uint8, 2 int8, 3 int16, 4 int32,
//                                                   5 int64, 6 float64, 7 float32, 8 uint16
//                sequence count S, index count D    uint64 each
//                sequence lengths                   int32 [S], ids per sequence
//                sequence pointers                  int64 [S], byte offset of each in .bin
//                document indices                   int64 [D]: the sequences where documents
//                                                   begin, from 0, the last one S (so D - 1
//                                                   documents; a document is usually one
//                                                   sequence)
//   PREFIX.bin   the ids, each sequence at its pointer, little-endian
//
// pipetrain reads ids of 2 bytes (uint16, Megatron's choice for vocabularies under 65500) and 4
// (int32, above), and loss masks of 1 (uint8: 1 where a token is learned, 0 where it is not;
// data/document_dataset.h refuses a mask of another dtype or with other values).
// Everything is checked on opening: every count against the file's size, every sequence within
// PREFIX.bin, the document indices rising from 0 to S. A problem throws BadInput naming the file
// and the field (and FileError when a file cannot be read).
//
// Torch-free (it builds into the fuzzable schedule library). Ownership: owns both maps.
// Thread-safety: read-only after construction; concurrent reads are safe.
//
// Example:
//   io::IndexedDataset data("corpus_text_document");
//   std::vector<int64_t> ids;
//   data.append_document(0, ids);  // the first document's ids
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pipetrain/io/mapped_file.h"

namespace pipetrain::io {

// Megatron's dtype codes.
enum class IndexedDtype : std::uint8_t {
  kUint8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUint16 = 8,
};
// "uint16" and so on; "code N" for a code outside the table.
std::string to_string(IndexedDtype dtype);

// What PREFIX.idx says.
struct IndexedIndex {
  IndexedDtype dtype = IndexedDtype::kUint16;
  int element_bytes = 2;
  std::vector<std::int32_t> sequence_lengths;
  std::vector<std::int64_t> sequence_pointers;
  std::vector<std::int64_t> document_indices;
};

// One stored value and where it is: document, offset within the document, value.
struct IndexedElement {
  std::int64_t document = 0;
  std::int64_t offset = 0;
  std::int64_t value = 0;
};

// Parses the bytes of an index file; `path` names it in errors. Throws BadInput naming the field
// for a bad magic, version or dtype code, counts the file cannot hold, a negative length, or
// document indices that do not rise from 0 to the sequence count. (Whether the pointers lie within
// the .bin is IndexedDataset's check.)
IndexedIndex parse_indexed_index(const char* data, std::uint64_t size, const std::string& path);

class IndexedDataset {
 public:
  // Opens PREFIX.idx and PREFIX.bin and checks them (above). Ids of 1, 2 or 4 bytes.
  explicit IndexedDataset(const std::string& prefix);

  const std::string& prefix() const { return prefix_; }
  std::string bin_path() const { return prefix_ + ".bin"; }
  IndexedDtype dtype() const { return index_.dtype; }
  int element_bytes() const { return index_.element_bytes; }
  std::int64_t sequences() const {
    return static_cast<std::int64_t>(index_.sequence_lengths.size());
  }
  std::int64_t documents() const {
    return static_cast<std::int64_t>(index_.document_indices.size()) - 1;
  }
  // Ids in all sequences.
  std::int64_t tokens() const { return tokens_; }
  // Ids of document d. REQUIRES 0 <= d < documents().
  std::int64_t document_length(std::int64_t d) const;
  // Appends document d's ids (its sequences in order) to `ids`. REQUIRES 0 <= d < documents().
  void append_document(std::int64_t d, std::vector<std::int64_t>& ids) const;
  // Document d's ids [offset, offset + count) into out[0 .. count). Throws BadInput naming the
  // range when it is not within the document.
  void read_document(std::int64_t d, std::int64_t offset, std::int64_t count,
                     std::int64_t* out) const;
  // Throws BadInput naming the document, the offset within it and the id of the first id outside
  // 0..vocab_size-1. Reads every id once.
  void check_vocabulary(std::int64_t vocab_size) const;
  // The first value outside low..high in document order, or nothing when every value is within.
  // Reads every value once (1-byte values a block at a time: a memory-bound pass).
  std::optional<IndexedElement> first_outside(std::int64_t low, std::int64_t high) const;
  // True when the sequences lie back to back in PREFIX.bin from its first byte, in order, and
  // fill it: the .bin is then the documents' ids as one flat stream (io/token_file.h), what
  // Megatron's preprocessing writes.
  bool contiguous() const { return contiguous_; }

 private:
  void check_document(std::int64_t d) const;   // BadInput unless 0 <= d < documents()
  std::int64_t element(const char* at) const;  // the id stored at `at`

  std::string prefix_;
  MappedFile index_file_, bin_;
  IndexedIndex index_;
  std::int64_t tokens_ = 0;
  bool contiguous_ = true;
};

// Writes `documents` (each one sequence) as PREFIX.idx and PREFIX.bin in the layout above, ids of
// `dtype` (uint8, uint16 or int32), as Megatron's builder does. Throws BadInput for an id `dtype`
// cannot hold, FileError when a file cannot be written.
void write_indexed_dataset(const std::string& prefix,
                           const std::vector<std::vector<std::int64_t>>& documents,
                           IndexedDtype dtype = IndexedDtype::kUint16);

}  // namespace pipetrain::io
