// The index of a sharded checkpoint (pipetrain/io/shard_index.h).
#include "pipetrain/io/shard_index.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

namespace pipetrain::io {
namespace {

constexpr int64_t kMaxElements = int64_t{1} << 60;
constexpr size_t kMaxRank = 16;     // dimensions of a tensor
constexpr size_t kMaxBoxes = 4096;  // distinct boxes of one tensor

std::string describe(const std::string& file, const std::string& tensor,
                     const std::string& problem) {
  std::string text = "sharded checkpoint '" + file + "'";
  if (!tensor.empty()) text += ", tensor '" + tensor + "'";
  return text + ": " + problem;
}

int64_t product(const std::vector<int64_t>& shape, const std::string& file,
                const std::string& tensor) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw ShardIndexError(file, tensor, "negative dimension " + std::to_string(d));
    if (d != 0 && n > kMaxElements / d) throw ShardIndexError(file, tensor, "too many elements");
    n *= d;
  }
  return n;
}

// Reads the JSON value `key` of object `j` as T, or throws naming it.
template <typename T>
T get(const nlohmann::json& j, const char* key, const std::string& file,
      const std::string& tensor) {
  const auto found = j.find(key);
  if (found == j.end()) throw ShardIndexError(file, tensor, std::string("no '") + key + "'");
  try {
    return found->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw ShardIndexError(file, tensor, std::string("'") + key + "' has the wrong type");
  }
}

std::vector<int64_t> get_dims(const nlohmann::json& j, const char* key, const std::string& file,
                              const std::string& tensor) {
  const auto found = j.find(key);
  if (found == j.end() || !found->is_array()) {
    throw ShardIndexError(file, tensor, std::string("'") + key + "' is not a list of integers");
  }
  if (found->size() > kMaxRank) throw ShardIndexError(file, tensor, "too many dimensions");
  std::vector<int64_t> dims;
  for (const auto& d : *found) {
    if (!d.is_number_integer()) {
      throw ShardIndexError(file, tensor, std::string("'") + key + "' is not a list of integers");
    }
    dims.push_back(d.get<int64_t>());
  }
  return dims;
}

uint64_t get_offset(const nlohmann::json& j, const char* key, const std::string& file,
                    const std::string& tensor) {
  const auto found = j.find(key);
  if (found == j.end() || !found->is_number_unsigned()) {
    if (found != j.end() && found->is_number_integer() && found->get<int64_t>() >= 0) {
      return static_cast<uint64_t>(found->get<int64_t>());
    }
    throw ShardIndexError(file, tensor, std::string("'") + key + "' is not an integer >= 0");
  }
  return found->get<uint64_t>();
}

bool boxes_overlap(const ShardRegion& a, const ShardRegion& b) {
  for (size_t d = 0; d < a.shape.size(); ++d) {
    if (a.offsets[d] + a.shape[d] <= b.offsets[d] || b.offsets[d] + b.shape[d] <= a.offsets[d]) {
      return false;
    }
  }
  return true;
}

// Every element of `tensor` stored exactly once (see the header).
void check_tiling(const ShardTensor& tensor, const std::string& file, const std::string& name) {
  using Box = std::pair<std::vector<int64_t>, std::vector<int64_t>>;
  std::map<Box, std::vector<std::pair<int64_t, int64_t>>> boxes;
  for (const ShardPiece& piece : tensor.pieces) {
    boxes[{piece.region.offsets, piece.region.shape}].emplace_back(piece.region.flat_begin,
                                                                   piece.region.flat_end);
    if (boxes.size() > kMaxBoxes) throw ShardIndexError(file, name, "too many boxes");
  }
  std::vector<ShardRegion> distinct;
  int64_t covered = 0;
  for (auto& [box, ranges] : boxes) {
    ShardRegion region{box.first, box.second, 0, 0};
    for (const ShardRegion& other : distinct) {
      if (boxes_overlap(region, other)) {
        throw ShardIndexError(file, name, "two pieces' boxes overlap");
      }
    }
    const int64_t numel = region.box_numel();
    std::sort(ranges.begin(), ranges.end());
    int64_t next = 0;
    for (const auto& [begin, end] : ranges) {
      if (begin != next) {
        throw ShardIndexError(file, name,
                              begin < next ? "two pieces hold the same elements"
                                           : "elements " + std::to_string(next) + ".." +
                                                 std::to_string(begin) + " of a box are missing");
      }
      next = end;
    }
    if (next != numel) throw ShardIndexError(file, name, "the end of a box is missing");
    covered += numel;
    distinct.push_back(std::move(region));
  }
  if (covered != tensor.numel()) {
    throw ShardIndexError(file, name,
                          "its pieces hold " + std::to_string(covered) + " of its " +
                              std::to_string(tensor.numel()) + " elements");
  }
}

