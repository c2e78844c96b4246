// bench_offload_io: how fast the offload files move bytes (offload/file_io.h), against the disk's
// own speed measured by dd in the same invocation: which engine --offload-io should default to.
//
//   dd        dd with oflag=direct (iflag=direct to read back) and bs = the buffer size, into a
//             file fallocated first (as the swap file's regions are): one request at a time
//   threads   the pool of `depth` threads running pread/pwrite
//   uring     io_uring with `depth` requests in flight
//
// Each engine writes `mib` MiB through a SwapFile (O_DIRECT) from `depth` aligned buffers of
// `buffer` MiB each (a buffer's next write starts when its last is done), then reads them back the
// same way and checks one word of every buffer. Printed: MiB/s for each, and the ratio to dd's.
// Each figure is the median of `rounds` runs, the engines and dd taking turns within a round.
//
// Run: bench_offload_io [mib (1024)] [directory (a temporary one under build/)] [buffer MiB (8)]
//                       [depth (4)] [rounds (3)]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "dd_rate.h"
#include "pipetrain/base/median.h"
#include "pipetrain/offload/aligned_buffers.h"
#include "pipetrain/offload/file_io.h"
#include "pipetrain/offload/swap_file.h"

namespace {

using namespace pipetrain::offload;
using pipetrain::median;
using pipetrain::bench::dd_mib_s;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Rates {
  double write = 0, read = 0;
};

// One engine's write and read of `total` bytes through `depth` buffers.
Rates run_engine(IoEngine engine, const std::string& dir, int64_t total, int64_t buffer,
                 int depth) {
  AlignedBuffers pool(buffer, depth);
  SwapFile file(dir, std::string("bench_") + to_string(engine), make_file_io(engine, depth));
  if (!file.direct())
    std::printf("  (no O_DIRECT in %s: the page cache is in the figures)\n", dir.c_str());
  const int64_t at = file.reserve(total);
  const int64_t pieces = total / buffer;
  std::vector<BufferLease> leases;
  for (int i = 0; i < depth; ++i) leases.push_back(pool.acquire());
  std::vector<IoTicket> tickets(static_cast<size_t>(depth));
  Rates rates;
  const double mib = static_cast<double>(total) / (1 << 20);

  auto start = Clock::now();
  for (int64_t k = 0; k < pieces; ++k) {
    const auto slot = static_cast<size_t>(k % depth);
    tickets[slot].wait();
    std::memset(leases[slot].data(), static_cast<int>(k % 251), 64);  // a mark to check
    std::memcpy(leases[slot].data() + 64, &k, sizeof k);
    tickets[slot] = file.write(at + k * buffer, leases[slot].data(), buffer);
  }
  for (const IoTicket& t : tickets) t.wait();
  rates.write = mib / seconds_since(start);

  start = Clock::now();
  std::vector<int64_t> piece_of(static_cast<size_t>(depth), -1);
  int bad = 0;
  const auto check = [&](size_t slot) {
    if (piece_of[slot] < 0) return;
    int64_t k = -1;
    std::memcpy(&k, leases[slot].data() + 64, sizeof k);
    if (k != piece_of[slot] || leases[slot].data()[0] != static_cast<char>(k % 251)) ++bad;
  };
  for (int64_t k = 0; k < pieces; ++k) {
    const auto slot = static_cast<size_t>(k % depth);
    tickets[slot].wait();
    check(slot);
    piece_of[slot] = k;
    tickets[slot] = file.read(at + k * buffer, leases[slot].data(), buffer);
  }
  for (size_t slot = 0; slot < tickets.size(); ++slot) {
    tickets[slot].wait();
    check(slot);
  }
  rates.read = mib / seconds_since(start);
  if (bad) throw std::runtime_error(std::to_string(bad) + " buffers read back wrong");
  return rates;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int64_t mib = argc > 1 ? std::stoll(argv[1]) : 1024;
    std::string dir = argc > 2 ? argv[2] : "";
    const int64_t buffer_mib = argc > 3 ? std::stoll(argv[3]) : 8;
    const int depth = argc > 4 ? std::stoi(argv[4]) : 4;
    const int rounds = argc > 5 ? std::stoi(argv[5]) : 3;
    const bool own_dir = dir.empty();
    if (own_dir) {
      dir = (std::filesystem::current_path() / ("offload-bench-" + std::to_string(::getpid())))
                .string();
    }
    std::filesystem::create_directories(dir);
    const int64_t buffer = buffer_mib << 20;
    const int64_t total = (mib << 20) / buffer * buffer;
    const double total_mib = static_cast<double>(total) / (1 << 20);

    std::vector<IoEngine> engines{IoEngine::kThreads};
    if (uring_available()) {
      engines.push_back(IoEngine::kUring);
    } else {
      std::printf("io_uring not measured: %s\n",
                  pipetrain::offload::detail::uring_unavailable_reason().c_str());
    }
    std::printf(
        "offload I/O: %.0f MiB through %d buffers of %lld MiB, O_DIRECT, into %s; %d rounds\n",
        total_mib, depth, static_cast<long long>(buffer_mib), dir.c_str(), rounds);

    const std::string dd_file = dir + "/dd.bin";
    const std::string count = std::to_string(total / buffer);
    const std::string bs = std::to_string(buffer_mib) + "M";
    std::vector<double> dd_write, dd_read;
    std::vector<std::vector<double>> writes(engines.size()), reads(engines.size());
    for (int r = 0; r < rounds; ++r) {
      std::filesystem::remove(dd_file);
      dd_write.push_back(dd_mib_s("fallocate -l " + std::to_string(total) + " " + dd_file +
                                      " && dd if=/dev/zero of=" + dd_file + " bs=" + bs +
                                      " count=" + count + " oflag=direct conv=notrunc",
                                  total_mib));
      dd_read.push_back(dd_mib_s(
          "dd if=" + dd_file + " of=/dev/null bs=" + bs + " count=" + count + " iflag=direct",
          total_mib));
      std::filesystem::remove(dd_file);
      for (size_t e = 0; e < engines.size(); ++e) {
        const Rates rates = run_engine(engines[e], dir, total, buffer, depth);
        writes[e].push_back(rates.write);
        reads[e].push_back(rates.read);
      }
    }
    if (own_dir) std::filesystem::remove_all(dir);

    const double ddw = median(dd_write), ddr = median(dd_read);
    std::printf("%-8s %12s %12s %10s %10s\n", "engine", "write MiB/s", "read MiB/s", "write/dd",
                "read/dd");
    std::printf("%-8s %12.0f %12.0f %10.2f %10.2f\n", "dd", ddw, ddr, 1.0, 1.0);
    size_t best = 0;
    double best_sum = 0;
    for (size_t e = 0; e < engines.size(); ++e) {
      const double w = median(writes[e]), rd = median(reads[e]);
      std::printf("%-8s %12.0f %12.0f %10.2f %10.2f\n", to_string(engines[e]), w, rd, w / ddw,
                  rd / ddr);
      if (w + rd > best_sum) {
        best_sum = w + rd;
        best = e;
      }
    }
    std::printf("faster: %s (write + read)\n", to_string(engines[best]));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_offload_io: %s\n", e.what());
    return 1;
  }
}
