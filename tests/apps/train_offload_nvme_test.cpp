// `pipetrain train --offload-optimizer nvme` (ZeRO-Infinity's optimizer offload, docs/OFFLOAD.md)
// with the Hugging Face Llama at pp2 x dp2: the weights equal the same run's with the state in
// memory bit for bit (fp32 at ZeRO 2; bf16 at ZeRO 3 with the parameter shards in the files too), a
// checkpoint written under it resumes bit for bit without it and one written without it resumes
// with it, and the offload directory is left empty. Sub-groups of 1024 elements through 4 KiB
// buffers, so every parameter's slice is cut and the pool holds fewer buffers than the overlap
// wants.
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/cli_run.h"
#include "../helpers/hf_models.h"
#include "../helpers/params_file.h"

namespace pipetrain::train_offload_nvme_test {
namespace {

using testing::CliRun;
using testing::hf_fixtures;
using testing::run_pipetrain;
namespace fs = std::filesystem;

std::string llama_flags(const std::string& extra) {
  const std::string dir = hf_fixtures();
  return "train --model " + dir + "/llama --data tokens --token-file " + dir +
         "/tokens.bin --seq-len 16 --batch-size 8 --lr 1e-2 --optimizer adamw --adam-eps 1e-6 "
         "--nproc 4 --pp 2 --dp 2 --chunks 2 " +
         extra;
}

std::string nvme(const std::string& dir) {
  return " --offload-optimizer nvme --offload-dir " + dir +
         " --offload-buffer-bytes 4KiB --offload-buffer-count 4";
}

bool bitwise_equal(const std::string& a, const std::string& b) {
  const auto x = testing::load_params(a), y = testing::load_params(b);
  if (x.empty() || x.size() != y.size()) return false;
  for (const auto& [name, tensor] : y) {
    if (!x.count(name) || !torch::equal(x.at(name), tensor)) return false;
  }
  return true;
}

TEST(TrainOffloadNvme, WeightsAndCheckpointsEqualTheRunInMemoryBitForBit) {
  const std::string dir = testing::scratch_dir("train_offload_nvme");
  const std::string files = dir + "/offload";
  fs::create_directories(files);
  const std::string fp32 = llama_flags("--steps 4 --zero 2 --schedule 1f1b");
  auto run = [&](const std::string& flags, const std::string& name) {
    const CliRun r = run_pipetrain(flags + " --save-params " + dir + "/" + name + ".pt");
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    return r;
  };
  // --report-comm (docs/DISTRIBUTED.md), counting only: on one host nothing goes between hosts.
  const CliRun memory =
      run(fp32 + " --checkpoint-dir " + dir + "/memory --save-every 2 --report-comm", "memory");
  EXPECT_NE(memory.output.find("comm: per step, every rank's collectives (as a ring sends them), "
                               "within hosts / between hosts: all-reduce "),
            std::string::npos)
      << memory.output;
  EXPECT_NE(memory.output.find(" / 0 B; in all "), std::string::npos) << memory.output;
  EXPECT_EQ(memory.output.find("reduce-scatter 0 B /"), std::string::npos) << memory.output;
  const CliRun offloaded =
      run(fp32 + nvme(files) + " --checkpoint-dir " + dir + "/files --save-every 2", "files");
  EXPECT_NE(offloaded.output.find("optimizer state: "), std::string::npos) << offloaded.output;
  EXPECT_NE(offloaded.output.find("the optimizer state in files"), std::string::npos)
      << offloaded.output;
  EXPECT_TRUE(bitwise_equal(dir + "/files.pt", dir + "/memory.pt"));
  // The checkpoint of the nvme run resumed in memory, and the in-memory one resumed with nvme.
  run(fp32 + " --resume " + dir + "/files/step-2", "files_resumed_in_memory");
  run(fp32 + nvme(files) + " --resume " + dir + "/memory/step-2", "memory_resumed_with_files");
  EXPECT_TRUE(bitwise_equal(dir + "/files_resumed_in_memory.pt", dir + "/memory.pt"));
  EXPECT_TRUE(bitwise_equal(dir + "/memory_resumed_with_files.pt", dir + "/memory.pt"));
  // bf16 at ZeRO 3 (the parameters sharded too, gathered in bf16), another schedule, and the
  // parameter shards in the files as well (--offload-params nvme).
  const std::string bf16 = llama_flags("--steps 2 --zero 3 --schedule gpipe --precision bf16");
  // Over hosts of two ranks the replicas (ranks 0 and 2, 1 and 3) are on two hosts: ZeRO-3's
  // gathers and reductions go between them, nothing within.
  const CliRun hosts = run(bf16 + " --report-comm --ranks-per-host 2", "bf16_memory");
  for (const char* kind : {"reduce-scatter 0 B / ", "all-gather 0 B / "}) {
    EXPECT_NE(hosts.output.find(kind), std::string::npos) << kind << "\n" << hosts.output;
  }
  EXPECT_EQ(hosts.output.find("all-gather 0 B / 0 B"), std::string::npos) << hosts.output;
  const CliRun params = run(bf16 + nvme(files) + " --offload-params nvme", "bf16_files");
  EXPECT_NE(params.output.find("parameter shards, their gradients and optimizer state: "),
            std::string::npos)
      << params.output;
  EXPECT_TRUE(bitwise_equal(dir + "/bf16_files.pt", dir + "/bf16_memory.pt"));
  // Every process removed its file as soon as it was open: nothing is left to read as state.
  EXPECT_TRUE(fs::is_empty(files)) << fs::directory_iterator(files)->path();
}

// ZeRO-3 at one replica, as DeepSpeed runs stage 3 on one device: one rank process (a world of
// one) whose parameter pieces are whole segments, read from the file straight into the buffer the
// parameters point into. Equal bit for bit to the same process with the shards in memory.
TEST(TrainOffloadNvme, ZeroThreeInOneProcessEqualsTheRunInMemoryBitForBit) {
  const std::string dir = testing::scratch_dir("train_offload_nvme_one");
  const std::string files = dir + "/offload";
  fs::create_directories(files);
  const std::string fixtures = hf_fixtures();
  // DeepSpeed's WarmupLR (log warm-up from 1e-3, the lr at step 2).
  const std::string base = "train --model " + fixtures + "/llama --data tokens --token-file " +
                           fixtures +
                           "/tokens.bin --seq-len 16 --batch-size 8 --lr 1e-2 --optimizer adamw "
                           "--adam-eps 1e-6 --chunks 2 --steps 3 --warmup-steps 2 ";
  const std::string one = base + "--lr-schedule warmup-lr --warmup-min-lr 1e-3 --zero 3 " +
                          "--save-params " + dir + "/";
  const CliRun memory = run_pipetrain(one + "memory.pt --offload-optimizer cpu");
  ASSERT_EQ(memory.exit_code, 0) << memory.output;
  EXPECT_NE(memory.output.find("launching 1 process (1 pipeline x 1 data-parallel)"),
            std::string::npos)
      << memory.output;
  const CliRun offloaded = run_pipetrain(one + "files.pt" + nvme(files) + " --offload-params nvme");
  ASSERT_EQ(offloaded.exit_code, 0) << offloaded.output;
  EXPECT_TRUE(bitwise_equal(dir + "/files.pt", dir + "/memory.pt"));
  EXPECT_TRUE(fs::is_empty(files));
  // The same runs from DeepSpeed's config (job/deepspeed_config.h), shaped as Hugging Face's
  // ZeRO-3 examples with "auto" values (resolved from the flags and the model's hidden size),
  // with both offloads to cpu and to nvme: the same weights bit for bit.
  for (const std::string device : {"cpu", "nvme"}) {
    const std::string path = dir + "/ds_" + device + ".json";
    std::ofstream(path) << R"({
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                "weight_decay": "auto"}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-3,
                    "warmup_max_lr": "auto", "warmup_num_steps": "auto"}},
      "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": ")" +
                               device + R"(", "nvme_path": ")" + files +
                               R"(", "pin_memory": true, "buffer_count": 4},
        "offload_param": {"device": ")" +
                               device + R"(", "nvme_path": ")" + files +
                               R"(", "pin_memory": true, "buffer_count": 4, "buffer_size": 1024},
        "aio": {"block_size": 262144, "queue_depth": 32},
        "overlap_comm": true, "contiguous_gradients": true, "sub_group_size": 1e9,
        "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9
      },
      "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
      "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"
    })";
    const CliRun ds = run_pipetrain(base + "--save-params " + dir + "/ds_" + device +
                                    ".pt --deepspeed-config " + path);
    ASSERT_EQ(ds.exit_code, 0) << ds.output;
    EXPECT_NE(ds.output.find("these keys change nothing in pipetrain: "
                             "zero_optimization.aio.block_size"),
              std::string::npos)
        << ds.output;
    EXPECT_TRUE(bitwise_equal(dir + "/ds_" + device + ".pt",
                              dir + (device == "cpu" ? "/memory.pt" : "/files.pt")))
        << device;
  }
  EXPECT_TRUE(fs::is_empty(files));
  // Several stages in one process gather nothing: refused, naming the way that does.
  const CliRun stages = run_pipetrain(one + "x.pt --offload-optimizer cpu --stages 2");
  EXPECT_EQ(stages.exit_code, 2) << stages.output;
  EXPECT_NE(stages.output.find("--nproc N --pp N"), std::string::npos) << stages.output;
}