// Slicing-by-8 tables of the reflected polynomial `poly`.
std::array<std::array<uint32_t, 256>, 8> make_crc_tables(uint32_t poly) {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? poly ^ (c >> 1) : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (size_t s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
  return t;
}

uint32_t crc_by_tables(const std::array<std::array<uint32_t, 256>, 8>& t, uint32_t crc,
                       const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (size >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;  // little-endian machines (the only ones pipetrain's files are read on)
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) c = t[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
  return ~c;
}

#if defined(__x86_64__)
// SSE 4.2's crc32 instruction computes CRC-32C: 8 bytes per instruction.
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(uint32_t crc, const void* data,
                                                        size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
    p += 8;
    size -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (size-- > 0) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return ~c32;
}
#endif

}  // namespace

ShardIndexError::ShardIndexError(const std::string& file, const std::string& tensor,
                                 const std::string& problem)
    : FileError(describe(file, tensor, problem)), file_(file), tensor_(tensor) {}

const char* const kShardIndexFormat = "pipetrain-sharded-checkpoint";
const char* const kShardIndexFile = "index.json";

int64_t ShardRegion::box_numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

ShardRegion ShardRegion::whole(const std::vector<int64_t>& shape) {
  ShardRegion region{std::vector<int64_t>(shape.size(), 0), shape, 0, 0};
  region.flat_end = region.box_numel();
  return region;
}

int64_t ShardTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t ShardTensor::bytes() const {
  return static_cast<uint64_t>(numel()) * static_cast<uint64_t>(element_size(dtype));
}

const ShardTensor* ShardIndex::find(const std::string& name) const {
  const auto found = tensors.find(name);
  return found == tensors.end() ? nullptr : &found->second;
}

std::map<std::string, ShardTensor> shard_tensors_from_json(const nlohmann::json& tensors,
                                                           const std::string& file, size_t files) {
  if (!tensors.is_object()) throw ShardIndexError(file, "", "'tensors' is not an object");
  std::map<std::string, ShardTensor> out;
  for (const auto& [name, entry] : tensors.items()) {
    if (name.empty()) throw ShardIndexError(file, "", "a tensor without a name");
    if (!entry.is_object()) throw ShardIndexError(file, name, "not an object");
    ShardTensor tensor;
    tensor.dtype =
        parse_safetensors_dtype(get<std::string>(entry, "dtype", file, name), file, name);
    tensor.shape = get_dims(entry, "shape", file, name);
    const int64_t numel = product(tensor.shape, file, name);
    const auto pieces = entry.find("pieces");
    if (pieces == entry.end() || !pieces->is_array()) {
      throw ShardIndexError(file, name, "'pieces' is not a list");
    }
    for (const auto& p : *pieces) {
      if (!p.is_object()) throw ShardIndexError(file, name, "a piece is not an object");
      ShardPiece piece;
      const uint64_t f = get_offset(p, "file", file, name);
      if (f >= files) {
        throw ShardIndexError(
            file, name, "a piece names file " + std::to_string(f) + " of " + std::to_string(files));
      }
      piece.file = static_cast<size_t>(f);
      piece.begin = get_offset(p, "begin", file, name);
      piece.end = get_offset(p, "end", file, name);
      piece.region.offsets = get_dims(p, "box_offsets", file, name);
      piece.region.shape = get_dims(p, "box_shape", file, name);
      const std::vector<int64_t> flat = get_dims(p, "flat", file, name);
      // CRC-32C since the checksum became hardware's; the CRC-32 of the first indexes still reads.
      const char* field = "crc32c";
      if (!p.contains("crc32c") && p.contains("crc32")) {
        field = "crc32";
        piece.checksum_kind = ShardChecksum::kCrc32;
      }
      const uint64_t crc = get_offset(p, field, file, name);
      if (crc > std::numeric_limits<uint32_t>::max()) {
        throw ShardIndexError(file, name, std::string("'") + field + "' does not fit 32 bits");
      }
      piece.checksum = static_cast<uint32_t>(crc);
      if (piece.region.offsets.size() != tensor.shape.size() ||
          piece.region.shape.size() != tensor.shape.size() || flat.size() != 2) {
        throw ShardIndexError(file, name, "a piece's box or flat range has the wrong length");
      }
      for (size_t d = 0; d < tensor.shape.size(); ++d) {
        const int64_t o = piece.region.offsets[d], s = piece.region.shape[d];
        if (o < 0 || s <= 0 || s > tensor.shape[d] || o > tensor.shape[d] - s) {
          throw ShardIndexError(file, name, "a piece's box lies outside the tensor");
        }
      }
      const int64_t box = product(piece.region.shape, file, name);
      piece.region.flat_begin = flat[0];
      piece.region.flat_end = flat[1];
      if (flat[0] < 0 || flat[0] >= flat[1] || flat[1] > box) {
        throw ShardIndexError(file, name, "a piece's flat range is empty or outside its box");
      }
      const uint64_t bytes = static_cast<uint64_t>(flat[1] - flat[0]) *
                             static_cast<uint64_t>(element_size(tensor.dtype));
      if (piece.end < piece.begin || piece.end - piece.begin != bytes) {
        throw ShardIndexError(file, name,
                              "a piece's byte range does not hold its " +
                                  std::to_string(flat[1] - flat[0]) + " elements");
      }
      tensor.pieces.push_back(std::move(piece));
    }
    if (numel == 0 && !tensor.pieces.empty()) {
      throw ShardIndexError(file, name, "a tensor without elements has pieces");
    }
    out.emplace(name, std::move(tensor));
  }
  return out;
}

void check_shard_index(const ShardIndex& index, const std::string& file) {
  for (const auto& [name, tensor] : index.tensors) {
    for (const ShardPiece& piece : tensor.pieces) {
      if (piece.file >= index.files.size()) {
        throw ShardIndexError(file, name, "a piece names a file the index does not list");
      }
    }
    check_tiling(tensor, file, name);
  }
}

nlohmann::json shard_tensors_to_json(const std::map<std::string, ShardTensor>& tensors) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, tensor] : tensors) {
    nlohmann::json pieces = nlohmann::json::array();
    for (const ShardPiece& p : tensor.pieces) {
      pieces.push_back(
          {{"file", p.file},
           {"begin", p.begin},
           {"end", p.end},
           {"box_offsets", p.region.offsets},
           {"box_shape", p.region.shape},
           {"flat", {p.region.flat_begin, p.region.flat_end}},
           {p.checksum_kind == ShardChecksum::kCrc32 ? "crc32" : "crc32c", p.checksum}});
    }
    out[name] = {
        {"dtype", to_string(tensor.dtype)}, {"shape", tensor.shape}, {"pieces", std::move(pieces)}};
  }
  return out;
}

