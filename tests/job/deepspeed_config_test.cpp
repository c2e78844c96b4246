// DeepSpeed's ds_config.json into a JobConfig (job/deepspeed_config.h): Hugging Face's ZeRO-3
// NVMe example as its documentation prints it, DeepSpeed's batch rules, its optimizer and
// scheduler types, "auto", and every refusal naming its key.
#include "pipetrain/job/deepspeed_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../helpers/temp_dir.h"

namespace pipetrain::job {
namespace {

namespace fs = std::filesystem;

// Hugging Face's "NVMe configuration" example (its DeepSpeed guide), the paths ours.
const char* kHfNvmeExample = R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "optimizer": {"type": "AdamW",
                  "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR",
                  "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                             "warmup_num_steps": "auto"}},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": true,
                              "buffer_count": 4, "fast_init": false},
        "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": true,
                          "buffer_count": 5, "buffer_size": 1e8, "max_in_cpu": 1e9},
        "aio": {"block_size": 262144, "queue_depth": 32, "thread_count": 1,
                "single_submit": false, "overlap_events": true},
        "overlap_comm": true,
        "contiguous_gradients": true,
        "sub_group_size": 1e9,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": true
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": false
})";

bool has(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

std::string error_of(const std::string& text, JobConfig config = {},
                     const std::vector<std::string>& given = {}) {
  try {
    read_deepspeed_text(text, "ds.json", config, Command::kTrain, given);
  } catch (const DeepSpeedConfigError& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(DeepSpeedConfig, HuggingFacesNvmeExampleResolvesItsAutoValuesFromTheJobAndTheModel) {
  const std::string dir = testing::fresh_temp_dir("deepspeed_config_model");
  std::ofstream(dir + "/config.json") << R"({"hidden_size": 64})";
  JobConfig config;
  config.model.name = dir;
  config.optimizer.lr = 0.02;
  config.optimizer.warmup_steps = 5;
  config.training.batch_size = 12;
  config.parallel.dp = 2;  // overlap_comm overlaps the replicas' gradient sum
  const DeepSpeedReading read =
      read_deepspeed_text(kHfNvmeExample, "ds.json", config, Command::kTrain);
  // auto: the job's own.
  EXPECT_EQ(config.training.batch_size, 12);
  EXPECT_EQ(config.pipeline.chunks, "");
  EXPECT_EQ(config.pipeline.precision, "fp32");
  EXPECT_EQ(config.optimizer.name, "adamw");
  EXPECT_EQ(config.optimizer.lr, 0.02);
  EXPECT_EQ(config.optimizer.clip_grad_norm, 0);
  EXPECT_EQ(config.optimizer.lr_schedule, "warmup-lr");
  EXPECT_EQ(config.optimizer.warmup_steps, 5);
  EXPECT_EQ(config.optimizer.warmup_min_lr, 0);
  EXPECT_EQ(config.optimizer.warmup_type, "log");
  EXPECT_EQ(config.training.log_every, 2000);
  // zero_optimization, DeepSpeed's element counts as float32 bytes.
  EXPECT_EQ(config.zero.stage, 3);
  EXPECT_EQ(config.zero.offload_optimizer, "nvme");
  EXPECT_EQ(config.zero.offload_params, "nvme");
  EXPECT_EQ(config.zero.offload_dir, "/local_nvme");
  EXPECT_EQ(config.zero.offload_buffer_count, 5);
  EXPECT_EQ(config.zero.offload_buffer_bytes, "400000000");
  EXPECT_EQ(config.zero.sub_group_size, 100000000);  // a buffer's worth, said in a note
  EXPECT_TRUE(config.parallel.overlap_grad_reduce);
  EXPECT_DOUBLE_EQ(config.parallel.bucket_size, 64.0 * 64 * 4 / (1 << 20));  // h x h
  EXPECT_EQ(config.zero.prefetch, std::to_string(3686 * 4));                 // int(0.9 x h x h)
  EXPECT_EQ(config.zero.persistence_threshold, std::to_string(640 * 4));     // 10 h
  EXPECT_EQ(config.zero.max_live, "4000000000");
  EXPECT_EQ(config.zero.max_reuse_distance, "4000000000");
  for (const char* key :
       {"zero_optimization.aio.block_size", "zero_optimization.aio.thread_count",
        "zero_optimization.contiguous_gradients", "zero_optimization.offload_param.max_in_cpu",
        "zero_optimization.offload_optimizer.fast_init",
        "zero_optimization.stage3_gather_16bit_weights_on_model_save", "fp16.loss_scale_window",
        "wall_clock_breakdown"}) {
    EXPECT_TRUE(has(read.ignored, key)) << key;
  }
  EXPECT_FALSE(has(read.ignored, "zero_optimization.stage"));
  ASSERT_EQ(read.notes.size(), 1u);
  EXPECT_NE(read.notes[0].find("sub_group_size 1000000000"), std::string::npos) << read.notes[0];
}

TEST(DeepSpeedConfig, ZeroPlusPlusKeysBecomeTheirFlags) {
  JobConfig config;
  config.parallel.dp = 4;
  const DeepSpeedReading read = read_deepspeed_text(
      R"({"zero_optimization": {"stage": 3, "zero_quantized_weights": true,
          "zero_hpz_partition_size": 2, "zero_quantized_gradients": true,
          "zero_quantized_nontrainable_weights": false}})",
      "ds", config, Command::kTrain);
  EXPECT_TRUE(config.zero.quantized_weights);
  EXPECT_EQ(config.zero.hpz_partition_size, 2);
  EXPECT_TRUE(config.zero.quantized_gradients);
  EXPECT_TRUE(has(read.ignored, "zero_optimization.zero_quantized_nontrainable_weights"));
  // A flag that says otherwise exits 2 naming both.
  JobConfig flagged;
  flagged.parallel.dp = 4;
  flagged.zero.hpz_partition_size = 4;
  const std::string error =
      error_of(R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}})", flagged,
               {"zero.hpz_partition_size"});
  EXPECT_NE(error.find("zero_hpz_partition_size"), std::string::npos) << error;
  EXPECT_NE(error.find("--zero-hpz-partition-size"), std::string::npos) << error;
}

