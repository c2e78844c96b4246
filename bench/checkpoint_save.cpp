// bench_checkpoint_save: what saving a checkpoint costs, measured as a user runs it: `pipetrain
// train` on the bench Llama (bench/harness: llama_bench_config(width), `layers` decoder layers,
// vocabulary 4096, untied; by default 1536 wide and 20 deep, 0.53 B parameters; --init random,
// AdamW, float32, sequences of 128, a batch of 8 in 4 micro-batches, 1F1B) at pp 2 x dp 2 with
// ZeRO-3, every row its own run, all in one invocation:
//
//   none      no checkpoint: the baseline
//   file      --checkpoint-format file --save-every 1: rank 0 gathers every rank's state into one
//             file after every step
//   sharded   --checkpoint-format sharded --save-every 1: every rank writes its own part
//   async     the same with --async-checkpoint: each rank's part copied into host memory, written
//             by a thread while the next step runs (the copy is in its peak)
//
// For each: every process's peak resident memory over the run (VmHWM, what `train` prints at the
// end; the saves after steps 1 .. steps-1 fall inside it), its excess over the baseline's same
// process, and the largest process's ratio; seconds per step (the run over its steps, saves
// included). The bound the sharded save is held to: the excess of every process at most the
// larger of the largest tensor and the write buffer (printed). For the sharded saves: the bytes
// of one checkpoint and their rate (the median save, all ranks writing at once, until `latest`
// names it), against `dd` of the same number of bytes with conv=fsync into the same directory,
// run in this invocation: their ratio.
//
// Run: bench_checkpoint_save [width (1536)] [layers (20)] [steps (3)] [directory for the
// checkpoints (a temporary one, or "" for one)] [rows, comma-separated (none,file,sharded,async)]
// The dd figure is the median of three runs of it.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "bench_options.h"
#include "pipetrain/io/shard_index.h"

