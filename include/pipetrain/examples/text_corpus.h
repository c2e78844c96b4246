// CharCorpus: a character-level (byte-level) text corpus for the GPT example.
//
// The default corpus is the GNU GPL version 3, /usr/share/common-licenses/GPL-3, shipped by
// Debian's base-files package and so present on every Debian system (35149 bytes of English,
// 80 distinct bytes). Any other text file works the same (e.g. a Debian package's book).
//
// Vocabulary = the sorted set of distinct bytes of the text; a token is a byte's index in it.
// Training windows: a window of T+1 consecutive tokens starting at a uniformly drawn offset;
// input = its first T tokens, target = its last T (the next character at every position).
// The windows of step k are a pure function of (seed, k), so a resumed run draws the same
// windows without saving generator state.
//
// unigram_entropy() is H = -sum_c p(c) ln p(c) in nats over the corpus's byte frequencies: the
// cross-entropy of the best model that ignores context. A language model has learned something
// from context once its loss is well below it.
//
// Ownership: owns a copy of the text. Thread-safety: immutable after construction; all methods
// are const and may be called concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <torch/types.h>

#include "pipetrain/examples/data_error.h"
#include "pipetrain/train/batch_source.h"

namespace pipetrain::examples {

inline constexpr const char* kDefaultCorpusPath = "/usr/share/common-licenses/GPL-3";

struct TokenWindows {
  torch::Tensor inputs;   // int64 [batch, T]
  torch::Tensor targets;  // int64 [batch, T]: inputs shifted left by one character
};

class CharCorpus {
 public:
  // Reads a whole file. Throws DataError naming the path when it is missing, unreadable or
  // holds fewer than 2 bytes.
  static CharCorpus from_file(const std::string& path = kDefaultCorpusPath);
  // REQUIRES: text.size() >= 2. `source` names it in messages.
  CharCorpus(std::string text, std::string source);

  const std::string& text() const { return text_; }
  const std::string& source() const { return source_; }
  // The distinct bytes, sorted: vocabulary()[token] is the byte of `token`.
  const std::string& vocabulary() const { return vocabulary_; }
  int64_t vocab_size() const { return static_cast<int64_t>(vocabulary_.size()); }

  // Throws c10::Error naming the first byte that is not in the vocabulary.
  torch::Tensor encode(const std::string& text) const;  // int64 [n]
  // REQUIRES: int64 tokens in 0..vocab_size-1, any shape (read in row-major order).
  std::string decode(const torch::Tensor& tokens) const;
  // The whole corpus, encoded: int64 [text().size()].
  const torch::Tensor& tokens() const { return tokens_; }

  // Entropy of the byte frequencies, in nats.
  double unigram_entropy() const;

  // `batch` windows of length `length` for step `step`. REQUIRES: 0 < length < text().size().
  TokenWindows sample_windows(int64_t batch, int64_t length, uint64_t seed, int64_t step) const;

 private:
  std::string text_;
  std::string source_;
  std::string vocabulary_;
  std::array<int16_t, 256> token_of_byte_{};  // -1 where the byte is not in the vocabulary
  torch::Tensor tokens_;
};

// A corpus as a Trainer's batch source (train/batch_source.h): step k is
// corpus.sample_windows(batch, length, seed, k). No epochs (per_epoch() is 0). Keeps a reference
// to the corpus, which must outlive it.
class WindowBatches final : public train::BatchSource {
 public:
  WindowBatches(const CharCorpus& corpus, int64_t batch, int64_t length, uint64_t seed)
      : corpus_(corpus), batch_(batch), length_(length), seed_(seed) {}
  std::pair<torch::Tensor, torch::Tensor> at(int64_t k) const override {
    TokenWindows w = corpus_.sample_windows(batch_, length_, seed_, k);
    return {w.inputs, w.targets};
  }
  int64_t per_epoch() const override { return 0; }

 private:
  const CharCorpus& corpus_;
  int64_t batch_, length_;
  uint64_t seed_;
};

}  // namespace pipetrain::examples
