// The safetensors header: parsing with every check, and serializing (io/safetensors_format.h).
#include "pipetrain/io/safetensors_format.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

namespace pipetrain::io {
namespace {

struct DtypeName {
  SafetensorsDtype dtype;
  const char* name;
  int64_t size;
};

constexpr DtypeName kDtypes[] = {
    {SafetensorsDtype::kBool, "BOOL", 1},       {SafetensorsDtype::kU8, "U8", 1},
    {SafetensorsDtype::kI8, "I8", 1},           {SafetensorsDtype::kI16, "I16", 2},
    {SafetensorsDtype::kU16, "U16", 2},         {SafetensorsDtype::kF16, "F16", 2},
    {SafetensorsDtype::kBF16, "BF16", 2},       {SafetensorsDtype::kI32, "I32", 4},
    {SafetensorsDtype::kU32, "U32", 4},         {SafetensorsDtype::kF32, "F32", 4},
    {SafetensorsDtype::kF64, "F64", 8},         {SafetensorsDtype::kI64, "I64", 8},
    {SafetensorsDtype::kU64, "U64", 8},         {SafetensorsDtype::kF8E4M3, "F8_E4M3", 1},
    {SafetensorsDtype::kF8E5M2, "F8_E5M2", 1},
};

const DtypeName& lookup(SafetensorsDtype dtype) {
  for (const DtypeName& d : kDtypes) {
    if (d.dtype == dtype) return d;
  }
  return kDtypes[0];  // not reached: every enumerator is listed
}

std::string what_of(const std::string& file, const std::string& tensor,
                    const std::string& problem) {
  std::string text = file.empty() ? std::string("safetensors") : file;
  if (!tensor.empty()) text += ": tensor '" + tensor + "'";
  return text + ": " + problem;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t d = 0; d < shape.size(); ++d) text += (d ? ", " : "") + std::to_string(shape[d]);
  return text + "]";
}

// A JSON value that must be a non-negative integer no larger than `limit`.
bool as_count(const nlohmann::json& value, uint64_t limit, uint64_t& out) {
  if (!value.is_number_unsigned()) return false;  // negative, float, string, ...
  out = value.get<uint64_t>();
  return out <= limit;
}

SafetensorsEntry parse_entry(const std::string& name, const nlohmann::json& value,
                             const std::string& file) {
  auto fail = [&](const std::string& problem) { throw SafetensorsError(file, name, problem); };
  if (!value.is_object()) fail("its entry is not an object of dtype, shape and data_offsets");
  for (const auto& field : value.items()) {
    if (field.key() != "dtype" && field.key() != "shape" && field.key() != "data_offsets") {
      fail("unexpected field '" + field.key() + "' (an entry has dtype, shape and data_offsets)");
    }
  }
  if (!value.contains("dtype") || !value.at("dtype").is_string()) fail("no dtype string");
  if (!value.contains("shape") || !value.at("shape").is_array()) fail("no shape array");
  if (!value.contains("data_offsets") || !value.at("data_offsets").is_array() ||
      value.at("data_offsets").size() != 2) {
    fail("no data_offsets pair [begin, end]");
  }
  SafetensorsEntry entry;
  entry.name = name;
  entry.dtype = parse_safetensors_dtype(value.at("dtype").get<std::string>(), file, name);
  // Element counts past 2^62 cannot be any file's: refuse before multiplying.
  constexpr uint64_t kLimit = uint64_t{1} << 62;
  uint64_t elements = 1;
  for (const auto& dimension : value.at("shape")) {
    uint64_t size = 0;
    if (!as_count(dimension, kLimit, size)) {
      fail("shape " + value.at("shape").dump() + " has a dimension that is not a count");
    }
    entry.shape.push_back(static_cast<int64_t>(size));
    if (size != 0 && elements > kLimit / size) {
      fail("shape " + value.at("shape").dump() + " has more elements than any file holds");
    }
    elements *= size;
  }
  uint64_t begin = 0, end = 0;
  const auto& offsets = value.at("data_offsets");
  if (!as_count(offsets[0], kLimit, begin) || !as_count(offsets[1], kLimit, end) || end < begin) {
    fail("data_offsets " + offsets.dump() + " are not a range [begin, end] of byte offsets");
  }
  const uint64_t bytes = elements * static_cast<uint64_t>(element_size(entry.dtype));
  if (end - begin != bytes) {
    fail("shape " + shape_text(entry.shape) + " of " + to_string(entry.dtype) + " needs " +
         std::to_string(bytes) + " bytes but data_offsets " + offsets.dump() + " span " +
         std::to_string(end - begin));
  }
  entry.offset = begin;  // relative to the data for now
  entry.bytes = bytes;
  return entry;
}

std::map<std::string, std::string> parse_metadata(const nlohmann::json& value,
                                                  const std::string& file) {
  if (!value.is_object()) {
    throw SafetensorsError(file, "", "__metadata__ is not an object of strings");
  }
  std::map<std::string, std::string> metadata;
  for (const auto& item : value.items()) {
    if (!item.value().is_string()) {
      throw SafetensorsError(file, "", "__metadata__ value of '" + item.key() +
                                           "' is not a string: " + item.value().dump());
    }
    metadata[item.key()] = item.value().get<std::string>();
  }
  return metadata;
}

// The spans must tile [0, data_bytes): sorted by offset, each begins where the previous ended.
void check_tiling(std::vector<SafetensorsEntry>& entries, uint64_t data_bytes,
                  const std::string& file) {
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.bytes < b.bytes;
  });
  uint64_t position = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& entry : entries) {
    const uint64_t end = entry.offset + entry.bytes;
    if (end > data_bytes) {
      throw SafetensorsError(file, entry.name,
                             "data_offsets [" + std::to_string(entry.offset) + ", " +
                                 std::to_string(end) + "] point past the end of the data (" +
                                 std::to_string(data_bytes) + " bytes; is the file truncated?)");
    }
    if (entry.offset < position) {
      throw SafetensorsError(file, entry.name,
                             "its bytes overlap those of '" + (previous ? previous->name : "") +
                                 "' (offset " + std::to_string(entry.offset) + " < " +
                                 std::to_string(position) + ")");
    }
    if (entry.offset > position) {
      throw SafetensorsError(file, entry.name,
                             "a hole of " + std::to_string(entry.offset - position) +
                                 " bytes lies before it (offset " + std::to_string(entry.offset) +
                                 ", the previous tensor ends at " + std::to_string(position) + ")");
    }
    position = end;
    previous = &entry;
  }
  if (position != data_bytes) {
    throw SafetensorsError(file, "",
                           std::to_string(data_bytes - position) +
                               " bytes follow the last tensor's data (the data holds " +
                               std::to_string(data_bytes) + " bytes, the tensors " +
                               std::to_string(position) + ")");
  }
}

}  // namespace

