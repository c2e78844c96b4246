// Stage: a contiguous slice of a Sequential's layers on one device, and everything it keeps per
// micro-batch between that micro-batch's forward and its backward.
//
// Per micro-batch i the stage stashes (see docs/RUNTIME.md, "Stash lifetime"):
//   - its inputs, as autograd leaves (received activations and skips; float tensors require grad),
//   - unless checkpointed: its outputs and the autograd graph between, and for a split backward
//     (I then W) each layer's inputs and outputs,
//   - when checkpointed: only the inputs and the RNG snapshot of the forward; the forward is
//     replayed (recompute) right before the first backward action of i. With offload
//     (StageForwardOptions::offload) those inputs wait in pinned host memory instead, copied on
//     the device's copy stream; prefetch(i) starts the copy back, and the recompute waits for it
//     on the stage's stream (it starts the copy itself when nobody prefetched). On a CPU stage
//     nothing moves: the inputs stay where they are and still count as stashed.
// Everything of i is freed when its backward is complete: after B, or after W for a split one.
//
// Stashed bytes (StageAccounting) are what the stage keeps for micro-batch i, measured:
//   bytes of i's inputs (and received skips)
//   + bytes of CPU memory i's forward allocated that are still alive when it returns: the tensors
//     autograd saved for backward (a Linear's input, a ReLU's result, ...), the outputs, the
//     per-segment record of a split backward, the loss (stage/allocation_counter.h)
//   - what a checkpointed micro-batch hands over without keeping (its outputs and loss)
//   + after a recompute, everything the replay allocated and keeps alive.
// The figure is taken when the forward (or the recompute) returns and given back when the
// backward frees i; an I that frees part of i early does not lower it. On a non-CPU device (CUDA's
// caching allocator cannot be wrapped this way) it is an estimate instead: inputs + outputs (or
// each segment's outputs for a split backward), which misses what autograd saved inside the stage.
//
// Backward modes:
//   B  backward(i, grads): one autograd pass; parameter gradients accumulate into .grad().
//   I  backward_input(i, grads): input gradients only, segment by segment from the last, keeping
//      each segment's output gradient g_k (autograd::grad(out_k, in_k, g_k, retain_graph)). A
//      segment is a run of layers ending at one with parameters, at a stash, or at the stage's
//      end (stage.cpp), so its only parameters are its last layer's.
//   W  backward_weight(i): parameter gradients only, per segment from the kept g_k
//      (autograd::grad(out_k, params_k, g_k)), accumulated into .grad(). I + W compute exactly
//      what B computes, nothing twice. A micro-batch whose backward will be split must be
//      forwarded with `split_backward` (the per-segment record is made during the forward).
// With parameter hooks (set_parameter_hooks, stage/parameter_hooks.h: ZeRO by layer) every
// training forward is recorded so, and B runs segment by segment from the last, each segment's
// input and weight gradients in one engine call; the hooks hear of every use of a layer's
// parameters and take its weight gradients.
//
// Skips (stage/skip.h): a SkipContext per (stage, micro-batch) is installed around the forward
// and the recompute. Names stashed and not popped by the end of the stage leave with the
// outputs (Bundle::skip_names); received skips are leaves put into the context.
//
// Precision (stage/precision.h): with bf16 the layers run under autocast; what a stage hands on
// (outputs and skips) are values cast to bfloat16, and a gradient it receives is cast to the dtype
// of the output it belongs to, so the autograd graph inside a stage keeps its own dtypes while
// both directions cross in half the bytes. The last stage computes the loss in float32.
//
// Thread-safety: one worker thread drives a stage during a step, except that a forward and a
// backward (B or I) of different micro-batches may run at once (PipeOptions::
// overlap_expert_exchanges): the stash map and the byte counters are kept under one lock.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include "pipetrain/stage/device.h"
#include "pipetrain/stage/parameter_hooks.h"
#include "pipetrain/stage/precision.h"
#include "pipetrain/stage/stage_rng.h"
#include "pipetrain/transport/transport.h"

