// Character-level corpus (text_corpus.h).
#include "pipetrain/examples/text_corpus.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "pipetrain/examples/data_loader.h"  // mix_seed, uniform_below

namespace pipetrain::examples {

CharCorpus CharCorpus::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw DataError("text corpus '" + path + "': " + std::strerror(errno) +
                    " (the default, the GPL-3 text, comes with Debian's base-files package)");
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw DataError("text corpus '" + path + "': read error");
  std::string text = buffer.str();
  if (text.size() < 2) {
    throw DataError("text corpus '" + path + "': holds " + std::to_string(text.size()) +
                    " bytes; a language model needs at least 2");
  }
  return CharCorpus(std::move(text), path);
}

CharCorpus::CharCorpus(std::string text, std::string source)
    : text_(std::move(text)), source_(std::move(source)) {
  TORCH_CHECK(text_.size() >= 2, "text corpus '", source_, "' holds ", text_.size(),
              " bytes; a language model needs at least 2");
  std::array<bool, 256> present{};
  for (unsigned char c : text_) present[c] = true;
  token_of_byte_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    if (!present[b]) continue;
    token_of_byte_[b] = static_cast<int16_t>(vocabulary_.size());
    vocabulary_.push_back(static_cast<char>(b));
  }
  tokens_ = encode(text_);
}

torch::Tensor CharCorpus::encode(const std::string& text) const {
  torch::Tensor out = torch::empty({static_cast<int64_t>(text.size())}, torch::kInt64);
  int64_t* data = out.data_ptr<int64_t>();
  for (size_t n = 0; n < text.size(); ++n) {
    int16_t token = token_of_byte_[static_cast<unsigned char>(text[n])];
    TORCH_CHECK(token >= 0, "byte ", static_cast<int>(static_cast<unsigned char>(text[n])),
                " at offset ", n, " is not in the vocabulary of corpus '", source_, "'");
    data[n] = token;
  }
  return out;
}

std::string CharCorpus::decode(const torch::Tensor& tokens) const {
  torch::Tensor flat = tokens.to(torch::kInt64).contiguous().view({-1});
  const int64_t* data = flat.data_ptr<int64_t>();
  std::string out;
  out.reserve(static_cast<size_t>(flat.numel()));
  for (int64_t n = 0; n < flat.numel(); ++n) {
    TORCH_CHECK(data[n] >= 0 && data[n] < vocab_size(), "token ", data[n], " is outside 0..",
                vocab_size() - 1);
    out.push_back(vocabulary_[static_cast<size_t>(data[n])]);
  }
  return out;
}

double CharCorpus::unigram_entropy() const {
  std::array<int64_t, 256> counts{};
  for (unsigned char c : text_) ++counts[c];
  double total = static_cast<double>(text_.size());
  double entropy = 0.0;
  for (int64_t count : counts) {
    if (count == 0) continue;
    double p = static_cast<double>(count) / total;
    entropy -= p * std::log(p);
  }
  return entropy;
}

TokenWindows CharCorpus::sample_windows(int64_t batch, int64_t length, uint64_t seed,
                                        int64_t step) const {
  const int64_t n = tokens_.size(0);
  TORCH_CHECK(batch > 0, "sample_windows: batch must be positive, got ", batch);
  TORCH_CHECK(length > 0 && length < n, "sample_windows: window length ", length, " must be in 1..",
              n - 1, " for corpus '", source_, "' of ", n, " characters");
  std::mt19937_64 engine(mix_seed(seed, static_cast<uint64_t>(step)));
  torch::Tensor inputs = torch::empty({batch, length}, torch::kInt64);
  torch::Tensor targets = torch::empty({batch, length}, torch::kInt64);
  const int64_t* all = tokens_.data_ptr<int64_t>();
  int64_t* in = inputs.data_ptr<int64_t>();
  int64_t* out = targets.data_ptr<int64_t>();
  const uint64_t offsets = static_cast<uint64_t>(n - length);  // window starts 0 .. n-length-1
  for (int64_t b = 0; b < batch; ++b) {
    int64_t start = static_cast<int64_t>(uniform_below(engine, offsets));
    std::memcpy(in + b * length, all + start, sizeof(int64_t) * length);
    std::memcpy(out + b * length, all + start + 1, sizeof(int64_t) * length);
  }
  return {inputs, targets};
}

}  // namespace pipetrain::examples
