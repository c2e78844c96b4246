// Profiler: measures a torch::nn::Sequential layer by layer on the sample batch's device (the CPU
// or a GPU; the model's parameters must be there too) and returns a ModelProfile (profile.h) for
// the planner.
//
// Per layer l and per micro-batch size b (the first b rows of the sample batch), with the
// layer's real input (the previous layer's output):
//   forward   layer(x) with autograd recording, x a leaf that requires grad (l > 0)
//   backward  torch::autograd::backward(y, g), accumulating into .grad as the runtime's B does
//             (g random, graph retained; the caller's gradients are restored afterwards)
//   I         torch::autograd::grad(y, {x}, g)                  input gradient only
//   W         torch::autograd::grad(y, params, g)               weight gradients only
//   update    zero_grad + SGD: grad.zero_(), p -= lr * grad for each parameter
// Each figure is the median of `repeats` trials after `warmup` untimed runs; a trial loops until
// it lasted min_trial_seconds and reports the time per iteration (small layers run in µs). Each
// call is timed with stage/device.h's time_on_device: the wall clock on the CPU, CUDA events on a
// GPU (what the GPU spent: a host clock around asynchronous kernels reads the launch alone).
//
// Activation bytes: the layers run once as a chain (each output fed to the next, our handle on
// the previous output dropped, autograd recording) while a c10 MemoryReportingInfoBase hook
// counts every CPU allocation and free of this thread. A layer's activation bytes = the net
// growth across it: its saved tensors and output, minus its input when nothing keeps that. A
// stage's stash is then its input plus the sum over its layers (memory.h). Exact for what the
// default CPU allocator hands out; blind to allocations made on other threads (the chain runs
// with one intra-op thread) and to memory outside the allocator. When the hook sees nothing
// (allocator not reporting) the profile falls back to "output bytes": the sum of each layer's
// output sizes, method says which. On a GPU the live bytes are the caching allocator's allocated
// bytes of that device (device_allocated_bytes: every thread's, blocks rounded to 512 bytes).
//
// Thread-safety: profile_sequential runs the model; do not train it meanwhile. It temporarily
// sets this thread's intra-op thread count (restored on return).
// REQUIRES: every layer maps one tensor to one tensor; the sample batch has >= 1 row; the model's
// parameters are on the sample batch's device (pipetrain::BadInput naming the parameter).
#pragma once

#include <cstdint>
#include <vector>

#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include "pipetrain/partition/profile.h"
#include "pipetrain/stage/precision.h"

namespace pipetrain::partition {

struct ProfileOptions {
  /// Micro-batch sizes to measure. Empty: powers of two dividing the batch and the batch itself,
  /// thinned to at most max_sizes (smallest and largest kept).
  TORCH_ARG(std::vector<std::int64_t>, microbatch_sizes) = {};
  TORCH_ARG(int, max_sizes) = 6;
  /// Untimed runs before the timed trials.
  TORCH_ARG(int, warmup) = 2;
  /// Timed trials; the median is kept.
  TORCH_ARG(int, repeats) = 7;
  /// A trial repeats the measured call until it took at least this long.
  TORCH_ARG(double, min_trial_seconds) = 2e-4;
  /// Intra-op threads while timing: what each stage's worker will use. 0 = leave as is.
  TORCH_ARG(int, intra_op_threads) = 0;
  /// Measure the in-process hand-off (thread wake-up) as the transfer model.
  TORCH_ARG(bool, measure_transfer) = true;
  /// Mixed precision of the stages: with bf16 every layer runs under autocast (timings and
  /// activation bytes as a bf16 stage has them) and output_bytes is what crosses a stage boundary
  /// in bfloat16. The model input stays as given (a first stage reads user data uncast).
  TORCH_ARG(Precision, precision) = Precision::kFloat32;
};

/// Example:
///   torch::nn::Sequential mlp(torch::nn::Linear(784, 512), torch::nn::ReLU(),
///                             torch::nn::Linear(512, 10));
///   auto profile = profile_sequential(mlp, torch::randn({256, 784}));
ModelProfile profile_sequential(torch::nn::Sequential& model, const torch::Tensor& sample_batch,
                                const ProfileOptions& options = {});

// In-process transport between stages on one CPU: tensors are handed over without a copy, so a
// transfer costs a thread wake-up (measured by a condition-variable ping-pong, median of
// `repeats` x 200 round trips, halved). bytes_per_second is infinite.
TransferModel measure_local_transfer(int repeats = 5);

// Layers [first, end) of `model` measured as one stage whose input is `input` (the data for the
// first stage, else the previous stage's output in the wire dtype, a leaf that wants a gradient):
// per layer, the bytes each keeps as a chain and as a split backward's record (LayerCost's
// activation_bytes and split_activation_bytes; the first layer's split figure is its
// split_first_activation_bytes), and the stage's output in the wire dtype (the
// next stage's input). Under bf16 a stage's first layers see bfloat16 where profile_sequential's
// whole-model chain feeds them what the previous layer made (float32 after a GPT block), which
// changes what they keep. `skips_in_flight`: the stage stashed skips it did not pop (then the
// next stage's chain lacks them; use the whole-model profile).
struct StageChain {
  std::vector<std::int64_t> activation_bytes;
  std::vector<std::int64_t> split_activation_bytes;
  torch::Tensor output;
  bool skips_in_flight = false;
};
StageChain profile_stage_chain(torch::nn::Sequential& model, std::int64_t first, std::int64_t end,
                               const torch::Tensor& input, Precision precision);

}  // namespace pipetrain::partition