SafetensorsError::SafetensorsError(const std::string& file, const std::string& tensor,
                                   const std::string& problem)
    : FileError(what_of(file, tensor, problem)), file_(file), tensor_(tensor) {}

const char* to_string(SafetensorsDtype dtype) {
  return lookup(dtype).name;
}

int64_t element_size(SafetensorsDtype dtype) {
  return lookup(dtype).size;
}

SafetensorsDtype parse_safetensors_dtype(const std::string& name, const std::string& file,
                                         const std::string& tensor) {
  for (const DtypeName& d : kDtypes) {
    if (name == d.name) return d.dtype;
  }
  std::string known;
  for (const DtypeName& d : kDtypes) known += (known.empty() ? "" : ", ") + std::string(d.name);
  throw SafetensorsError(file, tensor, "unknown dtype '" + name + "' (the format's: " + known + ")");
}

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const SafetensorsEntry* SafetensorsHeader::find(const std::string& name) const {
  for (const SafetensorsEntry& entry : entries) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

SafetensorsHeader parse_safetensors_header(const char* bytes, uint64_t size,
                                           const std::string& file) {
  if (size < 8) {
    throw SafetensorsError(file, "",
                           "truncated: " + std::to_string(size) +
                               " bytes, fewer than the 8 that hold the header's length");
  }
  uint64_t length = 0;
  for (int b = 7; b >= 0; --b) length = (length << 8) | static_cast<unsigned char>(bytes[b]);
  if (length > kMaxSafetensorsHeaderBytes) {
    throw SafetensorsError(file, "",
                           "header length " + std::to_string(length) + " is over the limit of " +
                               std::to_string(kMaxSafetensorsHeaderBytes) +
                               " bytes (not a safetensors file?)");
  }
  if (length > size - 8) {
    throw SafetensorsError(file, "",
                           "header length " + std::to_string(length) +
                               " points past the end of the file (" + std::to_string(size) +
                               " bytes; is it truncated?)");
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + length);
  } catch (const nlohmann::json::exception& error) {
    throw SafetensorsError(file, "", std::string("the header is not JSON: ") + error.what());
  }
  if (!header.is_object()) throw SafetensorsError(file, "", "the header is not a JSON object");
  SafetensorsHeader result;
  result.data_offset = 8 + length;
  for (const auto& item : header.items()) {
    if (item.key() == "__metadata__") {
      result.metadata = parse_metadata(item.value(), file);
    } else {
      result.entries.push_back(parse_entry(item.key(), item.value(), file));
    }
  }
  check_tiling(result.entries, size - result.data_offset, file);
  for (SafetensorsEntry& entry : result.entries) entry.offset += result.data_offset;
  return result;
}

std::string serialize_safetensors_header(const std::vector<SafetensorsLayoutEntry>& entries,
                                         const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::set<std::string> names;
  for (const SafetensorsLayoutEntry& entry : entries) {
    if (entry.name.empty() || entry.name == "__metadata__" || !names.insert(entry.name).second) {
      throw BadInput("safetensors: tensor name '" + entry.name +
                     "' is empty, reserved or repeated; every tensor needs a name of its own");
    }
    uint64_t elements = 1;
    for (int64_t d : entry.shape) {
      if (d < 0) {
        throw BadInput("safetensors: tensor '" + entry.name + "' has shape " +
                       shape_text(entry.shape) + " with a negative dimension");
      }
      elements *= static_cast<uint64_t>(d);
    }
    const uint64_t bytes = elements * static_cast<uint64_t>(element_size(entry.dtype));
    header[entry.name] = {{"dtype", to_string(entry.dtype)},
                          {"shape", entry.shape},
                          {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t length = json.size();
  for (int b = 0; b < 8; ++b) out[static_cast<size_t>(b)] = static_cast<char>(length >> (8 * b));
  return out + json;
}

}  // namespace pipetrain::io
