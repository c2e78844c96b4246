// Megatron's indexed datasets (io/indexed_dataset.h).
#include "pipetrain/io/indexed_dataset.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string_view>

#include "pipetrain/base/atomic_file.h"
#include "pipetrain/base/error.h"
#include "pipetrain/io/little_endian.h"

namespace pipetrain::io {
namespace {

constexpr char kMagic[] = "MMIDIDX\0\0";  // 9 bytes: the literal's last NUL is not written
constexpr std::uint64_t kMagicBytes = 9;
constexpr std::uint64_t kHeaderBytes = kMagicBytes + 8 + 1 + 8 + 8;

int bytes_of(IndexedDtype dtype) {
  switch (dtype) {
    case IndexedDtype::kUint8:
    case IndexedDtype::kInt8:
      return 1;
    case IndexedDtype::kInt16:
    case IndexedDtype::kUint16:
      return 2;
    case IndexedDtype::kInt32:
    case IndexedDtype::kFloat32:
      return 4;
    case IndexedDtype::kInt64:
    case IndexedDtype::kFloat64:
      return 8;
  }
  return 0;
}

}  // namespace

std::string to_string(IndexedDtype dtype) {
  switch (dtype) {
    case IndexedDtype::kUint8:
      return "uint8";
    case IndexedDtype::kInt8:
      return "int8";
    case IndexedDtype::kInt16:
      return "int16";
    case IndexedDtype::kInt32:
      return "int32";
    case IndexedDtype::kInt64:
      return "int64";
    case IndexedDtype::kFloat64:
      return "float64";
    case IndexedDtype::kFloat32:
      return "float32";
    case IndexedDtype::kUint16:
      return "uint16";
  }
  return "code " + std::to_string(static_cast<int>(dtype));
}

IndexedIndex parse_indexed_index(const char* data, std::uint64_t size, const std::string& path) {
  const std::string where = "indexed dataset index '" + path + "'";
  if (size < kHeaderBytes) {
    throw BadInput(where + " has " + std::to_string(size) + " bytes, fewer than its " +
                   std::to_string(kHeaderBytes) + "-byte header");
  }
  if (std::memcmp(data, kMagic, kMagicBytes) != 0) {
    throw BadInput(where +
                   " does not begin with MMIDIDX\\0\\0 (Megatron's indexed dataset); is "
                   "it a .idx file?");
  }
  const auto version = load_little_endian<std::uint64_t>(data + 9);
  if (version != 1) {
    throw BadInput(where + ": version " + std::to_string(version) + "; pipetrain reads version 1");
  }
  IndexedIndex index;
  const auto code = static_cast<std::uint8_t>(data[17]);
  index.dtype = static_cast<IndexedDtype>(code);
  index.element_bytes = bytes_of(index.dtype);
  if (index.element_bytes == 0) {
    throw BadInput(where + ": dtype code " + std::to_string(code) +
                   " is not one of Megatron's (1-8)");
  }
  if (index.dtype != IndexedDtype::kUint16 && index.dtype != IndexedDtype::kInt32 &&
      index.dtype != IndexedDtype::kUint8) {
    throw BadInput(where + ": ids of dtype " + to_string(index.dtype) +
                   "; pipetrain reads uint16 (code 8) and int32 (code 4) token ids and uint8 "
                   "(code 1) loss masks");
  }
  const auto sequences = load_little_endian<std::uint64_t>(data + 18);
  const auto indices = load_little_endian<std::uint64_t>(data + 26);
  // Each sequence takes 4 + 8 bytes of the index, each document index 8.
  const std::uint64_t room = size - kHeaderBytes;
  if (sequences > room / 12 || indices > (room - sequences * 12) / 8) {
    throw BadInput(where + ": " + std::to_string(sequences) + " sequences and " +
                   std::to_string(indices) + " document indices need " +
                   std::to_string(kHeaderBytes) + " + 12 x " + std::to_string(sequences) +
                   " + 8 x " + std::to_string(indices) + " bytes; the file has " +
                   std::to_string(size) + " (truncated?)");
  }
  const char* at = data + kHeaderBytes;
  // (memcpy of 0 bytes into an empty vector's null data() is undefined: copy only what there is.)
  auto copy = [&at](auto& array, std::uint64_t count) {
    array.resize(count);
    const std::uint64_t bytes = count * sizeof(array[0]);
    if (bytes > 0) std::memcpy(array.data(), at, bytes);
    at += bytes;
  };
  copy(index.sequence_lengths, sequences);
  copy(index.sequence_pointers, sequences);
  copy(index.document_indices, indices);
  for (std::uint64_t s = 0; s < sequences; ++s) {
    if (index.sequence_lengths[s] < 0) {
      throw BadInput(where + ": sequence " + std::to_string(s) + " has length " +
                     std::to_string(index.sequence_lengths[s]));
    }
  }
  if (indices < 1 || index.document_indices.front() != 0 ||
      index.document_indices.back() != static_cast<std::int64_t>(sequences)) {
    throw BadInput(where + ": the document indices must run from 0 to the sequence count " +
                   std::to_string(sequences) + (indices < 1 ? " (there are none)" : ""));
  }
  for (std::uint64_t k = 1; k < indices; ++k) {
    if (index.document_indices[k] < index.document_indices[k - 1]) {
      throw BadInput(where + ": document index " + std::to_string(k) + " (" +
                     std::to_string(index.document_indices[k]) + ") is below the one before (" +
                     std::to_string(index.document_indices[k - 1]) + ")");
    }
  }
  return index;
}

IndexedDataset::IndexedDataset(const std::string& prefix)
    : prefix_(prefix), index_file_(prefix + ".idx"), bin_(prefix + ".bin") {
  index_ = parse_indexed_index(index_file_.data(), index_file_.size(), index_file_.path());
  const auto bytes = static_cast<std::int64_t>(index_.element_bytes);
  const auto bin_size = static_cast<std::int64_t>(bin_.size());
  std::int64_t next = 0;
  for (std::size_t s = 0; s < index_.sequence_lengths.size(); ++s) {
    const std::int64_t pointer = index_.sequence_pointers[s];
    const std::int64_t length = index_.sequence_lengths[s];
    if (pointer < 0 || pointer % bytes != 0 || pointer > bin_size ||
        length > (bin_size - pointer) / bytes) {
      throw BadInput("indexed dataset '" + prefix + "': sequence " + std::to_string(s) + " (" +
                     std::to_string(length) + " ids at byte " + std::to_string(pointer) +
                     ") lies outside " + bin_.path() + " (" + std::to_string(bin_size) + " bytes)");
    }
    contiguous_ = contiguous_ && pointer == next;
    next = pointer + length * bytes;
    tokens_ += length;
  }
  contiguous_ = contiguous_ && next == bin_size;
}

void IndexedDataset::check_document(std::int64_t d) const {
  if (d < 0 || d >= documents()) {
    throw BadInput("indexed dataset '" + prefix_ + "': document " + std::to_string(d) + " of its " +
                   std::to_string(documents()));
  }
}

std::int64_t IndexedDataset::document_length(std::int64_t d) const {
  check_document(d);
  std::int64_t length = 0;
  for (std::int64_t s = index_.document_indices[static_cast<std::size_t>(d)];
       s < index_.document_indices[static_cast<std::size_t>(d) + 1]; ++s) {
    length += index_.sequence_lengths[static_cast<std::size_t>(s)];
  }
  return length;
}

std::int64_t IndexedDataset::element(const char* at) const {
  switch (index_.element_bytes) {
    case 1:
      return static_cast<std::uint8_t>(*at);
    case 2:
      return load_little_endian<std::uint16_t>(at);
    default:
      return load_little_endian<std::int32_t>(at);
  }
}

void IndexedDataset::append_document(std::int64_t d, std::vector<std::int64_t>& ids) const {
  const std::int64_t length = document_length(d);
  const std::size_t before = ids.size();
  ids.resize(before + static_cast<std::size_t>(length));
  read_document(d, 0, length, ids.data() + before);
}

void IndexedDataset::read_document(std::int64_t d, std::int64_t offset, std::int64_t count,
                                   std::int64_t* out) const {
  check_document(d);
  const std::int64_t length = document_length(d);
  if (offset < 0 || count < 0 || offset + count > length) {
    throw BadInput("indexed dataset '" + prefix_ + "': ids " + std::to_string(offset) + ".." +
                   std::to_string(offset + count - 1) + " of document " + std::to_string(d) +
                   ", which holds " + std::to_string(length));
  }
  const auto bytes = static_cast<std::int64_t>(index_.element_bytes);
  std::int64_t skip = offset;
  for (std::int64_t s = index_.document_indices[static_cast<std::size_t>(d)];
       count > 0 && s < index_.document_indices[static_cast<std::size_t>(d) + 1]; ++s) {
    const std::int64_t in_sequence = index_.sequence_lengths[static_cast<std::size_t>(s)];
    if (skip >= in_sequence) {
      skip -= in_sequence;
      continue;
    }
    const char* at = bin_.data() + index_.sequence_pointers[static_cast<std::size_t>(s)];
    const std::int64_t take = std::min(in_sequence - skip, count);
    for (std::int64_t i = 0; i < take; ++i) *out++ = element(at + (skip + i) * bytes);
    count -= take;
    skip = 0;
  }
}

void IndexedDataset::check_vocabulary(std::int64_t vocab_size) const {
  if (const auto outside = first_outside(0, vocab_size - 1)) {
    throw BadInput("indexed dataset '" + prefix_ + "': document " +
                   std::to_string(outside->document) + " has id " + std::to_string(outside->value) +
                   " at offset " + std::to_string(outside->offset) +
                   ", outside the model's vocabulary of " + std::to_string(vocab_size) +
                   " (ids 0.." + std::to_string(vocab_size - 1) +
                   "); was it tokenized with this model's tokenizer?");
  }
}

std::optional<IndexedElement> IndexedDataset::first_outside(std::int64_t low,
                                                            std::int64_t high) const {
  const auto bytes = static_cast<std::int64_t>(index_.element_bytes);
  // A block of 1-byte values whose bitwise OR is at most `high` holds none above it (each value
  // is at most the OR): 8 bytes at a time, a memory-bound pass. Exact for a loss mask (0..1).
  constexpr std::int64_t kBlock = 4096;
  const bool by_block = bytes == 1 && low <= 0;
  for (std::int64_t d = 0; d < documents(); ++d) {
    std::int64_t offset = 0;
    for (std::int64_t s = index_.document_indices[static_cast<std::size_t>(d)];
         s < index_.document_indices[static_cast<std::size_t>(d) + 1]; ++s) {
      const char* at = bin_.data() + index_.sequence_pointers[static_cast<std::size_t>(s)];
      const std::int64_t length = index_.sequence_lengths[static_cast<std::size_t>(s)];
      auto scan = [&](std::int64_t from, std::int64_t to) -> std::optional<IndexedElement> {
        for (std::int64_t i = from; i < to; ++i) {
          const std::int64_t value = element(at + i * bytes);
          if (value < low || value > high) return IndexedElement{d, offset + i, value};
        }
        return std::nullopt;
      };
      std::int64_t i = 0;
      for (; by_block && i + kBlock <= length; i += kBlock) {
        std::uint64_t any = 0;
        for (std::int64_t k = 0; k < kBlock; k += 8) {
          std::uint64_t word;
          std::memcpy(&word, at + i + k, sizeof(word));
          any |= word;
        }
        any |= any >> 32;
        any |= any >> 16;
        any |= any >> 8;
        if (static_cast<std::int64_t>(any & 0xff) <= high) continue;
        if (auto found = scan(i, i + kBlock)) return found;
      }
      if (auto found = scan(i, length)) return found;
      offset += length;
    }
  }
  return std::nullopt;
}

void write_indexed_dataset(const std::string& prefix,
                           const std::vector<std::vector<std::int64_t>>& documents,
                           IndexedDtype dtype) {
  if (dtype != IndexedDtype::kUint16 && dtype != IndexedDtype::kInt32 &&
      dtype != IndexedDtype::kUint8) {
    throw BadInput("indexed dataset '" + prefix + "': ids of dtype " + to_string(dtype) +
                   "; write uint8, uint16 or int32");
  }
  const std::int64_t limit =
      dtype == IndexedDtype::kUint8    ? std::int64_t{std::numeric_limits<std::uint8_t>::max()}
      : dtype == IndexedDtype::kUint16 ? std::int64_t{std::numeric_limits<std::uint16_t>::max()}
                                       : std::int64_t{std::numeric_limits<std::int32_t>::max()};
  std::string bin, index;
  std::vector<std::int64_t> pointers;
  for (std::size_t d = 0; d < documents.size(); ++d) {
    pointers.push_back(static_cast<std::int64_t>(bin.size()));
    for (std::int64_t id : documents[d]) {
      if (id < 0 || id > limit) {
        throw BadInput("indexed dataset '" + prefix + "': document " + std::to_string(d) +
                       " has id " + std::to_string(id) + ", outside " + to_string(dtype));
      }
      if (dtype == IndexedDtype::kUint8) {
        append_little_endian(bin, static_cast<std::uint8_t>(id));
      } else if (dtype == IndexedDtype::kUint16) {
        append_little_endian(bin, static_cast<std::uint16_t>(id));
      } else {
        append_little_endian(bin, static_cast<std::int32_t>(id));
      }
    }
  }
  index.append(kMagic, kMagicBytes);
  append_little_endian<std::uint64_t>(index, 1);
  append_little_endian<std::uint8_t>(index, static_cast<std::uint8_t>(dtype));
  append_little_endian<std::uint64_t>(index, documents.size());
  append_little_endian<std::uint64_t>(index, documents.size() + 1);
  for (const auto& document : documents)
    append_little_endian(index, static_cast<std::int32_t>(document.size()));
  for (std::int64_t pointer : pointers) append_little_endian(index, pointer);
  for (std::size_t d = 0; d <= documents.size(); ++d)
    append_little_endian(index, static_cast<std::int64_t>(d));
  write_file_atomically(prefix + ".bin", bin);
  write_file_atomically(prefix + ".idx", index);
}

}  // namespace pipetrain::io