namespace {

using pipetrain::bench::run_command;

double bytes_of(const std::string& number, const std::string& unit) {
  const double scale = unit == "GiB"   ? 1 << 30
                       : unit == "MiB" ? 1 << 20
                       : unit == "KiB" ? 1 << 10
                                       : 1;
  return std::stod(number) * scale;
}

struct Measured {
  std::vector<double> peaks;  // bytes, by process
  double step = 0;            // seconds
  std::vector<double> save_mib_s, save_mib;
  std::vector<double> save_excess;  // bytes: each save's own peak over the resident before it
  bool ok = false;
  std::string error;
};

Measured measure(const std::string& command) {
  const std::string out = run_command(command);
  Measured m;
  std::smatch match;
  const std::regex peaks(R"(every process:((?: [0-9.]+ \S?i?B)+))");
  if (!std::regex_search(out, match, peaks) || !std::regex_search(out, std::regex(R"(done: )"))) {
    m.error = out.substr(out.size() > 800 ? out.size() - 800 : 0);
    return m;
  }
  const std::string list = match[1].str();
  const std::regex size(R"(([0-9.]+) (\S?i?B))");
  for (auto it = std::sregex_iterator(list.begin(), list.end(), size); it != std::sregex_iterator();
       ++it) {
    m.peaks.push_back(bytes_of((*it)[1].str(), (*it)[2].str()));
  }
  std::regex_search(out, match, std::regex(R"(done: (\d+) steps in ([0-9.]+) s)"));
  m.step = std::stod(match[2].str()) / std::stod(match[1].str());
  const std::regex save(
      R"(checkpoint \S+: ([0-9.]+) MiB by \d+ processes in [0-9.]+ s \(([0-9.]+) MiB/s\)(?:, peak \+([0-9.]+) (\S?i?B))?)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), save); it != std::sregex_iterator();
       ++it) {
    m.save_mib.push_back(std::stod((*it)[1].str()));
    m.save_mib_s.push_back(std::stod((*it)[2].str()));
    if ((*it)[3].matched) m.save_excess.push_back(bytes_of((*it)[3].str(), (*it)[4].str()));
  }
  m.ok = true;
  return m;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  const int width = argc > 1 ? std::atoi(argv[1]) : 1536;
  const int layers = argc > 2 ? std::atoi(argv[2]) : 20;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 3;
  const std::string pipetrain = pipetrain::bench::pipetrain_executable();
  const std::string dir = pipetrain::bench::bench_llama_dir("bench_checkpoint_save", width, layers);
  const bool own_out_dir = argc <= 4 || std::string(argv[4]).empty();
  const std::string out_dir = own_out_dir ? dir + "/out" : std::string(argv[4]);
  const std::string wanted =
      "," + std::string(argc > 5 ? argv[5] : "none,file,sharded,async") + ",";
  fs::create_directories(out_dir);
  torch::manual_seed(0);
  const torch::Tensor ids = torch::randint(4096, {200000}, torch::kInt64).to(torch::kInt16);
  std::ofstream(dir + "/tokens.bin", std::ios::binary)
      .write(static_cast<const char*>(ids.data_ptr()), ids.numel() * 2);
  const std::string base = pipetrain + " train --model " + dir +
                           "/model --init random --data tokens --token-file " + dir +
                           "/tokens.bin --seq-len 128 --batch-size 8 --chunks 4 --schedule 1f1b "
                           "--optimizer adamw --nproc 4 --pp 2 --dp 2 --zero 3 --steps " +
                           std::to_string(steps) + " --log-every 1";
  std::printf(
      "bench_checkpoint_save: the bench Llama of width %d and %d layers at pp2 x dp2 ZeRO-3, %d "
      "steps, checkpoints in %s\n",
      width, layers, steps, out_dir.c_str());
  struct Row {
    std::string name, flags;
  };
  const std::vector<Row> rows = {
      {"none", ""},
      {"file", "--checkpoint-format file --save-every 1 --checkpoint-dir " + out_dir + "/file"},
      {"sharded",
       "--checkpoint-format sharded --save-every 1 --keep-checkpoints 1 "
       "--checkpoint-dir " +
           out_dir + "/sharded"},
      {"async",
       "--checkpoint-format sharded --async-checkpoint --save-every 1 "
       "--keep-checkpoints 1 --checkpoint-dir " +
           out_dir + "/async"},
  };
  std::printf("%-8s %-40s %9s %7s %8s %7s\n", "row", "peak by process (GiB)", "excess", "/none",
              "step s", "/none");
  Measured none;
  Measured sharded, async;
  for (const Row& row : rows) {
    if (wanted.find("," + row.name + ",") == std::string::npos) continue;
    const Measured m = measure(base + " " + row.flags);
    if (!m.ok) {
      std::printf("%-8s failed: %s\n", row.name.c_str(), m.error.c_str());
      continue;
    }
    if (row.name == "none") none = m;
    if (row.name == "sharded") sharded = m;
    if (row.name == "async") async = m;
    std::string peaks;
    double excess = 0;
    for (size_t p = 0; p < m.peaks.size(); ++p) {
      char text[32];
      std::snprintf(text, sizeof text, "%s%.2f", p ? " " : "", m.peaks[p] / (1 << 30));
      peaks += text;
      if (p < none.peaks.size()) excess = std::max(excess, m.peaks[p] - none.peaks[p]);
    }
    const double largest = *std::max_element(m.peaks.begin(), m.peaks.end());
    const double none_largest =
        none.peaks.empty() ? largest : *std::max_element(none.peaks.begin(), none.peaks.end());
    std::printf("%-8s %-40s %5.0f MiB %7.3f %8.2f %7.3f\n", row.name.c_str(), peaks.c_str(),
                excess / (1 << 20), largest / none_largest, m.step,
                none.step > 0 ? m.step / none.step : 1.0);
    std::fflush(stdout);
    if (row.name == "file" || row.name == "async") fs::remove_all(out_dir + "/" + row.name);
  }
  // The largest tensor of the sharded checkpoint (the bound's term), from its index.
  double largest_tensor = 0;
  try {
    const std::string latest = out_dir + "/sharded";
    std::string name;
    std::getline(std::ifstream(latest + "/latest"), name);
    const std::string index_path = latest + "/" + name + "/index.json";
    std::ifstream in(index_path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (const auto& [tensor_name, tensor] :
         pipetrain::io::parse_shard_index(text, index_path).tensors) {
      largest_tensor = std::max(largest_tensor, static_cast<double>(tensor.bytes()));
    }
  } catch (const std::exception& error) {
    std::printf("no sharded checkpoint to read: %s\n", error.what());
  }
  std::printf("largest tensor %.1f MiB (the bound on each process's excess while saving)\n",
              largest_tensor / (1 << 20));
  // Each save's own peak (train measures it in a window of its own: VmHWM reset when the save
  // begins), the largest process's, against the bound.
  for (const auto& [name, m] :
       {std::pair<const char*, const Measured&>{"sharded", sharded}, {"async", async}}) {
    if (m.save_excess.empty()) continue;
    const double worst = *std::max_element(m.save_excess.begin(), m.save_excess.end());
    std::printf(
        "%s saves: each one's peak over the resident memory before it, largest process: %.1f MiB "
        "at most (median %.1f MiB, %zu saves)%s\n",
        name, worst / (1 << 20), median(m.save_excess) / (1 << 20), m.save_excess.size(),
        std::string(name) == "async" ? " (the snapshot included)" : "");
  }
  if (!sharded.save_mib.empty()) {
    // dd of one checkpoint's bytes into the same directory, synced.
    const double mib = median(sharded.save_mib);
    const std::string target = out_dir + "/dd.bin";
    std::vector<double> dd_rates;
    for (int run = 0; run < 3; ++run) {
      const auto start = std::chrono::steady_clock::now();
      run_command("dd if=/dev/zero of=" + target + " bs=1M count=" +
                  std::to_string(static_cast<long long>(mib + 0.5)) + " conv=fsync");
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      fs::remove(target);
      dd_rates.push_back(mib / seconds);
    }
    const double dd_rate = median(dd_rates);
    const double save_rate = median(sharded.save_mib_s);
    std::printf(
        "sharded save: %.1f MiB at %.1f MiB/s (median of %zu); dd conv=fsync: %.1f MiB/s; "
        "ratio %.3f\n",
        mib, save_rate, sharded.save_mib_s.size(), dd_rate, save_rate / dd_rate);
  }
  fs::remove_all(dir);
  if (own_out_dir) fs::remove_all(out_dir);
  return 0;
}
