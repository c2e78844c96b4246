// DeferredBatchNorm: batch normalization whose running statistics are updated once per
// mini-batch, not once per micro-batch (torchgpipe's DeferredBatchNorm).
//
// In pipelined training a mini-batch of N rows runs as M micro-batches. A plain BatchNorm would
// update running_mean/running_var M times, each from a small micro-batch, and again during every
// recompute, so its running statistics drift from those of sequential training. DeferredBatchNorm
// normalizes each micro-batch with that micro-batch's own statistics (exactly what BatchNorm in
// train mode does for it), and meanwhile accumulates, per channel, the value count n, the mean
// and the sum of squared deviations M2. When the chunks-th micro-batch of the mini-batch has
// been tracked it commits:
//
//   var = M2 / n * n / (n - 1)                                       (unbiased, as BatchNorm)
//   running_mean = (1 - m) * running_mean + m * mean       (m = momentum, or 1/num_batches_tracked
//   running_var  = (1 - m) * running_var  + m * var         when momentum is unset)
//   num_batches_tracked += 1
//
// so that after a step the running statistics equal those of torch::nn::BatchNorm on the whole
// mini-batch. Forwards run while is_recomputing() (stage/skip.h) is true are not tracked.
//
// Fewer micro-batches than `chunks` (a mini-batch with fewer rows than chunks, or a splitter that
// yields fewer pieces): the count never reaches chunks, so the driver must call commit() (or
// commit_deferred_batch_norms(model)) after each step; it commits whatever was tracked and is a
// no-op when the chunks-th micro-batch already committed. pipetrain's `train` CLI does this after
// every step. A driver that neither splits evenly nor calls commit() mixes the rows of two
// mini-batches into one update: that is the limit of counting micro-batches.
//
// Tracking reads the mean and variance the micro-batch's normalization already computed (no extra
// pass over the activations) and combines them in float64 with Chan et al.'s pairwise formula
// (mean and sum of squared deviations), which stays accurate when the mean dwarfs the spread.
//
// Data-parallel replicas (runtime/distributed.h): each replica runs its share of the mini-batch,
// so chunks counts the micro-batches of every replica (M x R) and no replica commits alone. After
// the step every replica calls sum_tracked_over() with a sum over the replicas, then commit():
// all commit the statistics of the whole mini-batch, as sequential training would.
//
// Input: (N, C) or (N, C, L) like BatchNorm1d, or (N, C, H, W) like BatchNorm2d: statistics are
// per channel (dim 1) over every other dimension. Eval mode normalizes with the running statistics.
//
// Names: parameters weight, bias and buffers running_mean, running_var, num_batches_tracked, as in
// torch::nn::BatchNorm, so state dicts are interchangeable. The accumulators are not buffers.
//
// Thread-safety: one layer belongs to one pipeline stage, whose forwards run on one thread at a
// time; do not run forward on two threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

namespace pipetrain {

/// Options for DeferredBatchNorm.
///
/// Example:
/// ```
/// DeferredBatchNorm bn(DeferredBatchNormOptions(64).chunks(8).momentum(0.1));
/// ```
struct DeferredBatchNormOptions {
  /* implicit */ DeferredBatchNormOptions(int64_t num_features) : num_features_(num_features) {}
  /// Channels C (dim 1 of the input). Required.
  TORCH_ARG(int64_t, num_features);
  /// Added to the variance before the square root. Default 1e-5.
  TORCH_ARG(double, eps) = 1e-5;
  /// Weight of a mini-batch's statistics in the running average; nullopt = cumulative average
  /// (1 / number of mini-batches so far). Default 0.1.
  TORCH_ARG(std::optional<double>, momentum) = 0.1;
  /// Learnable per-channel weight (init 1) and bias (init 0). Default true.
  TORCH_ARG(bool, affine) = true;
  /// Micro-batches per mini-batch, M: statistics commit when the M-th is tracked. Default 1.
  TORCH_ARG(int64_t, chunks) = 1;
};

// Existing tensors for a DeferredBatchNorm to register as its own (shared, not copied), e.g. those
// of a TorchScript BatchNorm, so updates are seen by both. weight/bias only with affine.
struct DeferredBatchNormTensors {
  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};

class DeferredBatchNormImpl : public torch::nn::Cloneable<DeferredBatchNormImpl> {
 public:
  explicit DeferredBatchNormImpl(DeferredBatchNormOptions options);
  // Adopts `shared` instead of creating fresh tensors. clone() still makes independent copies.
  // REQUIRES: shapes (num_features) and presence (affine) match the options.
  DeferredBatchNormImpl(DeferredBatchNormOptions options, DeferredBatchNormTensors shared);

