// The CUDA paths: stages on cuda:N devices in one process (Pipe: a stream per rank, events ordering
// the copies between them) and in several (DistributedPipe over Gloo with CUDA stages, and over
// NCCL). Each test that needs a GPU skips, naming what is missing, on a machine without one; the
// first test runs everywhere and checks what a CUDA build says when no GPU is visible.
// `make gpu-check` runs this file on a GPU machine.
#include <cstdio>
#include <vector>

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "../helpers/multiprocess.h"
#include "pipetrain/base/error.h"
#include "pipetrain/partition/profiler.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/stage/device.h"
#include "training_reference.h"

namespace pipetrain {
namespace {

int visible_gpus() {
  return static_cast<int>(torch::cuda::device_count());
}

#define SKIP_UNLESS_GPUS(n)                                                              \
  if (visible_gpus() < (n))                                                              \
  GTEST_SKIP() << "needs " << (n) << " CUDA device(s); " << visible_gpus() << " visible" \
               << " (run `make gpu-check` on a GPU machine)"

TEST(CudaDevice, ACudaDeviceBeyondTheVisibleOnesIsAnErrorNamingTheCount) {
  const torch::Device beyond(torch::kCUDA, static_cast<c10::DeviceIndex>(visible_gpus()));
  try {
    check_device_usable(beyond);
    FAIL() << "no error for " << beyond;
  } catch (const BadInput& e) {
    const std::string message = e.what();
    // A CUDA build counts the visible devices; a CPU-only build says it cannot use CUDA at all.
    EXPECT_TRUE(message.find(std::to_string(visible_gpus()) + " CUDA devices are visible") !=
                    std::string::npos ||
                message.find("CPU-only") != std::string::npos)
        << message;
  }
}

// The profiler on a GPU times what the GPU spends (CUDA events), not the microseconds the host
// takes to queue a kernel: a Linear(4096) on 4096 rows is 2 * 4096^3 = 1.4e11 multiply-adds x 2,
// at least 0.5 ms forward on any GPU today (under 280 TFLOP/s in float32), where a host clock
// reads the launch alone (tens of microseconds). Its activation bytes come from the caching
// allocator: the Linear keeps its input and makes its output, 64 MiB each.
TEST(CudaProfiler, TimesLayersWithCudaEventsAndCountsTheirDeviceBytes) {
  SKIP_UNLESS_GPUS(1);
  const torch::Device gpu(torch::kCUDA, 0);
  torch::nn::Sequential model(torch::nn::Linear(4096, 4096), torch::nn::ReLU());
  model->to(gpu);
  const torch::Tensor batch = torch::randn({4096, 4096}, gpu);
  const partition::ModelProfile profile = partition::profile_sequential(
      model, batch,
      partition::ProfileOptions().microbatch_sizes({4096}).repeats(3).measure_transfer(false));
  ASSERT_EQ(profile.method, "allocator");
  const partition::LayerCost& linear = profile.layers[0].costs[0];
  EXPECT_GT(linear.forward_seconds, 5e-4);
  // The first layer's input is data (no gradient), so its backward is the weight gradient alone:
  // one product the size of the forward's (an H200 timed them 2.83 and 2.83 ms).
  EXPECT_GT(linear.backward_seconds, 0.5 * linear.forward_seconds);
  const std::int64_t block = std::int64_t{4096} * 4096 * 4;
  EXPECT_NEAR(static_cast<double>(linear.activation_bytes), static_cast<double>(block),
              0.01 * static_cast<double>(block));
  // time_on_device waits for the kernels: 10 matmuls take about 10 times one.
  const torch::Tensor a = torch::randn({4096, 4096}, gpu);
  const double one = time_on_device(gpu, 1, [&] { (void)torch::mm(a, a); });
  const double ten = time_on_device(gpu, 10, [&] { (void)torch::mm(a, a); });
  EXPECT_GT(ten, 5 * one);
}

// Weights after 3 SGD steps equal sequential training on the CPU (1e-4 relative: cuBLAS and the
// CPU's BLAS round differently), for every schedule, with every stage on one GPU.
TEST(CudaPipe, StagesOnOneGpuMatchSequentialTrainingForEverySchedule) {
  SKIP_UNLESS_GPUS(1);
  const torch::Device gpu(torch::kCUDA, 0);
  for (const std::string& schedule : schedule::schedule_names()) {
    const int64_t v =
        schedule == "interleaved-1f1b" ? 2 : schedule::default_virtual_stages(schedule);
    for (Checkpoint mode : {Checkpoint::kNever, Checkpoint::kExceptLast}) {
      const auto run = testing::train_skip_mlp_both_ways(PipeOptions()
                                                             .stages(2 * v)
                                                             .virtual_stages(v)
                                                             .chunks(4)
                                                             .schedule(schedule)
                                                             .checkpoint(mode)
                                                             .devices({gpu, gpu}),
                                                         1e-4, 1e-6);
      EXPECT_EQ(run.difference, "") << schedule << " checkpoint " << to_string(mode);
    }
  }
}

// Activation offload on one GPU: checkpointed micro-batches' inputs go to pinned host memory on the
// copy stream and come back before their recompute. The weights are sequential training's, and
// the step's peak of GPU memory allocated during the step is lower than without offload.
TEST(CudaPipe, OffloadedActivationsTrainLikeSequentialTrainingAndLowerThePeak) {
  SKIP_UNLESS_GPUS(1);
  const torch::Device gpu(torch::kCUDA, 0);
  for (const char* schedule : {"gpipe", "1f1b", "zb-h1"}) {
    const auto run = testing::train_skip_mlp_both_ways(PipeOptions()
                                                           .stages(2)
                                                           .chunks(4)
                                                           .schedule(schedule)
                                                           .checkpoint(Checkpoint::kAlways)
                                                           .offload_activations(true)
                                                           .devices({gpu, gpu}),
                                                       1e-4, 1e-6);
    EXPECT_EQ(run.difference, "") << schedule;
  }
  // gpipe runs every forward before the first backward, so without offload each of the 4 stages
  // holds the inputs of all 32 micro-batches (256 rows x 1024 floats, 1 MiB each): 128 MiB. With
  // offload at most the prefetched ones stay; the backwards' own memory (the recompute, the
  // gradients: tens of MiB) is the same both ways. The data's input is on the host, as a data
  // loader's would be; the target is already on the GPU.
  const int64_t stash = int64_t{4} * 32 * 256 * 1024 * 4;
  int64_t peak[2] = {0, 0};
  for (bool offload : {false, true}) {
    torch::manual_seed(0);
    torch::nn::Sequential model;
    for (int l = 0; l < 4; ++l) model->push_back(torch::nn::Linear(1024, 1024));
    Pipe pipe(model, PipeOptions()
                         .stages(4)
                         .chunks(32)
                         .schedule("gpipe")
                         .checkpoint(Checkpoint::kAlways)
                         .offload_activations(offload)
                         .devices({gpu, gpu, gpu, gpu}));
    const torch::Tensor x = torch::randn({8192, 1024});
    const torch::Tensor y = torch::randn({8192, 1024}).to(gpu);
    const auto mse = [](const torch::Tensor& out, const torch::Tensor& target) {
      return torch::mse_loss(out, target);
    };
    pipe->train_step(x, y, mse);  // warm-up: the allocator's blocks and cuBLAS's workspaces exist
    pipe->zero_grad();
    torch::cuda::synchronize();
    // Peaks are counted from what is allocated before the step: weights, the data, and what an
    // earlier Pipe or test left cached.
    const int64_t before = device_allocated_bytes(gpu);
    reset_device_peak_allocated_bytes(gpu);
    pipe->train_step(x, y, mse);
    torch::cuda::synchronize();
    peak[offload] = device_peak_allocated_bytes(gpu) - before;
  }
  EXPECT_LT(peak[1], peak[0] - stash / 2) << "step peak without offload " << peak[0]
                                          << " bytes, with " << peak[1] << "; stash " << stash;
}

// Each rank keeps its stream: rank r on a device has one stream per process. A new pooled stream
// every step (as before) made cuBLAS keep a new workspace, 33 MiB on an H200, for each stream a
// rank's thread ran on: the allocated GPU memory grew step by step, and Pipe by Pipe, until the
// pool's 32 streams were all used.
TEST(CudaPipe, AllocatedMemoryStaysFlatFromStepToStepAndPipeToPipe) {
  SKIP_UNLESS_GPUS(1);
  const torch::Device gpu(torch::kCUDA, 0);
  const torch::Tensor x = torch::randn({256, 512});
  const torch::Tensor y = torch::randn({256, 512});
  const auto mse = [](const torch::Tensor& out, const torch::Tensor& target) {
    return torch::mse_loss(out, target);
  };
  std::vector<int64_t> after_pipe;
  for (int p = 0; p < 3; ++p) {
    torch::manual_seed(0);
    torch::nn::Sequential model;
    for (int l = 0; l < 8; ++l) model->push_back(torch::nn::Linear(512, 512));
    Pipe pipe(model,
              PipeOptions().stages(4).chunks(4).schedule("1f1b").devices({gpu, gpu, gpu, gpu}));
    std::vector<int64_t> allocated;
    for (int step = 0; step < 12; ++step) {
      pipe->zero_grad();
      pipe->train_step(x, y, mse);
      torch::cuda::synchronize();
      allocated.push_back(device_allocated_bytes(gpu));
    }
    // From the second step on (the first makes the gradients and the workspaces), nothing grows.
    EXPECT_LE(allocated.back(), allocated[1] + (1 << 20))
        << "Pipe " << p << ": allocated after step 2: " << allocated[1]
        << ", after step 12: " << allocated.back();
    after_pipe.push_back(allocated.back());
  }
  // The same model and ranks again: the same streams, no new workspaces.
  EXPECT_LE(after_pipe[2], after_pipe[1] + (1 << 20))
      << "allocated after the second Pipe " << after_pipe[1] << ", after the third "
      << after_pipe[2];
}

// A stage on the CPU feeding one on the GPU and back: the copies between devices are ordered.
TEST(CudaPipe, CpuAndGpuStagesMatchSequentialTraining) {
  SKIP_UNLESS_GPUS(1);
  torch::nn::Sequential reference = testing::make_mlp();
  torch::nn::Sequential copy = testing::clone_of(reference);
  auto batches = testing::make_batches(8, 3);
  testing::train_sequential(reference, batches);
  Pipe pipe(copy, PipeOptions().stages(2).chunks(4).schedule("1f1b").devices(
                      {torch::Device(torch::kCUDA, 0), torch::Device(torch::kCPU)}));
  testing::train_pipe(pipe, batches);
  pipe->to(torch::kCPU);
  EXPECT_EQ(testing::compare_parameters(*pipe, *reference, 1e-4, 1e-6), "");
}

// A GPU stage measures what its micro-batches keep by counting the caching allocator's
// allocations made on its thread (count_device_allocations), as a CPU stage counts the CPU
// allocator's. Both keep the same tensors of this MLP (Linear: its input; ReLU: its output), so
// the stash peaks of the last step agree. Before, a GPU stage estimated its stash from its inputs
// and outputs alone: 8 MiB against 630 MiB predicted for a Llama stage (`train --report-memory`,
// first H100 run).
TEST(CudaPipe, StashesOnAGpuAreMeasuredLikeTheSameStagesOnTheCpu) {
  SKIP_UNLESS_GPUS(1);
  const torch::Device gpu(torch::kCUDA, 0);
  ASSERT_TRUE(count_device_allocations(gpu)) << "the caching allocator takes no trace callback";
  const auto stash_peaks = [](const torch::Device& device) {
    torch::manual_seed(0);
    torch::nn::Sequential model;
    for (int l = 0; l < 4; ++l) {
      model->push_back(torch::nn::Linear(512, 512));
      model->push_back(torch::nn::ReLU());
    }
    Pipe pipe(model, PipeOptions()
                         .stages(2)
                         .chunks(4)
                         .schedule("1f1b")
                         .checkpoint(Checkpoint::kNever)
                         .devices({device, device}));
    const torch::Tensor x = torch::randn({64, 512});
    const torch::Tensor y = torch::randn({64, 512}).to(device);
    const auto mse = [](const torch::Tensor& out, const torch::Tensor& target) {
      return torch::mse_loss(out, target);
    };
    for (int step = 0; step < 2; ++step) pipe->train_step(x, y, mse);  // the first one warms up
    std::vector<int64_t> peaks;
    for (const StageAccounting& stage : pipe->stage_accounting()) {
      peaks.push_back(stage.peak_stashed_bytes);
    }
    return peaks;
  };
  const std::vector<int64_t> cpu = stash_peaks(torch::Device(torch::kCPU));
  const std::vector<int64_t> on_gpu = stash_peaks(gpu);
  ASSERT_EQ(cpu.size(), on_gpu.size());
  for (size_t s = 0; s < cpu.size(); ++s) {
    // A micro-batch of 16 rows keeps its input and a ReLU's output at least: 32 KiB each.
    EXPECT_GE(cpu[s], int64_t{2} * 32 * 1024) << "stage " << s;
    EXPECT_NEAR(static_cast<double>(on_gpu[s]), static_cast<double>(cpu[s]),
                0.01 * static_cast<double>(cpu[s]))
        << "stage " << s;
    std::printf("stage %zu stash peak: %lld bytes on the CPU, %lld on the GPU\n", s,
                static_cast<long long>(cpu[s]), static_cast<long long>(on_gpu[s]));
  }
}

// Two ranks of the rank helper's "train" scenario (3 SGD steps against sequential training on
// rank 0) with their stages on `device` over `backend`.
void expect_two_ranks_match_sequential_training(const std::string& device,
                                                const std::string& backend) {
  const std::vector<std::string> names = {"gpipe", "1f1b",           "zb-h1",
                                          "zb-v",  "interleaved-zb", "dualpipev"};
  std::vector<std::string> args = {"train", "2"};
  args.insert(args.end(), names.begin(), names.end());
  auto run =
      testing::run_ranks(2, args, 0, 60000, std::chrono::seconds(10),
                         {{"PIPETRAIN_TEST_DEVICE", device}, {"PIPETRAIN_TEST_BACKEND", backend}});
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  for (const auto& name : names) {
    EXPECT_TRUE(run.printed(std::string("OK train ") + name + " ")) << name << "\n" << run.output();
  }
}

// Two processes whose stages share one GPU, over Gloo (NCCL refuses two ranks on one device).
TEST(CudaDistributed, TwoRanksSharingOneGpuOverGlooMatchSequentialTraining) {
  SKIP_UNLESS_GPUS(1);
  expect_two_ranks_match_sequential_training("cuda:0", "gloo");
}

// NCCL refuses two ranks on one GPU: on an H200 (NCCL 2.28.9) each rank failed its first send or
// receive with "ncclInvalidUsage ... Duplicate GPU detected" and exited with 1, a runtime failure.
// The rendezvous now names the ranks and the way out first, and every rank exits with 2 (bad
// usage) before any communicator exists.
TEST(CudaDistributed, TwoRanksSharingOneGpuOverNcclExitWithTwoNamingThemBeforeNcclStarts) {
  SKIP_UNLESS_GPUS(1);
  auto run =
      testing::run_ranks(2, {"train", "2", "1f1b"}, 0, 20000, std::chrono::seconds(5),
                         {{"PIPETRAIN_TEST_DEVICE", "cuda:0"}, {"PIPETRAIN_TEST_BACKEND", "nccl"}});
  EXPECT_EQ(run.result.rank_exit_codes, std::vector<int>({2, 2})) << run.output();
  EXPECT_EQ(run.count("ranks 0 and 1 both use cuda:0 on host"), 2) << run.output();
  EXPECT_LT(run.seconds, 15) << run.output();
}

// Two processes, one GPU each (cuda:LOCAL_RANK), over NCCL.
TEST(CudaDistributed, TwoRanksOnTwoGpusOverNcclMatchSequentialTraining) {
  SKIP_UNLESS_GPUS(2);
  expect_two_ranks_match_sequential_training("cuda", "nccl");
}

}  // namespace
}  // namespace pipetrain
