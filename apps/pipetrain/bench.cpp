// `pipetrain bench`: pipetrain side by side with plain LibTorch and with the Python peers, on the
// same model, batch and thread settings, in one invocation (docs/BENCHMARKS.md). The harness is
// bench/harness/ (bench_report.h: the rounds, ratios and checks; bench_rows.h: one configuration
// in a child); this file parses the flags, dispatches the child modes and prints.
//
//   pipetrain bench [--suite mlp|small|cnn|llama|tp|moe] [--tp 2] [--json] [--steps 7] [--warmup 2]
//                   [--rounds 3]
//                   [--threads T] [--stages 2] [--chunks 8] [--checkpoint never] [--width W]
//                   [--batch N] [--no-python] [--no-memory] [--python PATH] [--peer-dir bench]
//                   [--timeline-dir DIR] [--quick]
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "bench_options.h"
#include "bench_report.h"
#include "bench_rows.h"
#include "commands.h"
#include "long_suite.h"
#include "moe_suite.h"

namespace pipetrain::cli {
namespace {

using nlohmann::json;

// The flags' values; the hidden ones describe one configuration to a child.
struct BenchArgs {
  bench::BenchOptions options;
  bool json_output = false;
  bool one = false;          // child: one configuration, one result line
  bool rank_worker = false;  // child: one rank of a multiprocess configuration
  std::string runtime;
  std::string schedule = "gpipe";
  int virtual_stages = 1;
  std::string precision = "fp32";
  int row_tp = 1;
  bool row_sp = false;
};

std::string format_bytes(double bytes) {
  char text[32];
  if (bytes >= 1 << 20) {
    std::snprintf(text, sizeof text, "%.1fM", bytes / (1 << 20));
  } else {
    std::snprintf(text, sizeof text, "%.0fK", bytes / 1024);
  }
  return text;
}

std::string number(const json& row, const char* key, const char* format) {
  if (!row.contains(key) || !row[key].is_number()) return "-";
  char text[32];
  std::snprintf(text, sizeof text, format, row[key].get<double>());
  return text;
}

// The schedule column: "1f1b", or "1f1b/bf16" for a reduced-precision row.
std::string schedule_of(const json& row) {
  const std::string precision = row.value("precision", "fp32");
  return row["schedule"].get<std::string>() + (precision == "fp32" ? "" : "/" + precision);
}

// The runtime column: "multiprocess", or "multiprocess tp2+sp" for a tensor-parallel row.
std::string runtime_of(const json& row) {
  const int tp = row.value("tp", 1);
  if (tp <= 1) return row["runtime"].get<std::string>();
  return row["runtime"].get<std::string>() + " tp" + std::to_string(tp) +
         (row.value("sequence_parallel", false) ? "+sp" : "");
}

// The /peer column: vs torch.distributed.pipelining, vs torchgpipe, or a bf16 row vs its fp32
// twin.
const char* peer_ratio_of(const json& row) {
  for (const char* key : {"ratio_vs_torch", "ratio_vs_torchgpipe", "ratio_vs_fp32"}) {
    if (row.contains(key)) return key;
  }
  return "ratio_vs_torch";
}

void print_text(const json& report) {
  std::printf(
      "pipetrain bench --suite %s: %s, batch %d, %d threads, median of %d steps after %d "
      "warm-up, medians over %d rounds; load average %s -> %s\n",
      report["suite"].get<std::string>().c_str(), report["model"].get<std::string>().c_str(),
      report["batch"].get<int>(), report["threads"].get<int>(), report["steps"].get<int>(),
      report["warmup"].get<int>(), report["rounds"].get<int>(),
      report["load_average_start"].get<std::string>().c_str(),
      report["load_average_end"].get<std::string>().c_str());
  std::printf("%-22s %-16s %2s %2s %3s %-11s %9s %7s %7s %6s %8s  %s\n", "runtime", "schedule", "K",
              "V", "M", "checkpoint", "step ms", "/libt", "/peer", "eff", "rss",
              "peak stash/stage");
  for (const json& row : report["configs"]) {
    std::string stash;
    if (row.contains("peak_stashed_bytes")) {
      for (const json& b : row["peak_stashed_bytes"]) {
        stash += (stash.empty() ? "" : " ") + format_bytes(b.get<double>());
      }
    }
    if (row.contains("error")) stash = "ERROR: " + row["error"].get<std::string>();
    const double ms = row.contains("step_seconds") ? row["step_seconds"].get<double>() * 1e3 : 0;
    std::printf(
        "%-22s %-16s %2d %2d %3d %-11s %9.1f %7s %7s %6s %8s  %s\n", runtime_of(row).c_str(),
        schedule_of(row).c_str(), row["stages"].get<int>(), row["virtual_stages"].get<int>(),
        row["chunks"].get<int>(), row["checkpoint"].get<std::string>().c_str(), ms,
        number(row, "ratio_vs_libtorch", "%.3f").c_str(),
        number(row, peer_ratio_of(row), "%.3f").c_str(), number(row, "efficiency", "%.2f").c_str(),
        row.contains("peak_rss_bytes") ? format_bytes(row["peak_rss_bytes"].get<double>()).c_str()
                                       : "-",
        stash.c_str());
  }
  for (const json& row : report["configs"]) {
    if (!row.contains("ratio_vs_tp1")) continue;
    std::printf("%s %s K=%d: %.3f x the step of %d pipeline ranks at tp 1\n",
                runtime_of(row).c_str(), schedule_of(row).c_str(), row["stages"].get<int>(),
                row["ratio_vs_tp1"].get<double>(), row["stages"].get<int>() * row.value("tp", 1));
  }
  std::printf("\nchecks (targets of issues #7, #15, #18 and #31, evaluated on this run):\n");
  for (const json& check : report["checks"]) {
    const char* verdict = check["pass"].is_null()     ? "NOT RUN"
                          : check["pass"].get<bool>() ? "PASS"
                                                      : "FAIL";
    std::printf("  %-7s %-34s measured %-8s target %s\n           %s\n", verdict,
                check["name"].get<std::string>().c_str(),
                check["measured"].is_null() ? "-" : number(check, "measured", "%.3f").c_str(),
                check["target"].get<std::string>().c_str(),
                check["detail"].get<std::string>().c_str());
  }
  for (const json& note : report["notes"])
    std::printf("note: %s\n", note.get<std::string>().c_str());
}

int run_bench(BenchArgs a) {
  if (a.one || a.rank_worker) {
    bench::resolve_defaults(a.options);
    bench::Config c{a.runtime,        a.schedule,           a.options.stages, a.virtual_stages,
                    a.options.chunks, a.options.checkpoint, "main",           a.precision};
    c.tp = a.row_tp;
    c.sequence_parallel = a.row_sp;
    if (a.rank_worker) return bench::run_rank(a.options, c);
    const json row = bench::run_config_here(a.options, c);
    std::cout << bench::kResultPrefix << row.dump() << std::endl;
    return 0;
  }
  a.options.log = [](const std::string& line) { std::cerr << line << std::endl; };
  if (a.options.suite == "moe" || a.options.suite == "long") {  // `pipetrain train` runs
    bench::resolve_defaults(a.options);
    const bool moe = a.options.suite == "moe";
    const json report = moe ? bench::run_moe_suite(a.options) : bench::run_long_suite(a.options);
    if (a.json_output) {
      std::cout << report.dump(2) << std::endl;
    } else if (moe) {
      bench::print_moe_report(report);
    } else {
      bench::print_long_report(report);
    }
    for (const json& row : report["rows"]) {
      if (row.contains("error")) return 1;
    }
    return 0;
  }
  const json report = bench::run_bench(a.options);
  if (a.json_output) {
    std::cout << report.dump(2) << std::endl;
  } else {
    print_text(report);
  }
  for (const json& row : report["configs"]) {
    if (!bench::row_ok(row)) return 1;
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<BenchArgs>();
  auto* c = app.add_subcommand(
      "bench",
      "pipetrain vs plain LibTorch, torch.distributed.pipelining and torchgpipe on one model "
      "(docs/BENCHMARKS.md)");
  c->add_option(
      "--suite", args->options.suite,
      "model suite: mlp (8 x Linear(1024)+ReLU), small (16 x Linear(256)+ReLU, batch 64), "
      "cnn (examples' CNN), llama (an 8-layer Llama of 256), tp (that Llama at "
      "--stages x --tp ranks vs torch's DTensor + pipelining and vs tp 1) or moe (a "
      "Qwen3-MoE-shaped model on 4 processes at --ep 1, 2, 4, and pp4 vs "
      "torch.distributed.pipelining) or long (a 2-layer Llama at --seq-lens on 4 processes: "
      "context parallelism at cp 1, 2, 4, ring and Ulysses)");
  c->add_option("--seq-lens", args->options.seq_lens,
                "the long suite's sequence lengths, multiples of 8 (default 4096,8192)")
      ->delimiter(',');
  c->add_option("--tp", args->options.tp,
                "tensor-parallel ranks per pipeline rank of the tp suite (2 or 4; default 2)");
  c->add_flag("--json", args->json_output, "print one JSON object instead of a table");
  c->add_option("--steps", args->options.steps, "timed steps per configuration (median reported)");
  c->add_option("--warmup", args->options.warmup, "untimed steps before timing");
  c->add_option("--rounds", args->options.rounds,
                "run every configuration this many times, round-robin; medians over rounds "
                "(default 3, 1 with --quick)");
  c->add_option("--threads", args->options.threads,
                "total intra-op threads T (0: hardware threads)");
  c->add_option("--stages", args->options.stages, "pipeline ranks K of the pipelined rows");
  c->add_option("--chunks", args->options.chunks,
                "micro-batches M of the main rows (memory rows: M, 2M)");
  c->add_option("--checkpoint", args->options.checkpoint,
                "checkpoint mode of the main pipelined rows");
  c->add_option("--width", args->options.width,
                "mlp/small features, cnn channels (0: mlp 1024, small 256, cnn 32)");
  c->add_option("--batch", args->options.batch, "mini-batch rows (0: mlp 256, small 64, cnn 128)");
  c->add_flag("--no-python", args->options.no_python,
              "skip the Python peers (torch-pipelining, torchgpipe)");
  c->add_flag("--no-memory", args->options.no_memory, "skip the checkpoint/memory comparison rows");
  c->add_flag("--quick", args->options.quick, "small model and batch (for smoke tests)");
  c->add_option("--python", args->options.python,
                "Python interpreter with torch and torchgpipe (default: the venv of "
                "scripts/bootstrap); its torchrun launches the torch-pipelining rows");
  c->add_option("--peer-dir", args->options.peer_dir,
                "directory of torchgpipe_peer.py and torch_pipelining.py (default: bench/)");
  c->add_option("--timeline-dir", args->options.timeline_dir,
                "write measured SVG timelines of the pipelined main rows here");
  c->add_option("--config-timeout", args->options.config_timeout,
                "seconds one configuration may take");
  // The child mode: one configuration, one JSON result line.
  c->add_flag("--no-multiprocess", args->options.no_multiprocess, "skip the multi-process rows");
  c->add_flag("--one", args->one)->group("");
  c->add_flag("--rank-worker", args->rank_worker)->group("");
  c->add_option("--runtime", args->runtime)->group("");
  c->add_option("--schedule", args->schedule)->group("");
  c->add_option("--virtual", args->virtual_stages)->group("");
  c->add_option("--precision", args->precision)->group("");
  c->add_option("--row-tp", args->row_tp)->group("");
  c->add_flag("--row-sp", args->row_sp)->group("");
  c->add_flag("--bf16", args->options.bf16,
              "add bf16 twins of the 1f1b and gpipe rows (step time and bytes sent vs fp32)");
  c->callback([args, &exit_code] { exit_code = run_bench(*args); });
}

}  // namespace pipetrain::cli
