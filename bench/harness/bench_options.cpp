// The bench's settings and the configurations it runs (bench_options.h).
#include "bench_options.h"

#include <stdlib.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "pipetrain/base/error.h"
#include "pipetrain/schedule/generators.h"

namespace pipetrain::bench {
namespace {

[[noreturn]] void bad(const std::string& message) {
  throw BadInput(message);
}

// Whether the schedule takes K ranks and M micro-batches (dualpipev: an even K and M >= 2K).
bool fits(const std::string& schedule, int K, int M) {
  return schedule::shape_error(schedule, K, M, virtual_stages_of(schedule)).empty();
}

}  // namespace

void resolve_defaults(BenchOptions& a) {
  if (a.suite != "mlp" && a.suite != "small" && a.suite != "cnn" && a.suite != "moe" &&
      a.suite != "long" && !is_llama_suite(a.suite)) {
    bad("--suite must be mlp, small, cnn, llama, tp, moe or long (got '" + a.suite + "')");
  }
  // The moe and long suites' models are Llama-shaped too: the llama defaults.
  const bool llama = is_llama_suite(a.suite) || a.suite == "moe" || a.suite == "long";
  for (const int length : a.seq_lens) {
    if (length < 8 || length % 8 != 0) {
      bad("--seq-lens of the long suite are cut into 2 x 4 chunks: multiples of 8, got " +
          std::to_string(length));
    }
  }
  if (a.quick) {
    if (a.width == 0) a.width = a.suite == "cnn" ? 8 : llama ? 32 : 64;
    if (a.batch == 0) a.batch = llama ? 16 : 32;
  }
  if (a.width == 0) {
    a.width = a.suite == "mlp" ? 1024 : a.suite == "small" || llama ? 256 : 32;
  }
  if (a.batch == 0) {
    a.batch = a.suite == "mlp" ? 256 : a.suite == "small" ? 64 : llama ? 16 : 128;
  }
  if (llama && a.width % 32 != 0) {
    bad("--width of the llama suite is the hidden size: a multiple of 32 (8 heads of width/8, "
        "an even head size), got " +
        std::to_string(a.width));
  }
  if (a.threads == 0)
    a.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (a.python.empty()) a.python = PIPETRAIN_PYTHON;
  if (a.width < 1 || a.batch < 1 || a.threads < 1) {
    bad("--width, --batch and --threads must be >= 1");
  }
  if (a.steps < 1) bad("--steps must be >= 1 (got " + std::to_string(a.steps) + ")");
  if (a.rounds < 0) bad("--rounds must be >= 1 (got " + std::to_string(a.rounds) + ")");
  if (a.rounds == 0) a.rounds = a.quick ? 1 : 3;
  if (a.warmup < 0) bad("--warmup must be >= 0");
  if (a.stages < 1 || a.chunks < 1) bad("--stages and --chunks must be >= 1");
  // Each micro-batch needs a row. (A child's --chunks is its row's M: 2M for the memory rows at
  // 2M, which plan_configs leaves out where the batch holds fewer rows.)
  if (a.batch < a.chunks) {
    bad("--batch " + std::to_string(a.batch) + " is smaller than --chunks " +
        std::to_string(a.chunks) +
        ": every micro-batch needs a row; use --batch >= " + std::to_string(a.chunks));
  }
  if (a.checkpoint != "never" && a.checkpoint != "except_last" && a.checkpoint != "always") {
    bad("--checkpoint must be always, except_last or never (got '" + a.checkpoint + "')");
  }
  if (!(a.config_timeout > 0)) bad("--config-timeout must be > 0 seconds");
  if (a.suite == "tp" && (a.tp < 2 || 8 % a.tp != 0 || 4 % a.tp != 0)) {
    // The llama suite's model has 8 heads and 4 key/value heads.
    bad("--tp of the tp suite must divide the model's 4 key/value heads and be >= 2 (2 or 4), "
        "got " +
        std::to_string(a.tp));
  }
  if (a.suite == "tp" && a.no_multiprocess) {
    bad("--no-multiprocess leaves the tp suite no rows: every one of them is a multi-process job");
  }
  if (a.suite == "tp" && a.stages < 2) {
    bad("--stages of the tp suite must be >= 2 (pipeline x tensor parallel), got " +
        std::to_string(a.stages));
  }
}

bool is_llama_suite(const std::string& suite) {
  return suite == "llama" || suite == "tp";
}

nlohmann::json llama_bench_config(int width) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", 4096},
          {"hidden_size", width},
          {"intermediate_size", (width * 8 / 3 + 15) / 16 * 16},
          {"num_hidden_layers", 8},
          {"num_attention_heads", 8},
          {"num_key_value_heads", 4},
          {"head_dim", width / 8},
          {"max_position_embeddings", kLlamaSeqLen},
          {"rms_norm_eps", 1e-5},
          {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
          {"tie_word_embeddings", false}};
}