  // REQUIRES: input.dim() >= 2 and input.size(1) == num_features; in train mode, more than one
  // value per channel. Throws pipetrain::BadInput naming the shape otherwise.
  torch::Tensor forward(const torch::Tensor& input);

  // Commits the statistics tracked since the last commit, if any (see the header comment).
  void commit();

  // Micro-batches tracked since the last commit.
  int64_t tracked() const { return tracked_; }

  // What was tracked since the last commit, to put back after forwards that must leave no trace
  // (a profile: tune::ModelStateGuard).
  struct Tracked {
    torch::Tensor mean, m2;
    int64_t count = 0, microbatches = 0;
  };
  Tracked tracked_state() const { return Tracked{mean_, m2_, count_, tracked_}; }
  void restore_tracked_state(const Tracked& state);

  // Replaces what each of `norms` tracked since its last commit by its sum over data-parallel
  // replicas: `sum` must sum a float64 tensor elementwise over them in place (an all-reduce); it
  // is called twice, whatever the number of layers. Collective: every replica calls it with the
  // same layers in the same order, also one that tracked nothing.
  static void sum_tracked_over(const std::vector<DeferredBatchNormImpl*>& norms,
                               const std::function<void(torch::Tensor&)>& sum);

  void reset() override;
  void reset_running_stats();
  void pretty_print(std::ostream& stream) const override;

  DeferredBatchNormOptions options;
  torch::Tensor weight, bias;                                    // undefined unless affine
  torch::Tensor running_mean, running_var, num_batches_tracked;  // buffers

 private:
  // Adds one micro-batch of `count` values per channel, normalized with `mean` and
  // `invstd` = 1 / sqrt(biased variance + eps) (what native_batch_norm returns).
  void track(int64_t count, const torch::Tensor& mean, const torch::Tensor& invstd);

  // Consumed by the first reset() (the constructor's), so a clone gets fresh tensors.
  std::optional<DeferredBatchNormTensors> shared_;

  // Accumulators since the last commit (float64, per channel), not buffers: the mean and the
  // sum of squared deviations from it of every value tracked.
  torch::Tensor mean_, m2_;
  int64_t count_ = 0;    // values per channel seen
  int64_t tracked_ = 0;  // micro-batches seen
};
TORCH_MODULE(DeferredBatchNorm);

// A copy of `model`'s layer list where every torch::nn::BatchNorm1d/BatchNorm2d layer is replaced
// by a DeferredBatchNorm with `chunks`, the same eps/momentum/affine and copies of its weight, bias
// and running statistics, registered under the same name (so parameter names are unchanged).
// A ScriptLayer (stage/torchscript.h) wrapping a TorchScript nn.BatchNorm1d/2d is replaced by a
// DeferredBatchNorm that SHARES the jit module's tensors (so the TorchScript module sees the
// running statistics and parameter updates). Other layers are shared with `model`, not copied.
// Only direct layers are converted (not layers nested inside another module).
// REQUIRES: chunks >= 1; converted batch norms track running statistics.
torch::nn::Sequential convert_deferred_batch_norm(const torch::nn::Sequential& model,
                                                  int64_t chunks);

// Calls commit() on every DeferredBatchNorm inside `module` (itself included). Call after each
// training step when the micro-batch count can be less than chunks.
void commit_deferred_batch_norms(torch::nn::Module& module);

}  // namespace pipetrain