namespace pipetrain {

// One layer of a stage: its name in the Sequential and the module.
struct StageLayer {
  std::string name;
  torch::nn::AnyModule module;
};

// Layers [first, first + count) of `model`, named as in the Sequential, moved to `device`.
// (How the Pipe, and a one-rank-per-process launcher, build a stage from a model and a balance.)
// Throws pipetrain::BadInput naming the range when it does not fit the model.
std::vector<StageLayer> slice_layers(const torch::nn::Sequential& model, int64_t first,
                                     int64_t count, const torch::Device& device);

// Turns the last stage's outputs into the micro-batch's loss, already weighted
// (rows of i / rows of the mini-batch). Kept with the micro-batch so a recompute recomputes it.
using LossHook = std::function<torch::Tensor(const std::vector<torch::Tensor>& outputs)>;

// Whether a split backward's segment (the top of stage.cpp) ends after `layer`: the layer has
// parameters that want a gradient, or it stashed a skip. The profiler measures the same segments
// (partition/profiler.h, split_activation_bytes).
bool ends_split_segment(const torch::nn::AnyModule& layer, bool stashed);

struct StageForwardOptions {
  bool checkpoint = false;      // keep only the inputs; recompute before the backward
  bool split_backward = false;  // the backward of this micro-batch will be I + W
  bool offload = false;         // with checkpoint: the inputs wait in host memory (see the top)
  LossHook loss;                // set on the last stage in training; empty elsewhere
};

// The stashed bytes of every stage one rank runs, together, and their peak: a rank holding
// several stages (interleaved schedules) holds their sum, whose peak is not the sum of the
// stages' peaks. Shared by the rank's stages (Stage::set_rank_stash), updated on the rank's
// thread.
struct RankStash {
  int64_t bytes = 0;
  int64_t peak = 0;
  void add(int64_t delta) {
    bytes += delta;
    peak = std::max(peak, bytes);
  }
  // The peak of a new step starts from what is held now.
  void restart_peak() { peak = bytes; }
};

// Memory accounting of the stage since the last reset_accounting().
struct StageAccounting {
  int64_t peak_stashed_microbatches = 0;  // most micro-batches held at once
  int64_t peak_stashed_bytes = 0;         // most stashed bytes at once (see the top comment)
  int64_t microbatches = 0;               // forwards run
  // Most bytes of stashed inputs held in host memory at once (offload). On a CPU stage they never
  // left the stage's memory: counted here and in the stash alike.
  int64_t peak_offloaded_bytes = 0;
};

class Stage {
 public:
  // `first_layer` is the index of layers[0] in the whole model (for error messages).
  // REQUIRES: !layers.empty(); the layers' parameters already live on `device`.
  Stage(int index, int first_layer, std::vector<StageLayer> layers, torch::Device device,
        uint64_t seed);
  ~Stage();
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;

  // Mixed precision (default fp32). `last`: this is the model's last stage (it hands float32 to
  // the loss and the caller). Throws BadInput for fp16 on a CPU stage.
  void set_precision(Precision precision, bool last);
  Precision precision() const { return precision_; }

  int index() const { return index_; }
  const torch::Device& device() const { return device_; }
  const std::vector<StageLayer>& layers() const { return layers_; }

  // Training forward of micro-batch i. Returns what to send to the next stage (outputs and the
  // skips in flight). With options.loss, `loss_value` receives the detached weighted loss.
  // REQUIRES: micro-batch i is not stashed already.
  Bundle forward(int i, Bundle input, const StageForwardOptions& options,
                 torch::Tensor* loss_value = nullptr);

  // Inference forward: no grad, no stash, no checkpoint, the default RNG.
  Bundle infer(Bundle input) const;

  // B: full backward. `output_grads` matches the Bundle forward() returned (ignored on the last
  // stage, whose root is the loss). Returns the gradients of the inputs, in the input Bundle's
  // order (undefined where none). Frees micro-batch i.
  Bundle backward(int i, const Bundle& output_grads);
  // I: input gradients only; keeps what W needs.
  Bundle backward_input(int i, const Bundle& output_grads);
  // W: parameter gradients of micro-batch i (after its I). Frees micro-batch i.
  void backward_weight(int i);
  // Starts bringing micro-batch i's offloaded inputs back to the device, so that the copy overlaps
  // the work queued before its backward. No-op unless i is stashed with its inputs offloaded.
  void prefetch(int i);
  // Bytes of stashed inputs in host memory now (offload).
  int64_t offloaded_bytes() const { return offloaded_bytes_; }

