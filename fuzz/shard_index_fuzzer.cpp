// Fuzzes the sharded checkpoint's index reader (io/shard_index.h): `train --resume DIR` and
// `checkpoint-info` read DIR/step-N/index.json, and every byte range it accepts is read out of a
// memory-mapped file. On any input it returns an index whose pieces store every element of every
// tensor exactly once, or throws a ShardIndexError; the checks below hold it to that.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz_check.h"
#include "pipetrain/io/shard_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  fuzz::expect_only_pipetrain_errors([&] {
    const io::ShardIndex index =
        io::parse_shard_index(std::string(fuzz::as_text(data, size)), "fuzz/index.json");
    for (const auto& entry : index.tensors) {
      const io::ShardTensor& tensor = entry.second;
      int64_t stored = 0;
      for (const io::ShardPiece& piece : tensor.pieces) {
        if (piece.file >= index.files.size() || piece.end < piece.begin) std::abort();
        stored += piece.region.elements();
      }
      if (stored != tensor.numel()) std::abort();
      // Reading the whole tensor through the copy plan covers each element once (small ones).
      if (tensor.numel() > 4096) continue;
      const io::ShardRegion whole = io::ShardRegion::whole(tensor.shape);
      std::string seen(static_cast<size_t>(tensor.numel()), '\0');
      for (const io::ShardPiece& piece : tensor.pieces) {
        io::for_each_run(tensor.shape, piece.region, whole,
                         [&](int64_t from, int64_t to, int64_t count) {
                           if (from < 0 || from + count > piece.region.elements()) std::abort();
                           for (int64_t i = to; i < to + count; ++i) {
                             if (i < 0 || i >= tensor.numel() || seen[static_cast<size_t>(i)])
                               std::abort();
                             seen[static_cast<size_t>(i)] = 1;
                           }
                         });
      }
      if (seen.find('\0') != std::string::npos) std::abort();
    }
  });
  return 0;
}
