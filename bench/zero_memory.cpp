// bench_zero_memory: what each ZeRO stage holds, measured as a user runs it: `pipetrain train` on
// the bench Llama (bench/harness: llama_bench_config(width) with `layers` decoder layers,
// vocabulary 4096, untied; by default 768 wide and 24 deep, 162 M parameters, the shape of the
// small Llamas people pipeline; --init random, AdamW, float32, sequences of 128, a batch of 8 in
// 4 micro-batches, 1F1B) for a few steps, at pp 2 x dp 2 and pp 1 x dp 4, every row its own run,
// all in one invocation:
//
//   peak      the largest process's peak resident memory over the training steps (VmHWM, what
//             `train` prints at the end), and its ratio to --zero 0 of the same layout
//   states/p  the model states the memory report measures on the largest rank (parameters,
//             gradients and optimizer state held between steps) in bytes per parameter of that
//             rank, beside the paper's figure for float32 Adam over N replicas: 4 + 4 + 8/N,
//             4 + 12/N, 16/N (ZeRO 0: 16)
//   buffers   what the memory model names besides (gathered parameters, gather and reduce
//             buffers, the step's transient gradients), bytes per parameter
//   step      seconds per training step (the run's time over its steps, the first included), and
//             its ratio to --zero 0 of the same layout
//
// and ZeRO-3's policies at pp 2 x dp 2: by layer (the default, prefetching 25 MiB), by layer
// without prefetch, by stage. The machine's 2 cores run the 4 processes: steps are slow and their
// times noisy (compare ratios); memory is what the rows are for.
//
// Run: bench_zero_memory [width (768)] [layers (24)] [steps (3)] [only the rows whose name
// contains this]
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "bench_options.h"

