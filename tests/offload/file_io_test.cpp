// offload/: the bounded aligned buffers, the two I/O engines (io_uring and a pool of threads) and
// the swap file. Every byte written through an engine reads back, with more requests than the
// engine's depth in flight, with and without O_DIRECT; failures name the file, the offset and the
// reason; the pool never lends more than it has. Torch-free.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "../helpers/temp_dir.h"
#include "pipetrain/base/error.h"
#include "pipetrain/offload/aligned_buffers.h"
#include "pipetrain/offload/file_io.h"
#include "pipetrain/offload/swap_file.h"

namespace pipetrain::offload {
namespace {

namespace fs = std::filesystem;

using pipetrain::testing::fresh_temp_dir;

// The engines this machine runs; io_uring is left out (and the test says so) where the build or
// the kernel has none.
std::vector<IoEngine> engines() {
  std::vector<IoEngine> out{IoEngine::kThreads};
  if (uring_available()) {
    out.push_back(IoEngine::kUring);
  } else {
    std::cout << "[ note ] io_uring not tested: " << detail::uring_unavailable_reason() << "\n";
  }
  return out;
}

void fill(char* data, int64_t bytes, int seed) {
  for (int64_t i = 0; i < bytes; ++i) data[i] = static_cast<char>((i * 131 + seed * 7919) % 251);
}

TEST(AlignedBuffers, LendsAlignedBuffersAndNeverMoreThanItHas) {
  AlignedBuffers pool(10000, 3);
  EXPECT_EQ(pool.buffer_bytes(), 12288);  // rounded up to 4096
  EXPECT_EQ(pool.total_bytes(), 3 * 12288);
  std::vector<BufferLease> leases;
  for (int i = 0; i < 3; ++i) {
    leases.push_back(pool.acquire());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(leases.back().data()) % 4096, 0u);
    EXPECT_EQ(leases.back().size(), 12288);
  }
  EXPECT_FALSE(pool.try_acquire().has_value());
  EXPECT_EQ(pool.in_use(), 3);

