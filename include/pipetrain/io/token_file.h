// TokenFile: a flat stream of token ids on disk, memory-mapped: what a tokenizer writes once over
// a corpus and a language model then trains on (docs/MODELS.md shows how to write one with the
// `tokenizers` package).
//
//   file = id_0 id_1 id_2 ...      each id an unsigned little-endian integer of token_bytes bytes
//                                  (2: uint16, vocabularies up to 65536; 4: uint32)
//
// Sample k of sequence length T is ids [k*T, k*T + T] (T + 1 ids: the input is the first T, the
// target the last T, each input position predicting the next id); the file holds
// (tokens - 1) / T samples (train/token_batches.h draws mini-batches of them).
//
// Ownership: owns the map. Thread-safety: read-only after construction; concurrent reads are safe.
//
// Example:
//   io::TokenFile tokens("corpus.bin", 2);
//   tokens.check_vocabulary(32000);            // BadInput naming the first id >= 32000
//   torch::Tensor ids = tokens.read(0, 129);   // int64 [129]
#pragma once

#include <cstdint>
#include <string>

#include <torch/types.h>

#include "pipetrain/io/mapped_file.h"

namespace pipetrain::io {

class TokenFile {
 public:
  // REQUIRES token_bytes 2 or 4. Throws FileError when the file cannot be read, BadInput naming
  // the path when its size is not a multiple of token_bytes or it holds fewer than 2 ids.
  explicit TokenFile(const std::string& path, int token_bytes = 2);

  const std::string& path() const { return file_.path(); }
  int token_bytes() const { return token_bytes_; }
  // Number of ids in the file.
  int64_t tokens() const { return tokens_; }
  // The id at `offset`. REQUIRES 0 <= offset < tokens().
  int64_t at(int64_t offset) const;
  // ids [begin, begin + count) as an int64 tensor [count]. Throws BadInput for a range outside
  // the file.
  torch::Tensor read(int64_t begin, int64_t count) const;
  // Throws BadInput naming the path, the offset (in ids and in bytes) and the value of the first
  // id >= vocab_size. Reads the whole file once.
  void check_vocabulary(int64_t vocab_size) const;
  // The largest id in the file (reads it once).
  int64_t max_id() const;

 private:
  MappedFile file_;
  int token_bytes_ = 2;
  int64_t tokens_ = 0;
};

}  // namespace pipetrain::io