TEST(DeepSpeedConfig, Fp16TakesDeepSpeedsLossScalerWithItsDefaults) {
  JobConfig config;
  const DeepSpeedReading read = read_deepspeed_text(
      R"({"fp16": {"enabled": true, "initial_scale_power": 12, "hysteresis": 3,
          "consecutive_hysteresis": true, "min_loss_scale": 4, "auto_cast": false}})",
      "ds", config, Command::kTrain);
  EXPECT_EQ(config.pipeline.precision, "fp16");
  EXPECT_EQ(config.optimizer.loss_scaler, "deepspeed");
  EXPECT_EQ(config.optimizer.initial_loss_scale, 4096);
  EXPECT_EQ(config.optimizer.loss_scale_window, 1000);  // DeepSpeed's default, not torch's 2000
  EXPECT_EQ(config.optimizer.loss_scale_hysteresis, 3);
  EXPECT_TRUE(config.optimizer.loss_scale_consecutive_hysteresis);
  EXPECT_EQ(config.optimizer.min_loss_scale, 4);
  EXPECT_TRUE(has(read.ignored, "fp16.auto_cast"));
  // A static scale; "auto" enabled follows --precision, and with fp32 the keys change nothing.
  JobConfig fixed;
  read_deepspeed_text(R"({"fp16": {"enabled": true, "loss_scale": 128}})", "ds", fixed,
                      Command::kTrain);
  EXPECT_EQ(fixed.optimizer.loss_scaler, "static");
  EXPECT_EQ(fixed.optimizer.initial_loss_scale, 128);
  JobConfig off;
  const DeepSpeedReading ignored = read_deepspeed_text(
      R"({"fp16": {"enabled": "auto", "hysteresis": 3}})", "ds", off, Command::kTrain);
  EXPECT_EQ(off.optimizer.loss_scaler, "torch");
  EXPECT_TRUE(has(ignored.ignored, "fp16.hysteresis"));
}

TEST(DeepSpeedConfig, BatchKeysAreCompletedByDeepSpeedsRulesOverTheReplicas) {
  JobConfig config;
  config.parallel.dp = 2;
  read_deepspeed_text(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2})", "ds",
                      config, Command::kTrain);
  EXPECT_EQ(config.training.batch_size, 16);
  EXPECT_EQ(config.pipeline.chunks, "4");
  read_deepspeed_text(R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2})",
                      "ds", config, Command::kTrain);
  EXPECT_EQ(config.training.batch_size, 12);
  EXPECT_EQ(config.pipeline.chunks, "2");
  read_deepspeed_text(R"({"train_batch_size": 8})", "ds", config, Command::kTrain);
  EXPECT_EQ(config.pipeline.chunks, "1");  // DeepSpeed's: one accumulation step
  const std::string inconsistent = error_of(
      R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
          "gradient_accumulation_steps": 3})",
      config);
  EXPECT_NE(inconsistent.find("ds.json: train_batch_size: train_batch_size 16 is not "
                              "train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 3 "
                              "x 2 data-parallel replicas (--dp)"),
            std::string::npos)
      << inconsistent;
}

