// Fuzzes the reader of Megatron's dataset index (io/indexed_dataset.h): `train --data indexed`
// maps PREFIX.idx and reads its arrays through it. On any input it returns arrays of the sizes the
// header states, with document indices rising from 0 to the sequence count, or throws BadInput.
#include <cstdint>
#include <cstdlib>

#include "fuzz_check.h"
#include "pipetrain/io/indexed_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  fuzz::expect_only_pipetrain_errors([&] {
    const io::IndexedIndex index =
        io::parse_indexed_index(reinterpret_cast<const char*>(data), size, "fuzz.idx");
    const size_t sequences = index.sequence_lengths.size();
    if (index.sequence_pointers.size() != sequences) std::abort();
    if (index.document_indices.empty() || index.document_indices.front() != 0 ||
        index.document_indices.back() != static_cast<int64_t>(sequences)) {
      std::abort();
    }
    for (size_t k = 1; k < index.document_indices.size(); ++k) {
      if (index.document_indices[k] < index.document_indices[k - 1]) std::abort();
    }
    for (int32_t length : index.sequence_lengths) {
      if (length < 0) std::abort();
    }
  });
  return 0;
}