ShardIndex parse_shard_index(const std::string& text, const std::string& file) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    throw ShardIndexError(file, "", std::string("not JSON: ") + error.what());
  }
  if (!j.is_object()) throw ShardIndexError(file, "", "not a JSON object");
  if (get<std::string>(j, "format", file, "") != kShardIndexFormat) {
    throw ShardIndexError(file, "", std::string("'format' is not '") + kShardIndexFormat + "'");
  }
  ShardIndex index;
  index.version = get<int>(j, "version", file, "");
  if (index.version != 1) {
    throw ShardIndexError(
        file, "",
        "version " + std::to_string(index.version) + " is not one this pipetrain reads (1)");
  }
  index.files = get<std::vector<std::string>>(j, "files", file, "");
  std::set<std::string> seen;
  for (const std::string& name : index.files) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
        !seen.insert(name).second) {
      throw ShardIndexError(file, "", "bad or repeated file name '" + name + "'");
    }
  }
  if (j.contains("state")) index.state = j["state"];
  if (j.contains("layout")) index.layout = j["layout"];
  if (!index.state.is_object() || !index.layout.is_object()) {
    throw ShardIndexError(file, "", "'state' and 'layout' must be objects");
  }
  const auto tensors = j.find("tensors");
  if (tensors == j.end()) throw ShardIndexError(file, "", "no 'tensors'");
  index.tensors = shard_tensors_from_json(*tensors, file, index.files.size());
  check_shard_index(index, file);
  return index;
}

