// The disk's own speed, as dd measures it: what the offload benches (bench_offload_io,
// bench_zero_offload) put their I/O rates beside, measured in the same invocation.
#pragma once

#include <cstdio>
#include <regex>
#include <stdexcept>
#include <string>

namespace pipetrain::bench {

// Runs `command` (a dd, with whatever comes before it) and returns `mib` over the elapsed seconds
// dd prints on its summary line.
inline double dd_mib_s(const std::string& command, double mib) {
  const std::string line = command + " 2>&1";
  FILE* pipe = ::popen(line.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run: " + command);
  std::string out;
  char chunk[512];
  while (std::fgets(chunk, sizeof chunk, pipe)) out += chunk;
  if (::pclose(pipe) != 0) throw std::runtime_error(command + " failed:\n" + out);
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(R"(copied, ([0-9.e+-]+) s)"))) {
    throw std::runtime_error("no time in dd's output:\n" + out);
  }
  return mib / std::stod(m[1]);
}

struct DdRates {
  double write = 0, read = 0;  // MiB/s
};

// dd writing `mib` MiB with oflag=direct into `dir`/dd.bin (fallocated first, as the offload
// files' regions are) in blocks of `block_mib`, then reading them back with iflag=direct.
inline DdRates dd_rates(const std::string& dir, long long mib, long long block_mib) {
  const std::string file = dir + "/dd.bin";
  const std::string count = std::to_string(mib / block_mib);
  const std::string bs = std::to_string(block_mib) + "M";
  const double total = static_cast<double>(mib / block_mib * block_mib);
  DdRates rates;
  std::remove(file.c_str());
  rates.write = dd_mib_s("fallocate -l " + std::to_string(mib << 20) + " " + file +
                             " && dd if=/dev/zero of=" + file + " bs=" + bs + " count=" + count +
                             " oflag=direct conv=notrunc",
                         total);
  rates.read = dd_mib_s(
      "dd if=" + file + " of=/dev/null bs=" + bs + " count=" + count + " iflag=direct", total);
  std::remove(file.c_str());
  return rates;
}

}  // namespace pipetrain::bench