namespace {

using pipetrain::bench::run_command;

struct Row {
  std::string name;  // "pp2 x dp2 --zero 3"
  std::string layout, flags;
  int replicas = 1;
  int zero = 0;
};

struct Measured {
  double peak = 0;     // bytes, the largest process
  double states = 0;   // bytes per parameter, the largest rank
  double buffers = 0;  // bytes per parameter
  double step = 0;     // seconds
  bool ok = false;
  std::string error;
};

double bytes_of(const std::string& number, const std::string& unit) {
  const double scale = unit == "GiB"   ? 1 << 30
                       : unit == "MiB" ? 1 << 20
                       : unit == "KiB" ? 1 << 10
                                       : 1;
  return std::stod(number) * scale;
}

Measured measure(const std::string& pipetrain, const std::string& dir, const Row& row, int steps) {
  const std::string command = pipetrain + " train --model " + dir + "/model --init random " +
                              "--data tokens --token-file " + dir + "/tokens.bin --seq-len 128 " +
                              "--batch-size 8 --chunks 4 --schedule 1f1b --optimizer adamw " +
                              "--steps " + std::to_string(steps) + " --report-memory " +
                              row.layout + " " + row.flags;
  const std::string out = run_command(command);
  Measured m;
  std::smatch match;
  const std::regex peaks(R"(every process:((?: [0-9.]+ \S?i?B)+))");
  if (!std::regex_search(out, match, peaks)) {
    m.error = out.substr(out.size() > 600 ? out.size() - 600 : 0);
    return m;
  }
  const std::string list = match[1].str();
  const std::regex size(R"(([0-9.]+) (\S?i?B))");
  for (auto it = std::sregex_iterator(list.begin(), list.end(), size); it != std::sregex_iterator();
       ++it) {
    m.peak = std::max(m.peak, bytes_of((*it)[1].str(), (*it)[2].str()));
  }
  // --report-memory's measured column, per pipeline rank: the states and the buffers.
  std::map<int, double> states, buffers;
  std::map<int, double> parameters_whole;  // ZeRO 0's parameters: what the rank holds
  const std::regex report(R"(memory: +(\d+) +\d+ +([a-z ]+?) +[0-9.]+ \S?i?B +([0-9.]+) (\S?i?B))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), report); it != std::sregex_iterator();
       ++it) {
    const int rank = std::stoi((*it)[1].str());
    const std::string category = (*it)[2].str();
    const double bytes = bytes_of((*it)[3].str(), (*it)[4].str());
    if (category == "parameters" || category == "gradients" || category == "optimizer state") {
      states[rank] += bytes;
    } else if (category == "gathered params" || category == "gather buffers" ||
               category == "reduce buffers" || category == "step gradients") {
      buffers[rank] += bytes;
    }
  }
  if (!std::regex_search(out, match, std::regex(R"(done: (\d+) steps in ([0-9.]+) s)"))) {
    m.error = "no done line";
    return m;
  }
  m.step = std::stod(match[2].str()) / std::stod(match[1].str());
  // Per parameter of the rank with the most states (the bench model's ranks are uneven).
  int largest = 0;
  for (const auto& [rank, bytes] : states) {
    if (bytes > states[largest]) largest = rank;
  }
  m.states = states[largest];
  m.buffers = buffers[largest];
  m.ok = true;
  return m;
}

double paper(int zero, int n) {
  switch (zero) {
    case 1:
      return 4 + 4 + 8.0 / n;
    case 2:
      return 4 + 12.0 / n;
    case 3:
      return 16.0 / n;
    default:
      return 16;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int width = argc > 1 ? std::atoi(argv[1]) : 768;
  const int layers = argc > 2 ? std::atoi(argv[2]) : 24;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 3;
  const std::string only = argc > 4 ? argv[4] : "";
  const std::string pipetrain = pipetrain::bench::pipetrain_executable();
  const std::string dir = pipetrain::bench::bench_llama_dir("bench_zero_memory", width, layers);
  torch::manual_seed(0);
  const torch::Tensor ids = torch::randint(4096, {200000}, torch::kInt64).to(torch::kInt16);
  std::ofstream(dir + "/tokens.bin", std::ios::binary)
      .write(static_cast<const char*>(ids.data_ptr()), ids.numel() * 2);

  std::vector<Row> rows;
  for (const auto& [layout, replicas] : std::vector<std::pair<std::string, int>>{
           {"--nproc 4 --pp 2 --dp 2", 2}, {"--nproc 4 --pp 1 --dp 4", 4}}) {
    const std::string tag = replicas == 2 ? "pp2 x dp2" : "pp1 x dp4";
    for (int zero = 0; zero <= 3; ++zero) {
      rows.push_back({tag + " --zero " + std::to_string(zero), layout,
                      "--zero " + std::to_string(zero), replicas, zero});
    }
    if (replicas == 2) {
      rows.push_back({tag + " --zero 3 --zero3-prefetch 0", layout, "--zero 3 --zero3-prefetch 0",
                      replicas, 3});
      rows.push_back({tag + " --zero 3 --zero3-unit stage", layout, "--zero 3 --zero3-unit stage",
                      replicas, 3});
    }
  }
  std::printf(
      "bench_zero_memory: the bench Llama of width %d and %d layers, %d steps, every row its own "
      "run\n",
      width, layers, steps);
  std::printf("%-36s %10s %7s %9s %7s %9s %8s %7s\n", "row", "peak", "/zero0", "states/p", "paper",
              "buffers/p", "step s", "/zero0");
  std::map<std::string, Measured> zero0;  // by layout
  for (const Row& row : rows) {
    if (!only.empty() && row.name.find(only) == std::string::npos) continue;
    const Measured m = measure(pipetrain, dir, row, steps);
    if (!m.ok) {
      std::printf("%-36s failed: %s\n", row.name.c_str(), m.error.c_str());
      continue;
    }
    if (row.zero == 0) zero0[row.layout] = m;
    const Measured& base = zero0.count(row.layout) ? zero0[row.layout] : m;
    // Bytes per parameter of the largest rank: its ZeRO 0 parameters are 4 bytes each.
    const double parameters = base.states / 16.0;  // ZeRO 0: 4 + 4 + 8 per parameter (Adam)
    std::printf("%-36s %7.2f GiB %7.3f %9.2f %7.2f %9.2f %8.2f %7.3f\n", row.name.c_str(),
                m.peak / (1 << 30), m.peak / base.peak, m.states / parameters,
                paper(row.zero, row.replicas), m.buffers / parameters, m.step, m.step / base.step);
    std::fflush(stdout);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
