// `pipetrain bench --suite moe` (moe_suite.h).
#include "moe_suite.h"

#include "child_runs.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "pipetrain/base/error.h"
#include "pipetrain/base/median.h"

namespace pipetrain::bench {
namespace {

using nlohmann::json;

constexpr int kWorld = 4;
constexpr int kSeqLen = kLlamaSeqLen;  // the llama suite's rows

// A directory with model/config.json and tokens.bin (random ids below the vocabulary).
std::string make_inputs(int width) {
  std::string pattern = "/tmp/pipetrain_bench_moe_XXXXXX";
  const char* made = ::mkdtemp(pattern.data());
  if (made == nullptr) throw Error(ErrorKind::Runtime, "cannot make a directory " + pattern);
  const std::string dir = made;
  std::filesystem::create_directories(dir + "/model");
  std::ofstream(dir + "/model/config.json") << moe_bench_config(width).dump(2);
  write_random_ids(dir + "/tokens.bin", 200000);
  return dir;
}

// One pipetrain row: `flags` added to the common training command.
json pipetrain_row(const BenchOptions& a, const std::string& dir, const std::string& name,
                   const std::string& flags, int ep) {
  const int per_rank = std::max(1, a.threads / kWorld);
  const std::string summary = dir + "/" + name + ".json";
  json row = {{"name", name}, {"runtime", "pipetrain"}, {"flags", flags}, {"ep", ep}};
  const std::string output =
      run_train_row(a,
                    self_path() + " train --model " + dir + "/model --init random --data tokens " +
                        "--token-file " + dir + "/tokens.bin --seq-len " + std::to_string(kSeqLen) +
                        " --batch-size " + std::to_string(a.batch) + " --optimizer sgd --lr 0.01 " +
                        "--steps " + std::to_string(a.warmup + a.steps) + " --log-every 1000000 " +
                        "--threads " + std::to_string(per_rank) + " --skip-memory-check " +
                        "--checkpoint never --summary-json " + summary + " " + flags,
                    summary, row);
  if (row.contains("error")) return row;
  std::smatch match;
  static const std::regex exchange(
      R"(expert all-to-all: ([0-9.]+) ms per step per rank .*, ([0-9.]+) ms of it exposed)");
  if (std::regex_search(output, match, exchange)) {
    row["all_to_all_seconds"] = std::stod(match[1].str()) * 1e-3;
    row["exposed_seconds"] = std::stod(match[2].str()) * 1e-3;
  }
  return row;
}

json peer_row(const BenchOptions& a, const std::string& name) {
  const int per_rank = std::max(1, a.threads / kWorld);
  const std::string python = a.python;
  const std::string torchrun = python.substr(0, python.rfind('/') + 1) + "torchrun";
  const std::string peer_dir =
      a.peer_dir.empty() ? std::string(PIPETRAIN_SOURCE_DIR) + "/bench" : a.peer_dir;
  const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
  const Child child = run_child(
      a, std::string("/usr/bin/env GLOO_SOCKET_IFNAME=") +
             (interface && *interface ? interface : "lo") + " " + torchrun +
             " --standalone --nproc-per-node " + std::to_string(kWorld) + " -- " + peer_dir +
             "/torch_pipelining.py --suite moe --schedule 1f1b --chunks " +
             std::to_string(a.chunks) + " --threads " + std::to_string(per_rank) + " --width " +
             std::to_string(a.width) + " --batch " + std::to_string(a.batch) + " --steps " +
             std::to_string(a.steps) + " --warmup " + std::to_string(a.warmup));
  json row = {{"name", name}, {"runtime", "torch-pipelining"}};
  const std::string prefix = "PIPETRAIN_BENCH_RESULT ";
  const size_t at = child.output.rfind(prefix);
  if (child.status != 0 || at == std::string::npos) {
    row["error"] = "exit status " + std::to_string(child.status) + ": " + tail(child.output);
    return row;
  }
  const std::string line =
      child.output.substr(at + prefix.size(), child.output.find('\n', at) - at - prefix.size());
  const json result = json::parse(line);
  row["step_seconds"] = result.at("step_seconds");
  return row;
}

}  // namespace

json moe_bench_config(int width) {
  // The llama suite's config, its MLPs made 8 experts of `width` and the layers 4.
  json config = llama_bench_config(width);
  config["architectures"] = {"Qwen3MoeForCausalLM"};
  config["model_type"] = "qwen3_moe";
  config["intermediate_size"] = width * 3;
  config["moe_intermediate_size"] = width;
  config["num_experts"] = 8;
  config["num_experts_per_tok"] = 2;
  config["norm_topk_prob"] = true;
  config["decoder_sparse_step"] = 1;
  config["mlp_only_layers"] = json::array();
  config["num_hidden_layers"] = 4;
  config["output_router_logits"] = false;
  return config;
}

json run_moe_suite(const BenchOptions& a) {
  if (a.batch % kWorld != 0 || (a.batch / kWorld) % 2 != 0) {
    throw BadInput(
        "--batch of the moe suite is cut over 4 replicas into 2 micro-batches each: "
        "a multiple of 8, got " +
        std::to_string(a.batch));
  }
  if (a.width % 32 != 0) {
    throw BadInput("--width of the moe suite is the hidden size: a multiple of 32, got " +
                   std::to_string(a.width));
  }
  const std::string dir = make_inputs(a.width);
  auto log = [&](const std::string& line) {
    if (a.log) a.log(line);
  };
  json rows = json::array();
  for (const int ep : {1, 2, 4}) {
    const std::string name = "dp4 ep" + std::to_string(ep);
    log("bench moe: " + name);
    rows.push_back(pipetrain_row(
        a, dir, "ep" + std::to_string(ep),
        "--nproc 4 --dp 4 --chunks 2 --schedule 1f1b --ep " + std::to_string(ep), ep));
    rows.back()["name"] = name;
  }
  // The overlap: each layout without and with it, one after the other.
  const std::string dualpipev = "--nproc 4 --dp 2 --ep 2 --chunks 8 --schedule dualpipev";
  for (const auto& [name, flags] :
       {std::pair<std::string, std::string>{"dp4 ep4 M4",
                                            "--nproc 4 --dp 4 --ep 4 --chunks 4 "
                                            "--schedule 1f1b"},
        std::pair<std::string, std::string>{"pp2 ep2 dualpipev", dualpipev}}) {
    for (const bool overlap : {false, true}) {
      const std::string row_name = name + (overlap ? " +overlap" : "");
      log("bench moe: " + row_name);
      rows.push_back(pipetrain_row(a, dir, overlap ? "overlap" : "without",
                                   flags + (overlap ? " --ep-overlap" : ""),
                                   name.rfind("dp4 ep4", 0) == 0 ? 4 : 2));
      rows.back()["name"] = row_name;
      rows.back()["overlap"] = overlap;
      if (overlap) rows.back()["without"] = name;
    }
  }
  log("bench moe: pp4 1f1b");
  rows.push_back(pipetrain_row(
      a, dir, "pp4", "--nproc 4 --stages 4 --schedule 1f1b --chunks " + std::to_string(a.chunks),
      1));
  rows.back()["name"] = "pp4 1f1b";
  if (!a.no_python) {
    log("bench moe: torch-pipelining pp4 1f1b");
    rows.push_back(peer_row(a, "pp4 1f1b"));
  }
  std::filesystem::remove_all(dir);
  // Ratios within this run.
  const double tokens = static_cast<double>(a.batch) * kSeqLen;
  const json* ep1 = nullptr;
  const json* pp4 = nullptr;
  for (const json& row : rows) {
    if (row.value("ep", 0) == 1 && row.value("name", "") == "dp4 ep1") ep1 = &row;
    if (row.value("runtime", "") == "pipetrain" && row.value("name", "") == "pp4 1f1b") pp4 = &row;
  }
  for (json& row : rows) {
    if (!row.contains("step_seconds")) continue;
    const double step = row["step_seconds"].get<double>();
    row["tokens_per_second"] = tokens / step;
    if (ep1 && ep1->contains("step_seconds") && row.value("runtime", "") == "pipetrain" &&
        row.value("name", "").rfind("dp4", 0) == 0 && !row.contains("overlap")) {
      row["ratio_vs_ep1"] = step / (*ep1)["step_seconds"].get<double>();
    }
    if (row.contains("all_to_all_seconds")) {
      row["all_to_all_share"] = row["all_to_all_seconds"].get<double>() / step;
    }
    if (row.contains("without")) {
      for (const json& other : rows) {
        if (other.value("name", "") != row["without"].get<std::string>()) continue;
        if (!other.contains("step_seconds")) continue;
        row["step_vs_without"] = step / other["step_seconds"].get<double>();
        if (row.contains("exposed_seconds") && other.contains("exposed_seconds") &&
            other["exposed_seconds"].get<double>() > 0) {
          row["exposed_vs_without"] =
              row["exposed_seconds"].get<double>() / other["exposed_seconds"].get<double>();
        }
      }
    }
    if (row["runtime"] == "torch-pipelining" && pp4 && pp4->contains("step_seconds")) {
      row["pipetrain_over_torch"] = (*pp4)["step_seconds"].get<double>() / step;
    }
  }
  json notes = json::array();
  notes.push_back(
      "exposed: the part of the all-to-all time during which no lane of the rank computed; "
      "without --ep-overlap the rank has one lane, and it is all of it");
  notes.push_back(
      "all-to-all and exposed ms: means over ranks and over every step, warm-up included; step: "
      "rank 0's median after warm-up; /without: the +overlap row over the row above it");
  return {{"suite", "moe"},
          {"model", "Qwen3-MoE-shaped, hidden " + std::to_string(a.width) +
                        ", 4 layers, 8 experts of " + std::to_string(a.width) + ", top 2"},
          {"batch", a.batch},
          {"seq_len", kSeqLen},
          {"threads", a.threads},
          {"steps", a.steps},
          {"warmup", a.warmup},
          {"rows", rows},
          {"notes", notes}};
}

void print_moe_report(const json& report) {
  std::printf(
      "pipetrain bench --suite moe: %s, batch %d x %d ids, %d threads over 4 processes, median of "
      "%d steps after %d warm-up\n",
      report["model"].get<std::string>().c_str(), report["batch"].get<int>(),
      report["seq_len"].get<int>(), report["threads"].get<int>(), report["steps"].get<int>(),
      report["warmup"].get<int>());
  std::printf("%-17s %-26s %8s %9s %6s %13s %6s %11s %14s\n", "runtime", "layout", "step ms",
              "tokens/s", "/ep1", "all-to-all ms", "share", "exposed ms", "/without s, e");
  for (const json& row : report["rows"]) {
    if (row.contains("error")) {
      std::printf("%-17s %-26s ERROR: %s\n", row["runtime"].get<std::string>().c_str(),
                  row["name"].get<std::string>().c_str(), row["error"].get<std::string>().c_str());
      continue;
    }
    auto cell = [&](const char* key, double scale, const char* format) {
      return report_cell(row, key, scale, format);
    };
    const std::string versus =
        row.contains("step_vs_without")
            ? cell("step_vs_without", 1, "%.3f") + ", " + cell("exposed_vs_without", 1, "%.3f")
            : "-";
    std::printf(
        "%-17s %-26s %8s %9s %6s %13s %6s %11s %14s\n", row["runtime"].get<std::string>().c_str(),
        row["name"].get<std::string>().c_str(), cell("step_seconds", 1e3, "%.1f").c_str(),
        cell("tokens_per_second", 1, "%.0f").c_str(), cell("ratio_vs_ep1", 1, "%.3f").c_str(),
        cell("all_to_all_seconds", 1e3, "%.1f").c_str(),
        cell("all_to_all_share", 1, "%.3f").c_str(), cell("exposed_seconds", 1e3, "%.1f").c_str(),
        versus.c_str());
  }
  for (const json& row : report["rows"]) {
    if (row.contains("pipetrain_over_torch")) {
      std::printf("pipetrain pp4 1f1b step / torch.distributed.pipelining's: %.3f\n",
                  row["pipetrain_over_torch"].get<double>());
    }
  }
  for (const json& note : report["notes"]) {
    std::printf("note: %s\n", note.get<std::string>().c_str());
  }
}

}  // namespace pipetrain::bench