TEST(DeepSpeedConfig, AdamIsDecoupledUnlessAdamWModeIsFalseAndSchedulersTakeTheirDefaults) {
  JobConfig config;
  read_deepspeed_text(R"({"optimizer": {"type": "adam", "params": {"lr": 3e-4, "betas": [0.8, 0.9],
      "eps": 1e-6, "weight_decay": 0.1}}})",
                      "ds", config, Command::kTrain);
  EXPECT_EQ(config.optimizer.name, "adamw");  // DeepSpeed's adam_w_mode defaults to true
  EXPECT_EQ(config.optimizer.lr, 3e-4);
  EXPECT_EQ(config.optimizer.adam_betas, (std::vector<double>{0.8, 0.9}));
  EXPECT_EQ(config.optimizer.adam_eps, 1e-6);
  EXPECT_EQ(config.optimizer.weight_decay, 0.1);
  EXPECT_EQ(config.optimizer.clip_grad_norm, 1.0);  // absent: DeepSpeed's default
  read_deepspeed_text(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}},
      "gradient_clipping": 0,
      "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 50,
          "warmup_type": "linear"}}})",
                      "ds", config, Command::kTrain);
  EXPECT_EQ(config.optimizer.name, "adam");
  EXPECT_EQ(config.optimizer.clip_grad_norm, 0);
  EXPECT_EQ(config.optimizer.lr_schedule, "warmup-decay-lr");
  EXPECT_EQ(config.optimizer.lr, 0.001);           // WarmupDecayLR's own warmup_max_lr
  EXPECT_EQ(config.optimizer.warmup_steps, 1000);  // DeepSpeed's default
  EXPECT_EQ(config.optimizer.warmup_type, "linear");
  EXPECT_EQ(config.optimizer.lr_total_steps, 50);
  read_deepspeed_text(R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.1}},
      "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 20,
          "warmup_min_ratio": 0.5, "warmup_num_steps": 4}}})",
                      "ds", config, Command::kTrain);
  EXPECT_EQ(config.optimizer.lr_schedule, "warmup-cosine-lr");
  EXPECT_DOUBLE_EQ(config.optimizer.warmup_min_lr, 0.05);
  EXPECT_DOUBLE_EQ(config.optimizer.min_lr, 0.1 * 0.0001);  // cos_min_ratio's default
}

TEST(DeepSpeedConfig, WhatCannotBeHonouredExitsTwoNamingTheKey) {
  const auto expect = [](const std::string& text, const std::string& wanted) {
    const std::string error = error_of(text);
    EXPECT_NE(error.find(wanted), std::string::npos) << text << "\n" << error;
  };
  expect("{\"train_batch_size\": 4,\n  \"optimizer\": }",
         "ds.json: not JSON: parse error at line 2, column 16");
  expect(R"({"optimizer": {"type": "Lamb"}})", "ds.json: optimizer.type: 'Lamb'");
  expect(R"({"scheduler": {"type": "OneCycle"}})", "ds.json: scheduler.type: 'OneCycle'");
  expect(R"({"scheduler": {"type": "Cosine"}})", "ds.json: scheduler.type: unknown 'Cosine'");
  expect(R"({"scheduler": {"type": "WarmupDecayLR"}})",
         "ds.json: scheduler.params.total_num_steps: required by WarmupDecayLR");
  expect(R"({"fp16": {"enabled": true, "hysteresis": 0}})",
         "ds.json: fp16.hysteresis: must be at least 1");
  expect(R"({"fp16": {"enabled": true, "loss_scale": -1}})",
         "ds.json: fp16.loss_scale: takes a finite number >= 0");
  expect(R"({"zero_optimization": {"stage": 3, "zero_quantized_weights": 1}})",
         "ds.json: zero_optimization.zero_quantized_weights: takes true or false");
  expect(R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 0}})",
         "ds.json: zero_optimization.zero_hpz_partition_size: must be at least 1");
  expect(R"({"zero_optimization": {"offload_optimizer": {"device": "nvme", "ratio": 0.5}}})",
         "zero_optimization.offload_optimizer.ratio: only 1");
  expect(R"({"zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": "/a"},
      "offload_param": {"device": "nvme", "nvme_path": "/b"}}})",
         "zero_optimization.offload_param.nvme_path: '/b' is not the other nvme_path '/a'");
  expect(R"({"optimizer": {"type": "AdamW", "params": {"amsgrad": true}}})",
         "optimizer.params.amsgrad");
  expect(R"({"train_batch_size": "eight"})", "ds.json: train_batch_size: takes a number");
  expect(R"([1, 2])", "ds.json: a DeepSpeed config is a JSON object");
}

TEST(DeepSpeedConfig, AFlagGivenMustAgreeWithTheFile) {
  JobConfig config;
  config.training.batch_size = 8;
  const std::string error =
      error_of(R"({"train_batch_size": 16})", config, {"training.batch_size"});
  EXPECT_NE(error.find("ds.json: train_batch_size makes --batch-size 16, and the command line "
                       "gives --batch-size 8"),
            std::string::npos)
      << error;
  EXPECT_EQ(error_of(R"({"train_batch_size": 8})", config, {"training.batch_size"}), "(no error)");
  EXPECT_EQ(error_of(R"({"train_batch_size": 16})", config),
            "(no error)");  // not given: the file's
}

}  // namespace
}  // namespace pipetrain::job