  // A waiter gets the buffer handed back.
  char* handed_back = leases[1].data();
  std::thread waiter([&] {
    BufferLease lease = pool.acquire();
    EXPECT_EQ(lease.data(), handed_back);
  });
  leases[1].release();
  waiter.join();
  EXPECT_EQ(pool.peak_in_use(), 3);
  leases.clear();
  EXPECT_EQ(pool.in_use(), 0);
}

TEST(AlignedBuffers, RefusesSizesItCannotHaveNamingTheFlag) {
  EXPECT_THROW(AlignedBuffers(0, 2), BadInput);
  try {
    AlignedBuffers(4096, 0);
    FAIL() << "a pool of no buffers was made";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("--offload-buffer-count 0"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(AlignedBuffers(4096, 2, 3000), BadInput);
}

TEST(FileIo, EveryByteReadsBackWithMoreRequestsThanTheDepthInFlight) {
  for (IoEngine engine : engines()) {
    SCOPED_TRACE(to_string(engine));
    const std::string dir = fresh_temp_dir(std::string("roundtrip_") + to_string(engine));
    auto io = std::shared_ptr<FileIo>(make_file_io(engine, 2));
    EXPECT_EQ(io->engine(), engine);
    SwapFile file(dir, "swap", io);
    EXPECT_TRUE(fs::is_empty(dir)) << "the swap file stays named in " << dir;

    // 12 regions of uneven sizes (the last block of each padded), all written at once.
    constexpr int kRegions = 12;
    AlignedBuffers pool(3 << 20, kRegions);
    std::vector<BufferLease> leases;
    std::vector<int64_t> offsets, sizes;
    std::vector<IoTicket> tickets;
    for (int i = 0; i < kRegions; ++i) {
      sizes.push_back((i + 1) * 250001);  // not multiples of the block
      offsets.push_back(file.reserve(sizes.back()));
      EXPECT_EQ(offsets.back() % 4096, 0);
      leases.push_back(pool.acquire());
      fill(leases.back().data(), sizes.back(), i);
      tickets.push_back(file.write(offsets.back(), leases.back().data(), sizes.back()));
    }
    for (const IoTicket& t : tickets) t.wait();
    tickets.clear();
    for (int i = 0; i < kRegions; ++i) {
      std::memset(leases[static_cast<size_t>(i)].data(), 0,
                  static_cast<size_t>(pool.buffer_bytes()));
      tickets.push_back(file.read(offsets[static_cast<size_t>(i)],
                                  leases[static_cast<size_t>(i)].data(),
                                  sizes[static_cast<size_t>(i)]));
    }
    std::vector<char> expected;
    for (int i = 0; i < kRegions; ++i) {
      tickets[static_cast<size_t>(i)].wait();
      expected.resize(static_cast<size_t>(sizes[static_cast<size_t>(i)]));
      fill(expected.data(), sizes[static_cast<size_t>(i)], i);
      EXPECT_EQ(
          std::memcmp(expected.data(), leases[static_cast<size_t>(i)].data(), expected.size()), 0)
          << "region " << i;
    }
  }
}

// Through the page cache (what a file system without O_DIRECT gets; tmpfs takes O_DIRECT since
// Linux 6.6, so here it is asked for): unaligned memory and lengths are fine.
TEST(FileIo, ThroughThePageCacheUnalignedMemoryIsFine) {
  for (IoEngine engine : engines()) {
    SCOPED_TRACE(to_string(engine));
    SwapFile file(fresh_temp_dir(std::string("buffered_") + to_string(engine)), "swap",
                  make_file_io(engine, 1), 4096, /*direct=*/false);
    EXPECT_FALSE(file.direct());
    const int64_t at = file.reserve(1000);
    std::vector<char> out(1000), in(1000);
    fill(out.data(), 1000, 3);
    file.write(at, out.data() + 1, 999).wait();
    file.read(at, in.data(), 999).wait();
    EXPECT_EQ(std::memcmp(out.data() + 1, in.data(), 999), 0);
  }
}

TEST(FileIo, AFailedTransferNamesTheFileTheOffsetAndTheReason) {
  for (IoEngine engine : engines()) {
    SCOPED_TRACE(to_string(engine));
    const std::string path = fresh_temp_dir(std::string("errors_") + to_string(engine)) + "/short";
    std::ofstream(path) << std::string(100, 'x');
    auto io = make_file_io(engine, 2);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    std::vector<char> data(4096);
    try {
      io->read(fd, 50, data.data(), 4096, path).wait();
      ADD_FAILURE() << "reading past the end succeeded";
    } catch (const FileError& e) {
      EXPECT_NE(std::string(e.what()).find("cannot read '" + path + "' at offset 50 (4096 bytes)"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("the file ends after 50 bytes"), std::string::npos)
          << e.what();
    }
    try {
      io->write(fd, 0, data.data(), 10, path).wait();  // opened read-only
      ADD_FAILURE() << "writing a read-only descriptor succeeded";
    } catch (const FileError& e) {
      EXPECT_NE(std::string(e.what()).find("cannot write '" + path + "' at offset 0"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(std::strerror(EBADF)), std::string::npos) << e.what();
    }
    ::close(fd);
  }
}

TEST(SwapFile, RefusesAMissingDirectoryAndRangesOutsideItsRegions) {
  auto io = std::shared_ptr<FileIo>(make_file_io(IoEngine::kThreads, 1));
  const std::string missing = fresh_temp_dir("swap_checks") + "/no/such/dir";
  try {
    SwapFile(missing, "swap", io);
    FAIL() << "a swap file was made in a directory that does not exist";
  } catch (const FileError& e) {
    EXPECT_NE(std::string(e.what()).find(missing + "/swap"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--offload-dir"), std::string::npos) << e.what();
  }
  SwapFile file(fresh_temp_dir("swap_ranges"), "swap", io);
  AlignedBuffers pool(8192, 1);
  BufferLease lease = pool.acquire();
  const int64_t at = file.reserve(4096);
  EXPECT_THROW(file.write(at, lease.data(), 8192), Error);     // past the reserved bytes
  EXPECT_THROW(file.read(at + 4096, lease.data(), 1), Error);  // past the reserved bytes
  if (file.direct()) {
    EXPECT_THROW(file.write(at, lease.data() + 1, 100), Error);  // misaligned under O_DIRECT
  }
  file.write(at, lease.data(), 4096).wait();
}

// A file system without room refuses at reserve(), naming the file and the bytes. The limit is
// RLIMIT_FSIZE in a child process (no privilege needed), where fallocate fails with EFBIG.
TEST(SwapFile, ADiskWithoutRoomFailsAtReserveNamingTheBytes) {
  const std::string dir = fresh_temp_dir("swap_full");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{1 << 20, 1 << 20};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    try {
      SwapFile file(dir, "swap", make_file_io(IoEngine::kThreads, 1));
      file.reserve(1 << 19);
      file.reserve(1 << 21);
    } catch (const FileError& e) {
      const std::string what = e.what();
      const bool named = what.find("cannot reserve 2097152 bytes in offload file '" + dir +
                                   "/swap' (524288 reserved before)") != std::string::npos;
      if (!named) std::fprintf(stderr, "message: %s\n", e.what());
      ::_exit(named ? 0 : 1);
    }
    ::_exit(2);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the message did not name the bytes; 2: no error";
}

TEST(IoEngine, ParsesItsNamesAndRefusesOthersNamingTheFlag) {
  EXPECT_EQ(parse_io_engine("uring"), IoEngine::kUring);
  EXPECT_EQ(parse_io_engine("threads"), IoEngine::kThreads);
  try {
    parse_io_engine("aio");
    FAIL();
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("--offload-io 'aio'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_file_io(IoEngine::kThreads, 0), BadInput);
}

}  // namespace
}  // namespace pipetrain::offload
