// Little-endian integers in file bytes: what token files, indexed datasets and safetensors store.
// pipetrain runs on little-endian hosts only (io/safetensors.cpp asserts it), so a value is its
// bytes copied; memcpy keeps unaligned reads defined. Torch-free, header-only.
#pragma once

#include <cstring>
#include <string>

namespace pipetrain::io {

// The T stored at `bytes` (unaligned allowed).
template <typename T>
T load_little_endian(const char* bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof(T));
  return value;
}

// Appends `value`'s bytes to `out`.
template <typename T>
void append_little_endian(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

}  // namespace pipetrain::io
