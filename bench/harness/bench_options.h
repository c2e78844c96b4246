// What `pipetrain bench` runs: the settings of one invocation (BenchOptions) and the
// configurations (rows) it times (Config, plan_configs). docs/BENCHMARKS.md describes the rows.
//
// Thread-safety: plain values.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace pipetrain::bench {

struct BenchOptions {
  // mlp | small | cnn | llama | tp | moe (moe_suite.h) | long (long_suite.h)
  std::string suite = "mlp";
  int steps = 7;                     // timed steps per configuration
  int warmup = 2;                    // untimed steps before them
  int rounds = 0;                    // 0: 3, or 1 with quick
  int threads = 0;                   // T, total intra-op threads; 0: hardware threads
  int stages = 2;                    // K of the pipelined rows
  int chunks = 8;                    // M of the main rows (memory rows: M and 2M)
  std::string checkpoint = "never";  // of the main pipelined rows
  // The tp suite trains the llama suite's model: K pipeline ranks x T tensor-parallel ranks against
  // torch's own 2-D composition, and against K*T pipeline ranks of tp 1.
  int width = 0;  // 0: suite default (mlp 1024 features, small 256, cnn 32 channels, llama/tp 256)
  int batch = 0;  // 0: suite default (mlp 256, small 64, cnn 128, llama/tp 16 sequences)
  bool no_python = false;  // no Python peer rows (torchgpipe, torch-pipelining)
  bool no_memory = false;  // no checkpoint/memory comparison rows
  bool no_multiprocess = false;
  bool quick = false;  // small model and batch (smoke tests)
  bool bf16 = false;   // bf16 twins of the 1f1b and gpipe rows (PipeOptions::precision)
  int tp = 2;          // the tp suite's tensor-parallel size T (its rows: K x T ranks)
  std::vector<int> seq_lens = {4096, 8192};  // the long suite's sequence lengths
  std::string python;           // interpreter with torch and torchgpipe; its torchrun runs the peer
  std::string peer_dir;         // bench/'s Python peers; empty: found next to the sources
  std::string timeline_dir;     // measured SVG timelines of the pipelined main rows; empty: none
  double config_timeout = 600;  // seconds one configuration may take
  // How a child re-runs this executable: self_executable() + child_arguments + "--one" (or
  // "--rank-worker") + the configuration's flags (config_flags). The program that calls
  // run_bench (bench_report.h) dispatches those to run_config_here / run_rank (bench_rows.h).
  std::vector<std::string> child_arguments = {"bench"};
  // Progress and the children's stderr, a line at a time; empty: silent.
  std::function<void(const std::string&)> log;
};

// Fills the suite's defaults (width, batch, threads, rounds) and checks every value. Throws
// pipetrain::BadInput naming the flag and its range.
void resolve_defaults(BenchOptions& options);

// The llama suite's model (hidden size `width`): 8 decoder layers, 8 heads of 32 (width 256), 4
// key/value heads, SwiGLU of 688, a vocabulary of 4096, untied, sequences of kLlamaSeqLen ids.
// bench/torch_pipelining.py builds the same config for transformers' LlamaForCausalLM.
constexpr int kLlamaSeqLen = 128;
nlohmann::json llama_bench_config(int width);

// For the benches that run `pipetrain train` as a user does (bench_zero_memory,
// bench_checkpoint_save, bench_zero_plus_plus): the `pipetrain` executable of this build; a fresh
// directory /tmp/<name>_XXXXXX holding model/config.json, the bench Llama of `width` with `layers`
// decoder layers (returned); and the output, stdout and stderr, of a shell command.
std::string pipetrain_executable();
std::string bench_llama_dir(const std::string& name, int width, int layers);
std::string run_command(const std::string& command);

// One row of the report: a runtime, a schedule and its shape.
struct Config {
  // libtorch | libtorch-microbatched | inprocess | multiprocess | torchgpipe | torch-pipelining
  std::string runtime;
  std::string schedule = "none";
  int stages = 1;  // K: ranks (worker threads / partitions)
  int virtual_stages = 1;
  int chunks = 1;
  std::string checkpoint = "never";
  std::string purpose = "main";    // main | memory
  std::string precision = "fp32";  // fp32 | bf16 (stage/precision.h)
  int tp = 1;                      // tensor-parallel ranks per stage: the row runs stages x tp
  bool sequence_parallel = false;  // with tp > 1 (parallel/tensor_parallel.h)

  std::string label() const;
};

nlohmann::json to_json(const Config& config);

// The schedules both pipetrain and torch.distributed.pipelining have under the same name (torch
// has no V = 1 zero-bubble schedule, so no zb-h1 peer): each gets a multiprocess row and a
// torch-pipelining row, and the first has a ratio_vs_torch.
const std::vector<std::string>& peer_schedules();
// The ones issue #15 set step-time targets for (bench_report.h's checks).
const std::vector<std::string>& target_schedules();

// Stages per rank of the pipelined rows: 2 for interleaved-1f1b and the families that need two.
int virtual_stages_of(const std::string& schedule);
// Whether the suite trains the Llama model (llama, tp).
bool is_llama_suite(const std::string& suite);

// Intra-op threads of each of a pipelined row's K x tp ranks (T split over them, at least 1).
int threads_per_rank(const BenchOptions& options, const Config& config);

// Every row of one round, in the order they run. REQUIRES: resolve_defaults(options).
std::vector<Config> plan_configs(const BenchOptions& options);

// The flags that describe `config` to a child (`--one` or a rank); BenchOptions' suite, sizes,
// threads and steps among them.
std::vector<std::string> config_flags(const BenchOptions& options, const Config& config);

}  // namespace pipetrain::bench
