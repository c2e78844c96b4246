// bench_zero_offload: the optimizer step with its state in files (--offload-optimizer nvme)
// against the same step with its state in memory (--offload-optimizer cpu), in one invocation,
// with the disk's own speed (dd, O_DIRECT) and the step's achieved I/O rate beside them.
//
// What is timed: ShardedOptimizer::step() of one process (ZeRO 1, one replica: the shard is every
// parameter), AdamW over `mparams` million float32 parameters in tensors of 4M elements, with
// gradients set. That is the part of a training step the offload changes (forward and backward
// are the same either way); the rows:
//
//   memory      the state in host memory (ZeroOptions::offload)
//   nvme        the state in a file under `dir` (offload_to_nvme), sub-groups of a buffer each,
//               `count` buffers: the read of the next sub-group and the write of the last in
//               flight while one steps
//   nvme serial the same through 2 buffers (one sub-group's two fields): no transfer overlaps the
//               compute, the baseline the overlap is measured against
//
// Printed per row: the median step seconds over `rounds` (the rows take turns within a round,
// after one untimed step each, which writes the file), the ratio to memory's, the bytes moved per
// step and their rate, and the seconds the step waited for transfers. The overlap is how much of
// the serial step's transfer time the overlapped step hid: 1 - (nvme - compute) / (serial -
// compute), compute being the memory row's step.
//
// Run: bench_zero_offload [mparams (64)] [directory (a temporary one under build/)]
//                         [buffer MiB (16)] [count (6)] [rounds (3)] [engine (auto)]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "dd_rate.h"
#include "pipetrain/base/median.h"
#include "pipetrain/train/sharded_optimizer.h"

namespace {

using namespace pipetrain;
using Clock = std::chrono::steady_clock;

struct Row {
  std::string name;
  train::ZeroOptions zero;
  std::unique_ptr<train::ShardedOptimizer> optimizer;
  std::vector<double> seconds, waits;
  int64_t bytes = 0;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const int64_t mparams = argc > 1 ? std::stoll(argv[1]) : 64;
    std::string dir = argc > 2 ? argv[2] : "";
    const int64_t buffer_mib = argc > 3 ? std::stoll(argv[3]) : 16;
    const int count = argc > 4 ? std::stoi(argv[4]) : 6;
    const int rounds = argc > 5 ? std::stoi(argv[5]) : 3;
    const std::string engine = argc > 6 ? argv[6] : "auto";
    const bool own_dir = dir.empty();
    if (own_dir) {
      dir = (std::filesystem::current_path() / ("zero-offload-bench-" + std::to_string(::getpid())))
                .string();
    }
    std::filesystem::create_directories(dir);

    torch::manual_seed(0);
    const int64_t piece = int64_t{4} << 20;
    const int64_t total = mparams * 1000000;
    std::vector<torch::Tensor> params;
    for (int64_t done = 0; done < total; done += piece) {
      params.push_back(torch::randn({std::min(piece, total - done)}).requires_grad_(true));
    }
    const train::NvmeOptions nvme = train::NvmeOptions()
                                        .dir(dir)
                                        .buffer_bytes(buffer_mib << 20)
                                        .io(train::parse_offload_io(engine));
    std::vector<Row> rows;
    rows.push_back({"memory", train::ZeroOptions().stage(1).offload(true), nullptr, {}, {}, 0});
    rows.push_back({"nvme",
                    train::ZeroOptions().stage(1).offload(true).offload_to_nvme(true).nvme(
                        train::NvmeOptions(nvme).buffer_count(count)),
                    nullptr,
                    {},
                    {},
                    0});
    rows.push_back({"nvme serial",
                    train::ZeroOptions().stage(1).offload(true).offload_to_nvme(true).nvme(
                        train::NvmeOptions(nvme).buffer_count(2)),
                    nullptr,
                    {},
                    {},
                    0});
    const auto options = train::OptimizerOptions().lr(1e-4).weight_decay(0.1);
    for (Row& row : rows) {
      row.optimizer = std::make_unique<train::ShardedOptimizer>(nullptr, params, params, "adamw",
                                                                options, row.zero);
    }
    std::printf(
        "ZeRO offload: AdamW step over %lld M float32 parameters (%lld tensors), one process; "
        "files in %s through %lld MiB buffers (%s); %d rounds\n",
        static_cast<long long>(mparams), static_cast<long long>(params.size()), dir.c_str(),
        static_cast<long long>(buffer_mib), to_string(nvme.io()), rounds);
    auto step = [&](Row& row) {
      for (auto& p : params) p.mutable_grad() = torch::full_like(p, 1e-3);
      row.optimizer->reduce_gradients();
      const auto start = Clock::now();
      row.optimizer->step();
      return std::chrono::duration<double>(Clock::now() - start).count();
    };
    for (Row& row : rows) step(row);  // the first step writes the file
    std::vector<double> dd_write, dd_read;
    const long long dd_mib = std::max<long long>(256, total * 4 >> 20);
    for (int r = 0; r < rounds; ++r) {
      const bench::DdRates dd = bench::dd_rates(dir, dd_mib, buffer_mib);
      dd_write.push_back(dd.write);
      dd_read.push_back(dd.read);
      for (Row& row : rows) {
        row.seconds.push_back(step(row));
        if (const auto* file = row.optimizer->state_file()) {
          row.waits.push_back(file->last_step().io_wait_seconds);
          row.bytes = file->last_step().bytes_read + file->last_step().bytes_written;
          if (r == 0 && !file->direct()) {
            std::printf("  (no O_DIRECT in %s: the page cache is in the figures)\n", dir.c_str());
          }
        }
      }
    }
    struct Figures {
      std::string name;
      double seconds = 0, wait = 0;
      int64_t bytes = 0;
    };
    std::vector<Figures> figures;
    for (const Row& row : rows) {
      figures.push_back(
          {row.name, median(row.seconds), row.waits.empty() ? 0.0 : median(row.waits), row.bytes});
    }
    rows.clear();  // the files go with their optimizers
    if (own_dir) std::filesystem::remove_all(dir);

    std::printf("disk (dd, O_DIRECT, %lld MiB blocks): write %.0f MiB/s, read %.0f MiB/s\n",
                static_cast<long long>(buffer_mib), median(dd_write), median(dd_read));
    std::printf("%-12s %10s %9s %11s %10s %11s\n", "row", "step s", "x memory", "MiB moved",
                "MiB/s", "I/O wait s");
    const double compute = figures[0].seconds;
    for (const Figures& f : figures) {
      const double mib = static_cast<double>(f.bytes) / (1 << 20);
      std::printf("%-12s %10.3f %9.2f %11.0f %10.0f %11.3f\n", f.name.c_str(), f.seconds,
                  f.seconds / compute, mib, f.bytes > 0 ? mib / f.seconds : 0.0, f.wait);
    }
    const double serial_extra = figures[2].seconds - compute;
    const double overlapped_extra = figures[1].seconds - compute;
    if (serial_extra > 0) {
      std::printf(
          "overlap: the overlapped step hides %.0f%% of the serial step's time over memory's "
          "(%.3f s of %.3f s)\n",
          100.0 * (1.0 - overlapped_extra / serial_extra), serial_extra - overlapped_extra,
          serial_extra);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_zero_offload: %s\n", e.what());
    return 1;
  }
}