// --zero-ladder: DeepSpeed's ladder walked by train's memory check on a Llama whose model states
// dwarf its activations (6.3 M parameters, 8 tokens a micro-batch): within 70 MiB a rank only the
// files fit (with 64 KiB buffers), and the run trains with that rung's flags, equal bit for bit
// to the run given them, under the auto plan too; a limit no rung meets exits 2 naming each.
TEST(TrainOffloadNvme, ZeroLadderChoosesTheFirstRungThatFitsAndTrainsAsItsFlags) {
  const std::string dir = testing::scratch_dir("train_zero_ladder");
  const std::string files = dir + "/offload";
  fs::create_directories(files);
  std::ofstream(dir + "/config.json") << R"({"architectures": ["LlamaForCausalLM"],
      "model_type": "llama", "hidden_size": 256, "intermediate_size": 1024,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": 8192, "rms_norm_eps": 1e-5, "tie_word_embeddings": false})";
  const std::string run = "train --model " + dir + " --init random --data tokens --token-file " +
                          hf_fixtures() +
                          "/tokens.bin --seq-len 8 --batch-size 4 --steps 2 --nproc 4 --pp 2 "
                          "--dp 2 --optimizer adamw --offload-dir " +
                          files + " --offload-buffer-bytes 64KiB --save-params " + dir + "/";
  const CliRun ladder = run_pipetrain(run + "ladder.pt --zero-ladder --memory-limit 70MiB");
  ASSERT_EQ(ladder.exit_code, 0) << ladder.output;
  for (const char* line :
       {"ZeRO ladder (DeepSpeed's), within 70.0 MiB a rank:", "  ZeRO 0  (--zero 0)  needs ",
        "over --memory-limit 70.0 MiB a rank",
        "  ZeRO 3 + parameter offload  (--zero 3 --offload-optimizer cpu --offload-params cpu)  "
        "skipped: on CPU stages",
        "chosen: ZeRO 3 + NVMe (--zero 3 --offload-optimizer nvme --offload-params nvme "
        "--offload-dir DIR)",
        "parameter shards, their gradients and optimizer state: "}) {
    EXPECT_NE(ladder.output.find(line), std::string::npos) << line << "\n" << ladder.output;
  }
  const CliRun flags = run_pipetrain(
      run +
      "flags.pt --zero 3 --offload-optimizer nvme --offload-params nvme --memory-limit 70MiB");
  ASSERT_EQ(flags.exit_code, 0) << flags.output;
  EXPECT_TRUE(bitwise_equal(dir + "/ladder.pt", dir + "/flags.pt"));
  const CliRun none = run_pipetrain(run + "none.pt --zero-ladder --memory-limit 10MiB");
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_NE(none.output.find("no rung fits 10.0 MiB a rank"), std::string::npos) << none.output;
  EXPECT_TRUE(fs::is_empty(files));
}

// On CPU stages `cpu` is accepted, and said once: the state is in host memory already. (Bad
// input of every offload flag: docs/ERRORS.md's rows, run by errors_doc_test.cpp.)
TEST(TrainOffloadNvme, CpuOnCpuStagesIsAcceptedAndSaidOnce) {
  const CliRun cpu = run_pipetrain(
      "train --model mlp --data synthetic --synthetic-samples 32 --batch-size 8 --steps 1 "
      "--stages 2 --zero 1 --offload-optimizer");
  EXPECT_EQ(cpu.exit_code, 0) << cpu.output;
  const std::string said = "the optimizer state is in host memory already";
  const auto first = cpu.output.find(said);
  EXPECT_NE(first, std::string::npos) << cpu.output;
  EXPECT_EQ(cpu.output.find(said, first + 1), std::string::npos) << cpu.output;
}

}  // namespace
}  // namespace pipetrain::train_offload_nvme_test
