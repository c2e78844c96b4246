// Fuzzes the safetensors header reader (io/safetensors_format.h): a Hugging Face checkpoint's
// files (`train --model DIR`) are read through it, memory-mapped, so every offset it accepts must
// lie inside the file. On any input it returns a header whose tensors tile the data exactly, or
// throws a SafetensorsError; the checks below hold it to that.
#include <cstdint>
#include <cstdlib>

#include "fuzz_check.h"
#include "pipetrain/io/safetensors_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  fuzz::expect_only_pipetrain_errors([&] {
    const io::SafetensorsHeader header =
        io::parse_safetensors_header(reinterpret_cast<const char*>(data), size, "fuzz.safetensors");
    uint64_t end = header.data_offset;
    for (const io::SafetensorsEntry& entry : header.entries) {
      // Each tensor begins where the one before ends, and the last ends at the file's end.
      if (entry.offset != end || entry.offset + entry.bytes > size) std::abort();
      end = entry.offset + entry.bytes;
    }
    if (end != size) std::abort();
  });
  return 0;
}
