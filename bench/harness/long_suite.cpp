// `pipetrain bench --suite long` (long_suite.h).
#include "long_suite.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "child_runs.h"
#include "pipetrain/base/error.h"

namespace pipetrain::bench {
namespace {

using nlohmann::json;

constexpr int kLongWorld = 4;
constexpr int kLongLayers = 2;

// A directory with model/config.json (positions up to `longest`) and tokens.bin.
std::string make_long_inputs(int width, int longest) {
  const std::string dir = bench_llama_dir("pipetrain_bench_long", width, kLongLayers);
  json config = llama_bench_config(width);
  config["num_hidden_layers"] = kLongLayers;
  config["max_position_embeddings"] = longest;
  std::ofstream(dir + "/model/config.json") << config.dump(2);
  // Enough random ids below the vocabulary for a few steps of 4 rows at the longest length.
  write_random_ids(dir + "/tokens.bin", static_cast<int64_t>(longest) * 4 * 4 + 1);
  return dir;
}

struct LongLayout {
  std::string name;
  int cp;
  bool ulysses, serial;
};

json long_row(const BenchOptions& a, const std::string& dir, int length, const LongLayout& l) {
  const int per_rank = std::max(1, a.threads / kLongWorld);
  const int dp = kLongWorld / l.cp;
  std::string flags = "--nproc 4 --dp " + std::to_string(dp);
  if (l.cp > 1) {
    flags += " --cp " + std::to_string(l.cp) + (l.ulysses ? " --cp-method ulysses" : "") +
             (l.serial ? " --cp-serial-passes" : "");
  }
  const std::string summary = dir + "/row.json";
  json row = {{"name", l.name}, {"runtime", "pipetrain"}, {"seq_len", length}, {"cp", l.cp},
              {"batch", dp},    {"flags", flags}};
  const std::string output = run_train_row(
      a,
      self_path() + " train --model " + dir + "/model --init random --data tokens --token-file " +
          dir + "/tokens.bin --seq-len " + std::to_string(length) + " --batch-size " +
          std::to_string(dp) + " --optimizer sgd --lr 0.01 --steps " +
          std::to_string(a.warmup + a.steps) + " --log-every 1000000 --threads " +
          std::to_string(per_rank) +
          " --skip-memory-check --checkpoint never --chunks 1 --report-memory --summary-json " +
          summary + " " + flags,
      summary, row);
  if (row.contains("error")) return row;
  int64_t peak = 0;
  for (const json& bytes : row.value("process_peak_bytes", json::array())) {
    peak = std::max(peak, bytes.get<int64_t>());
  }
  row["peak_bytes"] = peak;
  const auto [predicted, measured] = largest_activations(output);
  if (measured > 0) {
    row["activation_bytes"] = measured;
    row["predicted_activation_bytes"] = predicted;
  }
  row["tokens_per_second"] = static_cast<double>(dp) * length / row["step_seconds"].get<double>();
  std::smatch match;
  static const std::regex ring(R"(ring attention: ([0-9.]+) ms per step per rank waiting)");
  if (std::regex_search(output, match, ring)) {
    row["ring_wait_seconds"] = std::stod(match[1].str()) * 1e-3;
  }
  return row;
}

// torch's context_parallel at cp 4 on one row of `length`, or why it does not run here.
json long_peer_row(const BenchOptions& a, int length) {
  const int per_rank = std::max(1, a.threads / kLongWorld);
  const std::string python = a.python;
  const std::string torchrun = python.substr(0, python.rfind('/') + 1) + "torchrun";
  const std::string peer_dir =
      a.peer_dir.empty() ? std::string(PIPETRAIN_SOURCE_DIR) + "/bench" : a.peer_dir;
  const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
  const Child child = run_child(
      a, std::string("/usr/bin/env GLOO_SOCKET_IFNAME=") +
             (interface && *interface ? interface : "lo") + " " + torchrun +
             " --standalone --nproc-per-node " + std::to_string(kLongWorld) + " -- " + peer_dir +
             "/torch_context_parallel.py --seq-len " + std::to_string(length) + " --width " +
             std::to_string(a.width) + " --layers " + std::to_string(kLongLayers) + " --threads " +
             std::to_string(per_rank) + " --steps " + std::to_string(a.steps) + " --warmup " +
             std::to_string(a.warmup));
  json row = {{"name", "ring cp4"},
              {"runtime", "torch-context-parallel"},
              {"seq_len", length},
              {"cp", 4},
              {"batch", 1}};
  for (const bool result_line : {true, false}) {
    const std::string prefix =
        result_line ? "PIPETRAIN_BENCH_RESULT " : "PIPETRAIN_BENCH_UNSUPPORTED ";
    const size_t at = child.output.rfind(prefix);
    if (at == std::string::npos) continue;
    const std::string line =
        child.output.substr(at + prefix.size(), child.output.find('\n', at) - at - prefix.size());
    const json result = json::parse(line);
    if (result_line) {
      row["step_seconds"] = result.at("step_seconds");
      row["tokens_per_second"] =
          static_cast<double>(length) / result.at("step_seconds").get<double>();
    } else {
      row["unsupported"] = result.at("reason");
    }
    return row;
  }
  row["error"] = "exit status " + std::to_string(child.status) + ": " + tail(child.output);
  return row;
}

}  // namespace

json run_long_suite(const BenchOptions& a) {
  if (a.width % 32 != 0) {
    throw BadInput("--width of the long suite is the hidden size: a multiple of 32, got " +
                   std::to_string(a.width));
  }
  const int longest = *std::max_element(a.seq_lens.begin(), a.seq_lens.end());
  const std::string dir = make_long_inputs(a.width, longest);
  auto log = [&](const std::string& line) {
    if (a.log) a.log(line);
  };
  const std::vector<LongLayout> layouts = {
      {"cp1", 1, false, false},        {"ring cp2", 2, false, false},
      {"ring cp4", 4, false, false},   {"ring cp4 serial", 4, false, true},
      {"ulysses cp2", 2, true, false}, {"ulysses cp4", 4, true, false}};
  json rows = json::array();
  json notes = json::array();
  for (const int length : a.seq_lens) {
    const json* one = nullptr;
    const size_t first = rows.size();
    for (const LongLayout& layout : layouts) {
      log("bench long: " + std::to_string(length) + " " + layout.name);
      rows.push_back(long_row(a, dir, length, layout));
    }
    // Ratios within this run: against cp 1 at this length, and the serial ring against the
    // overlapped one.
    for (size_t r = first; r < rows.size(); ++r) {
      if (rows[r]["name"] == "cp1" && rows[r].contains("step_seconds")) one = &rows[r];
    }
    json* overlapped = nullptr;
    for (size_t r = first; r < rows.size(); ++r) {
      json& row = rows[r];
      if (!row.contains("step_seconds")) continue;
      if (row["name"] == "ring cp4") overlapped = &row;
      if (one && row["name"] != "cp1") {
        row["tokens_per_second_vs_cp1"] =
            row["tokens_per_second"].get<double>() / (*one)["tokens_per_second"].get<double>();
        row["peak_vs_cp1"] = static_cast<double>(row["peak_bytes"].get<int64_t>()) /
                             static_cast<double>((*one)["peak_bytes"].get<int64_t>());
        if (row.contains("activation_bytes") && one->contains("activation_bytes")) {
          row["activations_vs_cp1"] =
              row["activation_bytes"].get<double>() / (*one)["activation_bytes"].get<double>();
        }
      }
      if (row["name"] == "ring cp4 serial" && overlapped &&
          overlapped->contains("ring_wait_seconds") && row.contains("ring_wait_seconds") &&
          row["ring_wait_seconds"].get<double>() > 0) {
        (*overlapped)["ring_wait_vs_serial"] = (*overlapped)["ring_wait_seconds"].get<double>() /
                                               row["ring_wait_seconds"].get<double>();
        (*overlapped)["step_vs_serial"] =
            (*overlapped)["step_seconds"].get<double>() / row["step_seconds"].get<double>();
      }
    }
    if (!a.no_python) {
      log("bench long: " + std::to_string(length) + " torch context_parallel cp4");
      json peer = long_peer_row(a, length);
      if (peer.contains("unsupported")) {
        notes.push_back("torch's context_parallel (cp 4, ring, Gloo) at " + std::to_string(length) +
                        " tokens does not run here: " + peer["unsupported"].get<std::string>());
      } else {
        for (size_t r = first; r < rows.size(); ++r) {
          if (rows[r]["name"] == "ring cp4" && rows[r].contains("step_seconds") &&
              peer.contains("step_seconds")) {
            peer["pipetrain_over_torch"] =
                rows[r]["step_seconds"].get<double>() / peer["step_seconds"].get<double>();
          }
        }
        rows.push_back(peer);
      }
    }
  }
  std::filesystem::remove_all(dir);
  notes.push_back(
      "each rank computes as many tokens in every row (cp 1: a whole row, batch 4; cp C: 1/C of a "
      "row, batch 4/C); peak: the largest process's resident peak (LibTorch's own included); act: "
      "the largest rank's measured activations (--report-memory), /cp1 their ratio");
  notes.push_back(
      "ring wait: the time a rank waited for the ring's passes, means over ranks and every step "
      "(warm-up included); ring cp4 /serial: the overlapped ring's wait and step over the serial "
      "one's");
  return {{"suite", "long"},
          {"model", "Llama, hidden " + std::to_string(a.width) + ", " +
                        std::to_string(kLongLayers) + " layers, 8 heads over 4 key/value heads"},
          {"threads", a.threads},
          {"steps", a.steps},
          {"warmup", a.warmup},
          {"rows", rows},
          {"notes", notes}};
}

void print_long_report(const json& report) {
  std::printf(
      "pipetrain bench --suite long: %s, %d threads over 4 processes, median of %d steps after %d "
      "warm-up\n",
      report["model"].get<std::string>().c_str(), report["threads"].get<int>(),
      report["steps"].get<int>(), report["warmup"].get<int>());
  std::printf("%-23s %-16s %7s %5s %9s %9s %6s %9s %8s %6s %10s %13s\n", "runtime", "layout",
              "tokens", "batch", "step ms", "tokens/s", "/cp1", "peak MiB", "act MiB", "/cp1",
              "ring wait", "/serial w, s");
  for (const json& row : report["rows"]) {
    if (row.contains("error")) {
      std::printf("%-23s %-16s %7d ERROR: %s\n", row["runtime"].get<std::string>().c_str(),
                  row["name"].get<std::string>().c_str(), row["seq_len"].get<int>(),
                  row["error"].get<std::string>().c_str());
      continue;
    }
    auto cell = [&](const char* key, double scale, const char* format) {
      return report_cell(row, key, scale, format);
    };
    const std::string versus =
        row.contains("ring_wait_vs_serial")
            ? cell("ring_wait_vs_serial", 1, "%.3f") + ", " + cell("step_vs_serial", 1, "%.3f")
            : "-";
    std::printf("%-23s %-16s %7d %5d %9s %9s %6s %9s %8s %6s %10s %13s\n",
                row["runtime"].get<std::string>().c_str(), row["name"].get<std::string>().c_str(),
                row["seq_len"].get<int>(), row["batch"].get<int>(),
                cell("step_seconds", 1e3, "%.1f").c_str(),
                cell("tokens_per_second", 1, "%.0f").c_str(),
                cell("tokens_per_second_vs_cp1", 1, "%.3f").c_str(),
                cell("peak_bytes", 1.0 / (1 << 20), "%.1f").c_str(),
                cell("activation_bytes", 1.0 / (1 << 20), "%.2f").c_str(),
                cell("activations_vs_cp1", 1, "%.3f").c_str(),
                cell("ring_wait_seconds", 1e3, "%.1f ms").c_str(), versus.c_str());
  }
  for (const json& row : report["rows"]) {
    if (row.contains("pipetrain_over_torch")) {
      std::printf("pipetrain ring cp4 step / torch context_parallel's at %d tokens: %.3f\n",
                  row["seq_len"].get<int>(), row["pipetrain_over_torch"].get<double>());
    }
  }
  for (const json& note : report["notes"])
    std::printf("note: %s\n", note.get<std::string>().c_str());
}

}  // namespace pipetrain::bench