std::string pipetrain_executable() {
  const std::filesystem::path self = std::filesystem::canonical("/proc/self/exe");
  return (self.parent_path().parent_path() / "pipetrain").string();
}

std::string bench_llama_dir(const std::string& name, int width, int layers) {
  std::string pattern = "/tmp/" + name + "_XXXXXX";
  const char* made = ::mkdtemp(pattern.data());
  if (made == nullptr) throw Error(ErrorKind::Runtime, "cannot make a directory " + pattern);
  const std::string dir = made;
  std::filesystem::create_directories(dir + "/model");
  nlohmann::json config = llama_bench_config(width);
  config["num_hidden_layers"] = layers;
  std::ofstream(dir + "/model/config.json") << config.dump(2);
  return dir;
}

std::string run_command(const std::string& command) {
  std::string output;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return output;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe)) output += buffer.data();
  ::pclose(pipe);
  return output;
}

std::string Config::label() const {
  std::ostringstream out;
  out << runtime;
  if (schedule != "none") out << " " << schedule;
  out << " K=" << stages;
  if (virtual_stages > 1) out << " V=" << virtual_stages;
  if (tp > 1) out << " tp=" << tp << (sequence_parallel ? " sp" : "");
  out << " M=" << chunks << " ckpt=" << checkpoint;
  if (precision != "fp32") out << " " << precision;
  return out.str();
}

nlohmann::json to_json(const Config& c) {
  return {{"runtime", c.runtime}, {"schedule", c.schedule},
          {"stages", c.stages},   {"virtual_stages", c.virtual_stages},
          {"chunks", c.chunks},   {"checkpoint", c.checkpoint},
          {"purpose", c.purpose}, {"precision", c.precision},
          {"tp", c.tp},           {"sequence_parallel", c.sequence_parallel}};
}

const std::vector<std::string>& peer_schedules() {
  static const std::vector<std::string> names = {
      "gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-v", "interleaved-zb", "dualpipev"};
  return names;
}

const std::vector<std::string>& target_schedules() {
  static const std::vector<std::string> names = {"gpipe", "1f1b", "interleaved-1f1b"};
  return names;
}

int virtual_stages_of(const std::string& schedule) {
  return schedule == "interleaved-1f1b" ? 2 : schedule::default_virtual_stages(schedule);
}

int threads_per_rank(const BenchOptions& a, const Config& c) {
  return std::max(1, a.threads / (c.stages * c.tp));
}

namespace {

// The tp suite: K pipeline ranks x T tensor-parallel ranks (with and without sequence
// parallelism) against torch's own 2-D composition, and against K*T pipeline ranks at tp 1.
std::vector<Config> plan_tp_configs(const BenchOptions& a) {
  std::vector<Config> configs;
  const int K = a.stages;
  const int M = a.chunks;
  for (const char* schedule : {"gpipe", "1f1b"}) {
    Config ours{"multiprocess", schedule, K, 1, M, a.checkpoint, "main"};
    ours.tp = a.tp;
    configs.push_back(ours);
  }
  Config sp{"multiprocess", "1f1b", K, 1, M, a.checkpoint, "main"};
  sp.tp = a.tp;
  sp.sequence_parallel = true;
  configs.push_back(sp);
  for (const char* schedule : {"gpipe", "1f1b"}) {
    if (!fits(schedule, K * a.tp, M)) continue;
    configs.push_back({"multiprocess", schedule, K * a.tp, 1, M, a.checkpoint, "main"});
  }
  if (!a.no_python) {
    for (const char* schedule : {"gpipe", "1f1b"}) {
      Config torch{"torch-pipelining", schedule, K, 1, M, a.checkpoint, "main"};
      torch.tp = a.tp;
      configs.push_back(torch);
    }
  }
  return configs;
}

}  // namespace