std::string serialize_shard_index(const ShardIndex& index) {
  nlohmann::json tensors = shard_tensors_to_json(index.tensors);
  const nlohmann::json j = {{"format", kShardIndexFormat}, {"version", index.version},
                            {"files", index.files},        {"state", index.state},
                            {"layout", index.layout},      {"tensors", std::move(tensors)}};
  return j.dump(1) + "\n";
}

int64_t for_each_run(const std::vector<int64_t>& shape, const ShardRegion& piece,
                     const ShardRegion& region,
                     const std::function<void(int64_t from, int64_t to, int64_t count)>& copy) {
  const size_t rank = shape.size();
  std::vector<int64_t> lo(rank), hi(rank);
  for (size_t d = 0; d < rank; ++d) {
    lo[d] = std::max(piece.offsets[d], region.offsets[d]);
    hi[d] = std::min(piece.offsets[d] + piece.shape[d], region.offsets[d] + region.shape[d]);
    if (lo[d] >= hi[d]) return 0;
  }
  // Row-major strides of the two boxes.
  std::vector<int64_t> piece_stride(rank, 1), region_stride(rank, 1);
  for (size_t d = rank; d-- > 1;) {
    piece_stride[d - 1] = piece_stride[d] * piece.shape[d];
    region_stride[d - 1] = region_stride[d] * region.shape[d];
  }
  const int64_t length = rank == 0 ? 1 : hi[rank - 1] - lo[rank - 1];
  std::vector<int64_t> at = lo;  // the first element of the current row
  int64_t total = 0;
  int64_t run_from = -1, run_to = -1, run_count = 0;
  auto flush = [&] {
    if (run_count > 0) copy(run_from, run_to, run_count);
    run_count = 0;
  };
  while (true) {
    int64_t pb = 0, pr = 0;
    for (size_t d = 0; d < rank; ++d) {
      pb += (at[d] - piece.offsets[d]) * piece_stride[d];
      pr += (at[d] - region.offsets[d]) * region_stride[d];
    }
    // Elements pb + k of the piece's box are pr + k of the region's, k in [0, length); keep the k
    // inside both flat ranges.
    const int64_t k0 = std::max({int64_t{0}, piece.flat_begin - pb, region.flat_begin - pr});
    const int64_t k1 = std::min({length, piece.flat_end - pb, region.flat_end - pr});
    if (k0 < k1) {
      const int64_t from = pb + k0 - piece.flat_begin, to = pr + k0 - region.flat_begin;
      if (run_count > 0 && from == run_from + run_count && to == run_to + run_count) {
        run_count += k1 - k0;
      } else {
        flush();
        run_from = from;
        run_to = to;
        run_count = k1 - k0;
      }
      total += k1 - k0;
    }
    // The next row: advance the dimensions before the last, odometer-wise.
    if (rank <= 1) break;
    size_t d = rank - 1;
    while (d-- > 0) {
      if (++at[d] < hi[d]) break;
      at[d] = lo[d];
    }
    if (d == static_cast<size_t>(-1)) break;
  }
  flush();
  return total;
}

uint32_t crc32_update(uint32_t crc, const void* data, size_t size) {
  static const std::array<std::array<uint32_t, 256>, 8> t = make_crc_tables(0xEDB88320u);
  return crc_by_tables(t, crc, data, size);
}

uint32_t crc32c_update(uint32_t crc, const void* data, size_t size) {
#if defined(__x86_64__)
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  if (hardware) return crc32c_sse42(crc, data, size);
#endif
  return detail::crc32c_by_tables(crc, data, size);
}

uint32_t detail::crc32c_by_tables(uint32_t crc, const void* data, size_t size) {
  static const std::array<std::array<uint32_t, 256>, 8> t = make_crc_tables(0x82F63B78u);
  return crc_by_tables(t, crc, data, size);
}

uint32_t shard_checksum(ShardChecksum kind, const void* data, size_t size) {
  return kind == ShardChecksum::kCrc32 ? crc32_update(0, data, size) : crc32c_update(0, data, size);
}

}  // namespace pipetrain::io
