// The index of a sharded checkpoint, torch-free: which global tensors a checkpoint holds, and
// where each stored piece of them lies in which rank's file. A reader plans its copies from it
// (for_each_run) without touching any other piece's bytes.
//
//   DIR/step-N/index.json               this index (written last: a directory without it is no
//   DIR/step-N/rank-00000.safetensors   checkpoint), and one file per rank, each a safetensors
//   DIR/step-N/rank-00001.safetensors   file of flat 1-D pieces
//   ...
//   {"format": "pipetrain-sharded-checkpoint", "version": 1,
//    "files": ["rank-00000.safetensors", ...],
//    "state": {...the trainer's: step, epoch, optimizer, metadata...},
//    "layout": {...the layout it was written at: world, pp, tp, dp, zero...},
//    "tensors": {"param/3.weight": {"dtype": "F32", "shape": [64, 32], "pieces": [
//        {"file": 1, "begin": 136, "end": 4232, "box_offsets": [32, 0], "box_shape": [32, 32],
//         "flat": [0, 1024], "crc32c": 2874511034}, ...]}, ...}}
//
// A piece: a box of the global tensor (box_offsets, box_shape: a tensor-parallel rank's slice, or
// the whole tensor), and elements [flat[0], flat[1]) of that box in row-major order (a ZeRO or
// data-parallel replica's share of it), stored as bytes [begin, end) of file `file`, with the
// CRC-32C (Castagnoli, SSE 4.2's crc32 instruction) of those bytes ("crc32": zlib's CRC-32, which
// the first indexes stored, still reads). parse_shard_index checks that the boxes of a tensor
// tile it exactly (disjoint, in bounds, elements adding up) and that the flat ranges of each box
// tile the box, and that each piece's byte count is its elements times the dtype's size: every
// element of every tensor is stored exactly once. Every problem is a ShardIndexError naming the
// file and the tensor (CLI exit 2).
//
// Torch-free (pipetrain::schedule's library, fuzzed by fuzz/shard_index_fuzzer.cpp).
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipetrain/base/error.h"
#include "pipetrain/io/safetensors_format.h"

namespace pipetrain::io {

// A sharded checkpoint that cannot be used: a broken index, a piece missing, truncated or whose
// bytes differ from its checksum, a tensor the model needs and the checkpoint lacks. file() and
// tensor() say which ("" where none applies); what() names both. CLI exit 2.
class ShardIndexError : public FileError {
 public:
  ShardIndexError(const std::string& file, const std::string& tensor, const std::string& problem);
  const std::string& file() const { return file_; }
  const std::string& tensor() const { return tensor_; }

 private:
  std::string file_, tensor_;
};

extern const char* const kShardIndexFormat;  // "pipetrain-sharded-checkpoint"
extern const char* const kShardIndexFile;    // "index.json"

// A region of a global tensor: elements [flat_begin, flat_end) of the box at `offsets` of size
// `shape`, row-major. The whole tensor: offsets all 0, shape its shape, flat [0, numel).
struct ShardRegion {
  std::vector<int64_t> offsets;
  std::vector<int64_t> shape;
  int64_t flat_begin = 0;
  int64_t flat_end = 0;

  int64_t box_numel() const;
  int64_t elements() const { return flat_end - flat_begin; }
  static ShardRegion whole(const std::vector<int64_t>& shape);
};

// Which checksum a piece stores: CRC-32C (what is written) or zlib's CRC-32 (read from the first
// indexes).
enum class ShardChecksum { kCrc32c, kCrc32 };

struct ShardPiece {
  size_t file = 0;     // index into ShardIndex::files
  uint64_t begin = 0;  // bytes [begin, end) of that file
  uint64_t end = 0;
  ShardRegion region;
  ShardChecksum checksum_kind = ShardChecksum::kCrc32c;
  uint32_t checksum = 0;
};

struct ShardTensor {
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  std::vector<ShardPiece> pieces;

  int64_t numel() const;
  uint64_t bytes() const;
};

struct ShardIndex {
  int version = 1;
  std::vector<std::string> files;  // names relative to the checkpoint's directory
  nlohmann::json state = nlohmann::json::object();
  nlohmann::json layout = nlohmann::json::object();
  std::map<std::string, ShardTensor> tensors;

  // The tensor called `name`, or nullptr.
  const ShardTensor* find(const std::string& name) const;
};

// Parses and checks an index (the text of `file`). Throws ShardIndexError naming `file` and the
// tensor for every problem above; nothing else escapes on any input.
ShardIndex parse_shard_index(const std::string& text, const std::string& file);
// The JSON text of `index` (parse_shard_index reads it back equal).
std::string serialize_shard_index(const ShardIndex& index);

// Checks `index` as parse_shard_index does (for an index put together in memory from the ranks'
// pieces). Throws ShardIndexError naming `file`.
void check_shard_index(const ShardIndex& index, const std::string& file);
// The "tensors" object of an index and back, for a rank handing its pieces to the one that writes
// the index: each entry checked as parse_shard_index checks it, but not that the pieces tile it
// (`files`: how many files the pieces may name).
nlohmann::json shard_tensors_to_json(const std::map<std::string, ShardTensor>& tensors);
std::map<std::string, ShardTensor> shard_tensors_from_json(const nlohmann::json& tensors,
                                                           const std::string& file, size_t files);

// Calls copy(piece element, region element, count) for every run of elements the stored `piece`
// and the wanted `region` (of the same tensor, whose shape is `shape`) have in common: the run's
// first element as an index into the piece's flat elements and into the region's, and its length.
// Runs are contiguous in both and maximal along the last dimension; together they are exactly the
// common elements. Returns the number of common elements.
int64_t for_each_run(const std::vector<int64_t>& shape, const ShardRegion& piece,
                     const ShardRegion& region,
                     const std::function<void(int64_t from, int64_t to, int64_t count)>& copy);

// CRC-32 (ISO-HDLC, as zlib's crc32): `crc` of the bytes before, updated with [data, data + size).
uint32_t crc32_update(uint32_t crc, const void* data, size_t size);
// CRC-32C (Castagnoli, as iSCSI's and SSE 4.2's): the same, by the crc32 instruction where the CPU
// has it (3.8x the tables here: 5.2 against 1.37 GB/s on one core), by tables otherwise.
uint32_t crc32c_update(uint32_t crc, const void* data, size_t size);
// The checksum of `kind` of [data, data + size).
uint32_t shard_checksum(ShardChecksum kind, const void* data, size_t size);
namespace detail {
// crc32c_update's table path (the one CPUs without SSE 4.2 take), for its tests.
uint32_t crc32c_by_tables(uint32_t crc, const void* data, size_t size);
}  // namespace detail

}  // namespace pipetrain::io
