// Token files (io/token_file.h).
#include "pipetrain/io/token_file.h"

#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/io/little_endian.h"

namespace pipetrain::io {
namespace {

// The first offset whose id is >= limit, or -1.
template <typename Id>
int64_t first_at_or_above(const char* data, int64_t count, uint64_t limit) {
  for (int64_t i = 0; i < count; ++i) {
    if (static_cast<uint64_t>(load_little_endian<Id>(data + i * sizeof(Id))) >= limit) return i;
  }
  return -1;
}

}  // namespace

TokenFile::TokenFile(const std::string& path, int token_bytes) : token_bytes_(token_bytes) {
  if (token_bytes != 2 && token_bytes != 4) {
    throw BadInput("token file '" + path + "': token bytes must be 2 (uint16) or 4 (uint32), got " +
                   std::to_string(token_bytes));
  }
  file_ = MappedFile(path);
  if (file_.size() % static_cast<uint64_t>(token_bytes) != 0) {
    throw BadInput(
        "token file '" + path + "' has " + std::to_string(file_.size()) +
        " bytes, not a multiple of " + std::to_string(token_bytes) +
        " (the bytes per id); is it truncated, or written with the other --token-bytes?");
  }
  tokens_ = static_cast<int64_t>(file_.size() / static_cast<uint64_t>(token_bytes));
  if (tokens_ < 2) {
    throw BadInput("token file '" + path + "' holds " + std::to_string(tokens_) +
                   " ids; a sample needs at least 2 (an input and its next id)");
  }
}

int64_t TokenFile::at(int64_t offset) const {
  const char* bytes = file_.data() + offset * token_bytes_;
  return token_bytes_ == 2 ? static_cast<int64_t>(load_little_endian<uint16_t>(bytes))
                           : static_cast<int64_t>(load_little_endian<uint32_t>(bytes));
}

torch::Tensor TokenFile::read(int64_t begin, int64_t count) const {
  if (begin < 0 || count < 0 || begin > tokens_ - count) {
    throw BadInput("token file '" + path() + "': ids [" + std::to_string(begin) + ", " +
                   std::to_string(begin + count) + ") lie outside its " + std::to_string(tokens_) +
                   " ids");
  }
  torch::Tensor ids = torch::empty({count}, torch::kInt64);
  int64_t* out = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) out[i] = at(begin + i);
  return ids;
}

void TokenFile::check_vocabulary(int64_t vocab_size) const {
  const uint64_t limit = static_cast<uint64_t>(vocab_size);
  const int64_t bad = token_bytes_ == 2 ? first_at_or_above<uint16_t>(file_.data(), tokens_, limit)
                                        : first_at_or_above<uint32_t>(file_.data(), tokens_, limit);
  if (bad < 0) return;
  throw BadInput("token file '" + path() + "': id " + std::to_string(at(bad)) + " at offset " +
                 std::to_string(bad) + " (byte " + std::to_string(bad * token_bytes_) +
                 ") is not below the vocabulary size " + std::to_string(vocab_size) +
                 "; was it written with another tokenizer, or with the other --token-bytes?");
}

int64_t TokenFile::max_id() const {
  int64_t most = 0;
  for (int64_t i = 0; i < tokens_; ++i) most = std::max(most, at(i));
  return most;
}

}  // namespace pipetrain::io
