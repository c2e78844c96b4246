// The safetensors file format, torch-free: reading and checking a file's header, and writing one.
//
//   bytes 0..7         N, the header's length (unsigned 64-bit little-endian)
//   bytes 8..8+N-1     a JSON object: {"<tensor name>": {"dtype": "F32", "shape": [2, 3],
//                      "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v"}}
//                      (UTF-8, may end in spaces that pad the data to 8 bytes)
//   bytes 8+N..        the data: each tensor's raw little-endian bytes, row-major, at
//                      [begin, end) relative to the data's start
//
// parse_safetensors_header checks everything a reader needs before it touches a tensor's bytes:
// the length fits the file, the header is a JSON object of well-formed entries, each dtype is
// known, each shape's byte count equals its span, and the spans tile the data exactly (no
// overlap, no hole, nothing past the end), as the reference implementation requires. Every
// problem is a SafetensorsError naming the file and, where there is one, the tensor. Nothing is
// read outside [bytes, bytes + size).
//
// serialize_safetensors_header lays out tensors in the order given and returns the 8 bytes of
// length plus the JSON header padded with spaces to a multiple of 8 (so that data offsets keep
// the alignment of the element sizes when wider types come first).
//
// Torch-free (pipetrain::schedule's library, fuzzed by fuzz/safetensors_fuzzer.cpp).
// Thread-safety: pure functions over the caller's bytes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "pipetrain/base/error.h"

namespace pipetrain::io {

// A safetensors file (or a sharded set's index) that cannot be used: truncated, a header pointing
// past the end, an unknown dtype, a tensor missing, extra or of the wrong shape. file() and
// tensor() say which ("" where none applies); what() names both. CLI exit 2.
class SafetensorsError : public FileError {
 public:
  SafetensorsError(const std::string& file, const std::string& tensor, const std::string& problem);
  const std::string& file() const { return file_; }
  const std::string& tensor() const { return tensor_; }

 private:
  std::string file_, tensor_;
};

// The element types of the format. pipetrain converts F32, F16, BF16 (and F64) into a model's
// dtype; the others are parsed, named in errors, and refused by the tensor readers.
enum class SafetensorsDtype {
  kBool, kU8, kI8, kI16, kU16, kF16, kBF16, kI32, kU32, kF32, kF64, kI64, kU64, kF8E4M3, kF8E5M2
};

// "F32", "BF16", ...; the format's own names.
const char* to_string(SafetensorsDtype dtype);
// Bytes per element.
int64_t element_size(SafetensorsDtype dtype);
// Throws SafetensorsError(file, tensor, "unknown dtype ...") for a name the format does not have.
SafetensorsDtype parse_safetensors_dtype(const std::string& name, const std::string& file = "",
                                         const std::string& tensor = "");

struct SafetensorsEntry {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // of the first byte, from the start of the FILE
  uint64_t bytes = 0;   // = product(shape) * element_size(dtype)

  int64_t numel() const;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in the order of their data
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // 8 + header length

  // The entry called `name`, or nullptr.
  const SafetensorsEntry* find(const std::string& name) const;
};

// The longest header accepted (the reference implementation's limit): a length above it is
// refused before anything is allocated.
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Parses and checks the header of the file `file` whose whole content is [bytes, bytes + size).
// Throws SafetensorsError naming `file` (and the tensor) for every problem described above.
SafetensorsHeader parse_safetensors_header(const char* bytes, uint64_t size,
                                           const std::string& file);

// What serialize_safetensors_header lays out: a tensor's name, dtype and shape.
struct SafetensorsLayoutEntry {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
};

// The length and JSON header of a file holding `entries` in this order, padded with spaces to a
// multiple of 8 bytes; the data follows it, each tensor's bytes in order. Throws BadInput for an
// empty or repeated name, the reserved name "__metadata__", or a negative dimension.
std::string serialize_safetensors_header(const std::vector<SafetensorsLayoutEntry>& entries,
                                         const std::map<std::string, std::string>& metadata = {});

}  // namespace pipetrain::io