std::vector<Config> plan_configs(const BenchOptions& a) {
  if (a.suite == "tp") return plan_tp_configs(a);
  std::vector<Config> configs;
  const int K = a.stages;
  const int M = a.chunks;
  configs.push_back({"libtorch", "none", 1, 1, 1, "never", "main"});
  configs.push_back({"libtorch-microbatched", "none", 1, 1, M, "never", "main"});
  configs.push_back({"inprocess", "gpipe", 1, 1, 1, "never", "main"});
  for (const char* schedule : {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1"}) {
    configs.push_back(
        {"inprocess", schedule, K, virtual_stages_of(schedule), M, a.checkpoint, "main"});
  }
  if (!a.no_memory) {
    for (int m : {M, 2 * M}) {
      if (m > a.batch) continue;  // fewer rows than micro-batches (notes_of says so)
      for (const char* schedule : {"gpipe", "1f1b"}) {
        for (const char* mode : {"never", "except_last", "always"}) {
          Config c{"inprocess", schedule, K, 1, m, mode, "memory"};
          const bool duplicate = std::any_of(configs.begin(), configs.end(), [&](const Config& o) {
            return o.label() == c.label();
          });
          if (!duplicate) configs.push_back(c);
        }
      }
    }
  }
  if (!a.no_multiprocess && K > 1) {
    std::vector<std::string> schedules = peer_schedules();
    schedules.push_back("zb-h1");
    for (const auto& schedule : schedules) {
      if (!fits(schedule, K, M)) continue;
      configs.push_back(
          {"multiprocess", schedule, K, virtual_stages_of(schedule), M, a.checkpoint, "main"});
    }
  }
  if (a.bf16) {
    configs.push_back({"inprocess", "1f1b", K, 1, M, a.checkpoint, "main", "bf16"});
    for (const char* schedule : {"gpipe", "1f1b"}) {
      if (a.no_multiprocess || K < 2) break;
      configs.push_back({"multiprocess", schedule, K, 1, M, a.checkpoint, "main", "bf16"});
    }
  }
  if (!a.no_python) {
    // torchgpipe's peer runs the MLPs and the CNN; torch.distributed.pipelining's the MLPs and
    // transformers' own Llama.
    if (a.suite != "llama")
      configs.push_back({"torchgpipe", "gpipe", K, 1, M, a.checkpoint, "main"});
    if (!a.no_multiprocess && K > 1 && a.suite != "cnn") {
      for (const auto& schedule : peer_schedules()) {
        if (!fits(schedule, K, M)) continue;
        configs.push_back({"torch-pipelining", schedule, K, virtual_stages_of(schedule), M,
                           a.checkpoint, "main"});
      }
    }
  }
  return configs;
}

std::vector<std::string> config_flags(const BenchOptions& a, const Config& c) {
  std::vector<std::string> flags = {"--runtime",    c.runtime,
                                    "--schedule",   c.schedule,
                                    "--stages",     std::to_string(c.stages),
                                    "--virtual",    std::to_string(c.virtual_stages),
                                    "--chunks",     std::to_string(c.chunks),
                                    "--checkpoint", c.checkpoint,
                                    "--precision",  c.precision,
                                    "--suite",      a.suite,
                                    "--width",      std::to_string(a.width),
                                    "--batch",      std::to_string(a.batch),
                                    "--threads",    std::to_string(a.threads),
                                    "--steps",      std::to_string(a.steps),
                                    "--warmup",     std::to_string(a.warmup),
                                    "--row-tp",     std::to_string(c.tp)};
  if (c.sequence_parallel) flags.push_back("--row-sp");
  return flags;
}

}  // namespace pipetrain::bench
