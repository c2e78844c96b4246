// bench_zero_plus_plus: what ZeRO++ sends between hosts and what it costs the loss, measured as a
// user runs it: `pipetrain train` on the bench Llama (bench/harness: llama_bench_config(width)
// with `layers` decoder layers, vocabulary 4096, untied; by default 256 wide and 4 deep, 5.4 M
// parameters), --init random, AdamW at 1e-3, sequences of 64, a batch of 8 in 2 micro-batches,
// 4 processes as two hosts of two (--nproc 4 --dp 4 --ranks-per-host 2), ZeRO-3, every row its
// own run of `steps` steps on the same tokens, all in one invocation:
//
//   ZeRO-3, qwZ (--zero-quantized-weights), hpZ (--zero-hpz-partition-size 2), qgZ
//   (--zero-quantized-gradients), and all three
//
// Printed per row, from `--report-comm` (every rank's collectives as a ring sends them; the
// all-to-alls member to member, transport/c10d.h): the bytes per step ZeRO's forward gathers, its
// backward gathers (recomputes included) and its gradients send within hosts and between hosts,
// and each between-host figure over ZeRO-3's; the loss (the mean of the progress lines' losses
// over the last quarter of the steps, and the last step's) over ZeRO-3's; and the seconds per
// step (on one machine nothing is slower between "hosts": this is the quantizing's cost, not
// the network's saving).
//
// The tokens are learnable, so that the loss falls and a difference in training shows: a chain in
// which each token is followed by one of 4 tokens (chosen at random once per token), drawn at
// random among them (the floor of the loss is ln 4 = 1.39).
//
// Run: bench_zero_plus_plus [width (256)] [layers (4)] [steps (200)] [precision (fp32)]
//                           [only the rows whose name contains this]
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "bench_options.h"

namespace {

using pipetrain::bench::run_command;

struct Row {
  std::string name;
  std::string flags;
};

struct Measured {
  std::array<double, 3> within{}, between{};  // forward gathers, backward gathers, gradients
  double mean_loss = 0;                       // over the last quarter of the logged steps
  double last_loss = 0;
  double step = 0;  // seconds
  bool ok = false;
  std::string error;
};

Measured measure(const std::string& pipetrain, const std::string& dir, const Row& row, int steps,
                 const std::string& precision) {
  const std::string command =
      pipetrain + " train --model " + dir + "/model --init random --data tokens --token-file " +
      dir + "/tokens.bin --seq-len 64 --batch-size 8 --chunks 2 --optimizer adamw --lr 1e-3 " +
      "--steps " + std::to_string(steps) + " --log-every 1 --precision " + precision +
      " --nproc 4 --dp 4 --ranks-per-host 2 --zero 3 --report-comm " + row.flags;
  const std::string out = run_command(command);
  Measured m;
  std::smatch match;
  if (!std::regex_search(out, match, std::regex(R"(\(bytes: ([0-9 ]+)\))"))) {
    m.error = out.substr(out.size() > 600 ? out.size() - 600 : 0);
    return m;
  }
  std::istringstream bytes(match[1].str());
  for (int i = 0; i < 3; ++i) bytes >> m.within[i] >> m.between[i];
  std::vector<double> losses;  // one per step: --log-every 1
  const std::regex progress(R"(step (\d+)/\d+ .*? loss ([0-9.]+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), progress);
       it != std::sregex_iterator(); ++it) {
    losses.push_back(std::stod((*it)[2].str()));
  }
  if (!std::regex_search(
          out, match,
          std::regex(R"(done: (\d+) steps in ([0-9.]+) s.*loss [0-9.]+ -> ([0-9.]+))"))) {
    m.error = "no done line";
    return m;
  }
  m.step = std::stod(match[2].str()) / std::stod(match[1].str());
  m.last_loss = std::stod(match[3].str());
  const size_t quarter = std::max<size_t>(1, losses.size() / 4);
  if (losses.size() < quarter) {
    m.error = "no progress lines";
    return m;
  }
  for (size_t i = losses.size() - quarter; i < losses.size(); ++i) m.mean_loss += losses[i];
  m.mean_loss /= static_cast<double>(quarter);
  m.ok = true;
  return m;
}

std::string kib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", bytes / 1024);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  const int width = argc > 1 ? std::atoi(argv[1]) : 256;
  const int layers = argc > 2 ? std::atoi(argv[2]) : 4;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 200;
  const std::string precision = argc > 4 ? argv[4] : "fp32";
  const std::string only = argc > 5 ? argv[5] : "";
  const std::string pipetrain = pipetrain::bench::pipetrain_executable();
  const std::string dir = pipetrain::bench::bench_llama_dir("bench_zero_plus_plus", width, layers);
  // The chain: token t is followed by one of next[t][0..3].
  torch::manual_seed(0);
  const int64_t vocab = 4096, length = 400000;
  const torch::Tensor next = torch::randint(vocab, {vocab, 4}, torch::kInt64);
  const torch::Tensor choice = torch::randint(4, {length}, torch::kInt64);
  std::vector<int16_t> ids(static_cast<size_t>(length));
  const auto n = next.accessor<int64_t, 2>();
  const auto c = choice.accessor<int64_t, 1>();
  int64_t token = 0;
  for (int64_t i = 0; i < length; ++i) {
    ids[static_cast<size_t>(i)] = static_cast<int16_t>(token);
    token = n[token][c[i]];
  }
  std::ofstream(dir + "/tokens.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(ids.data()),
             static_cast<std::streamsize>(ids.size() * sizeof(int16_t)));

  const std::vector<Row> rows = {
      {"ZeRO-3", ""},
      {"qwZ", "--zero-quantized-weights"},
      {"hpZ", "--zero-hpz-partition-size 2"},
      {"qgZ", "--zero-quantized-gradients"},
      {"qwZ + hpZ + qgZ",
       "--zero-quantized-weights --zero-hpz-partition-size 2 --zero-quantized-gradients"}};
  std::printf(
      "bench_zero_plus_plus: the bench Llama of width %d and %d layers, %s, %d steps, 2 hosts x 2 "
      "ranks, every row its own run\n",
      width, layers, precision.c_str(), steps);
  std::printf(
      "KiB per step within hosts / between hosts, and between hosts over ZeRO-3's; losses over "
      "ZeRO-3's\n");
  std::printf("%-16s %23s %23s %23s %9s %9s %8s %7s\n", "row", "forward gathers",
              "backward gathers", "gradients", "mean loss", "last loss", "step s", "/ZeRO-3");
  Measured base;
  for (const Row& row : rows) {
    if (!only.empty() && row.name.find(only) == std::string::npos && row.name != "ZeRO-3") {
      continue;
    }
    const Measured m = measure(pipetrain, dir, row, steps, precision);
    if (!m.ok) {
      std::printf("%-16s failed: %s\n", row.name.c_str(), m.error.c_str());
      continue;
    }
    if (!base.ok) base = m;
    std::printf("%-16s", row.name.c_str());
    for (int i = 0; i < 3; ++i) {
      const std::string cell =
          kib(m.within[i]) + "/" + kib(m.between[i]) + " (" +
          (base.between[i] > 0 ? std::to_string(m.between[i] / base.between[i]).substr(0, 5)
                               : std::string("-")) +
          ")";
      std::printf(" %23s", cell.c_str());
    }
    std::printf(" %9.5f %9.5f %8.3f %7.3f\n", m.mean_loss / base.mean_loss,
                m.last_loss / base.last_loss, m.step, m.step / base.step);
    std::printf("%-16s mean loss %.4f, last loss %.6f\n", "", m.mean_loss, m.last_loss);
    std::fflush(stdout);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