  // From the next forward on, tells `hooks` around every use of a layer's parameters and hands it
  // each micro-batch's weight gradients (stage/parameter_hooks.h): every training forward is then
  // recorded for a split backward and B runs segment by segment. Null: off. `hooks` must outlive
  // the steps. REQUIRES: nothing stashed.
  void set_parameter_hooks(StageParameterHooks* hooks);

  // Drops every stash (after a failed step).
  void clear();
  int64_t stashed_microbatches() const;
  // Stashed bytes held now (see the top comment); 0 when nothing is stashed.
  int64_t stashed_bytes() const { return stashed_bytes_; }

  StageAccounting accounting() const;
  void reset_accounting();
  // Adds this stage's stashed bytes to `rank`'s from now on (those of the stages of one rank).
  void set_rank_stash(std::shared_ptr<RankStash> rank) { rank_stash_ = std::move(rank); }
  StageRng& rng() { return rng_; }

 private:
  struct LayerRecord;
  struct Microbatch;

  // `hooked`: call hooks_ around each layer with parameters (training only).
  void run_layers(Microbatch& state, bool record, bool recomputing, bool hooked) const;
  // I of every segment from the last (`with_weights`: and W of each right after its I, the
  // hooks' B); returns the input gradients.
  Bundle backward_segments(int i, Microbatch& state, const Bundle& output_grads, bool with_weights);
  // W of one segment: its weights' gradients, through the hooks, into .grad().
  void segment_weight_gradients(const LayerRecord& rec, std::vector<torch::Tensor> grads) const;
  // Of layer l's `params`, those whose gradients may go into .grad() from inside the backward
  // (stage/in_place_gradients.h): all without hooks, else those the hooks do not take.
  std::vector<torch::Tensor> in_place_weights(size_t l,
                                              const std::vector<torch::Tensor>& params) const;
  // hooks_->acquire / release of the layers of a segment that have parameters.
  void acquire_segment(const LayerRecord& rec) const;
  void release_segment(const LayerRecord& rec) const;
  void recompute_if_needed(int i, Microbatch& state);
  Microbatch& stashed(int i, const char* action);
  void release(int i);
  void offload(Microbatch& state);
  // stashed_bytes_ += delta, and the rank's (the _locked one under bookkeeping()).
  void change_stash(int64_t delta);
  void change_stash_locked(int64_t delta);
  int64_t stashed_count(int i) const;
  // One lock for every stage's stash map and counters (and the rank's, which stages share): a
  // forward and a backward of other micro-batches may run together (overlap_expert_exchanges).
  static std::mutex& bookkeeping();
  // Whether micro-batches' stashes are measured (a CPU stage, or a GPU one whose allocations are
  // counted: count_device_allocations) rather than estimated from the tensors the stage holds.
  bool measures_allocations() const { return measured_; }
  int64_t input_bytes(const Microbatch& state) const;
  int64_t estimated_stash_bytes(const Microbatch& state) const;
  std::vector<torch::Tensor> make_leaves(const std::vector<torch::Tensor>& tensors) const;

  // What this stage hands on: its outputs as values in the wire dtype (the last stage: float32
  // for the loss and the caller).
  std::vector<torch::Tensor> to_wire(const std::vector<torch::Tensor>& tensors) const;

  int index_;
  int first_layer_;
  Precision precision_ = Precision::kFloat32;
  bool last_ = false;
  std::vector<StageLayer> layers_;
  torch::Device device_;
  bool measured_ = false;  // measures_allocations()
  StageRng rng_;
  std::map<int, std::unique_ptr<Microbatch>> stash_;  // by micro-batch i
  StageAccounting accounting_;
  int64_t stashed_bytes_ = 0;
  int64_t offloaded_bytes_ = 0;
  std::shared_ptr<RankStash> rank_stash_;  // null: not shared
  StageParameterHooks* hooks_ = nullptr;
  std::vector<char> has_parameters_;  // per layer: it holds parameters (the hooks' layers)
};

}  // namespace pipetrain
