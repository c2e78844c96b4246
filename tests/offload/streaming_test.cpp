// offload/streaming.h: a range larger than a buffer goes to a file and back through the bounded
// pool, slice by slice, from and into unaligned memory, with both engines; the pool lends no more
// than it has and the call no more than it may; a range past its region fails naming the file and
// leaves no buffer lent.
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../helpers/temp_dir.h"
#include "pipetrain/base/error.h"
#include "pipetrain/offload/aligned_buffers.h"
#include "pipetrain/offload/file_io.h"
#include "pipetrain/offload/streaming.h"
#include "pipetrain/offload/swap_file.h"

namespace pipetrain::offload {
namespace {

using pipetrain::testing::fresh_temp_dir;

TEST(Streaming, ARangeOfManyBuffersReadsBackFromUnalignedMemory) {
  std::vector<IoEngine> engines{IoEngine::kThreads};
  if (uring_available()) engines.push_back(IoEngine::kUring);
  for (IoEngine engine : engines) {
    SCOPED_TRACE(to_string(engine));
    SwapFile file(fresh_temp_dir(std::string("stream_") + to_string(engine)), "swap",
                  make_file_io(engine, 3));
    // 10.5 buffers of 64 KiB; two regions, so the second starts where the first's padding ends.
    constexpr int64_t kBytes = 10 * 65536 + 32768 + 3;
    const int64_t first = file.reserve(kBytes);
    const int64_t second = file.reserve(kBytes);
    std::vector<char> a(kBytes + 1), b(kBytes + 1);
    for (int64_t i = 0; i < kBytes + 1; ++i) {
      a[static_cast<size_t>(i)] = static_cast<char>(i * 31 % 253);
      b[static_cast<size_t>(i)] = static_cast<char>(i * 17 % 241);
    }
    for (int most : {1, 3, 8}) {  // 8: more than the pool lends
      SCOPED_TRACE(most);
      AlignedBuffers pool(65536, 4);
      stream_to_file(file, first, a.data() + 1, kBytes, pool, most);  // unaligned source
      stream_to_file(file, second, b.data() + 1, kBytes, pool, most);
      std::vector<char> back(kBytes);
      stream_from_file(file, first, back.data(), kBytes, pool, most);
      EXPECT_EQ(std::memcmp(back.data(), a.data() + 1, kBytes), 0);
      stream_from_file(file, second, back.data(), kBytes, pool, most);
      EXPECT_EQ(std::memcmp(back.data(), b.data() + 1, kBytes), 0);
      EXPECT_LE(pool.peak_in_use(), std::min(most, 4));
      EXPECT_EQ(pool.in_use(), 0);
    }
  }
}

TEST(Streaming, ARangePastItsRegionFailsAndLeavesNoBufferLent) {
  SwapFile file(fresh_temp_dir("stream_past"), "swap", make_file_io(IoEngine::kThreads, 2));
  const int64_t at = file.reserve(3 * 4096);
  std::vector<char> data(10 * 4096, 'x');
  AlignedBuffers pool(4096, 2);
  EXPECT_THROW(stream_to_file(file, at, data.data(), 10 * 4096, pool, 2), Error);
  EXPECT_EQ(pool.in_use(), 0);
  EXPECT_THROW(stream_to_file(file, at, data.data(), 4096, pool, 0), BadInput);
}

}  // namespace
}  // namespace pipetrain::offload
