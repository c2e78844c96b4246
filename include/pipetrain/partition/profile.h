// ModelProfile: what the planner knows about a model, layer by layer, at a few micro-batch sizes.
//
// Torch-free data. The profiler (profiler.h) fills it from a torch::nn::Sequential; tests and the
// planner's benchmark build synthetic ones by hand. Saved and loaded as JSON (to_json/from_json)
// so that a profile taken once can be planned against many times.
//
//   layers[l].costs[p]   the cost of layer l at micro-batch size microbatch_sizes[p]
//   layer_cost(l, b)     the cost at any b: piecewise-linear in b between the measured sizes,
//                        linear extrapolation outside (times clamped at >= 0); bytes are linear in
//                        b
//
// Thread-safety: a plain value; safe to copy and to read from many threads.
// REQUIRES: microbatch_sizes ascending and non-empty; every layer has one cost per size
// (validate() checks both and throws pipetrain::BadInput naming the layer).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace pipetrain::partition {

// Cost of one layer for one micro-batch.
struct LayerCost {
  double forward_seconds = 0;
  double backward_seconds = 0;         // full backward: input and weight gradients
  double backward_input_seconds = 0;   // input gradient only (zero-bubble I)
  double backward_weight_seconds = 0;  // weight gradients only (zero-bubble W)
  // Bytes the forward keeps alive until the backward (saved tensors and the output), measured as
  // the net growth of the allocator while the layer runs in a chain (profiler.h says how).
  std::int64_t activation_bytes = 0;
  // The same as a split backward (zero-bubble I and W) records the layer: its graph stays until W,
  // and the record keeps the input of each segment's first layer (stage.cpp: a segment ends after
  // a layer with parameters or a stash), even where autograd would have freed it. Measured in a
  // chain of the whole model, so a layer counts as a segment's first where the layer before it
  // has parameters or stashed a skip. Profiles saved before this field existed read
  // activation_bytes.
  std::int64_t split_activation_bytes = 0;
  // The same for the layer as the first of a stage, whose input the stage keeps: equal to
  // split_activation_bytes where the layer begins a segment anyway. Profiles saved before this
  // field existed read split_activation_bytes (which then kept every layer's input).
  std::int64_t split_first_activation_bytes = 0;
  // What crosses a stage boundary after this layer: its output and the skips in flight there
  // (stashed by this or an earlier layer, popped by a later one).
  std::int64_t output_bytes = 0;
};

struct LayerProfile {
  std::string name;
  std::int64_t parameter_bytes = 0;
  // Of parameter_bytes: the float32 parameters the model reads only through autocast's casts
  // (stage/autocast_parameters.h, decided over the whole model), which ZeRO-3 under bf16 may
  // all-gather narrowed (MemoryModelOptions::cast_gathers).
  std::int64_t cast_parameter_bytes = 0;
  // Each parameter's bytes in the layer's parameters() order, whether another layer of the model
  // uses it too (a tied weight), and whether it counts in cast_parameter_bytes: what ZeRO's
  // layout cuts into buckets and keeps apart (MemoryModelOptions::zero_policy). Empty (a profile
  // written before they were recorded): one parameter of parameter_bytes, this layer's alone.
  std::vector<std::int64_t> parameter_sizes;
  std::vector<bool> shared_parameters;
  std::vector<bool> cast_parameters;
  // Which are a mixture's routed experts (parallel::is_expert_parameter), which expert
  // parallelism shards over their own replicas (MemoryModelOptions::expert_parallel). Empty: none.
  std::vector<bool> expert_parameters;
  // One optimizer update of this layer's parameters (p -= lr * g), once per training step.
  double update_seconds = 0;
  std::vector<LayerCost> costs;  // one per ModelProfile::microbatch_sizes
};

// Time to move `bytes` from one rank to the next: latency + bytes / bandwidth. Besides that
// wire time, a message costs the sending rank message_seconds of its own time (packing and
// posting it; 0 in-process), charged to the action that sends it.
struct TransferModel {
  double latency_seconds = 0;
  double bytes_per_second = std::numeric_limits<double>::infinity();
  double message_seconds = 0;
  std::string method;  // how the figures were obtained ("memcpy + thread handoff", "given", ...)

  double seconds(std::int64_t bytes) const;
};

struct ModelProfile {
  std::int64_t batch_size = 0;                 // the mini-batch the plan is for
  std::vector<std::int64_t> microbatch_sizes;  // ascending: the sizes that were measured
  std::vector<std::int64_t> input_bytes;       // the model input's bytes, per measured size
  std::vector<LayerProfile> layers;
  TransferModel transfer;
  int intra_op_threads = 1;  // threads each measurement ran with
  // What the runtime adds per layer to every F, B, I and W beyond the isolated layer's time
  // (bookkeeping, colder caches); calibrated against a real step (pipetrain plan --calibrate),
  // 0 when not calibrated.
  double per_layer_overhead_seconds = 0;
  // per_layer_overhead_seconds, split_backward_scale and concurrent_compute_scale came from a
  // calibration run (pipetrain plan --calibrate or --verify).
  bool calibrated = false;
  // Measured split backward (I + W) over the profile's I + W, from the same calibration (the
  // runtime keeps per-layer graphs for W); 1 when not calibrated.
  double split_backward_scale = 1;
  // A rank's compute time while all ranks compute at once (they share caches and memory
  // bandwidth) over its time alone; the planner multiplies F, B, I and W by it for plans of more
  // than one rank. Calibrated with concurrent_ranks ranks; 1 when not calibrated.
  double concurrent_compute_scale = 1;
  int concurrent_ranks = 1;
  // Measured on K processes (pipetrain plan --processes, the auto plan of a multi-process run):
  // the ranks' compute over the prediction, at the micro-batch sizes it was measured at
  // (ascending, distinct); it multiplies concurrent_compute_scale in plans of more than one rank,
  // linear in log(size) between the sizes, the nearest size's value outside. Empty: 1.
  std::vector<std::pair<std::int64_t, double>> process_compute_scale;
  // Measured with the above, per layer: how much slower (> 1) or faster than the whole model's
  // process_compute_scale the layers of each rank of the even balance computed (the rank's
  // measured over predicted compute, over all ranks'); it multiplies that layer's F, B, I and W
  // in plans of more than one rank. Empty: 1 for every layer.
  std::vector<double> process_layer_scale;
  // Measured on K processes with the above: what a step of more than one rank takes beyond the
  // simulated schedule and the update (the loss broadcast, the step's setup, ranks starting
  // apart); the planner adds it to the step time of plans of more than one rank. 0: not measured.
  double step_overhead_seconds = 0;
  // Step [5], a confirmation run of the planner's best plans and the hand-written default
  // together (recommend_measured, planner.h): the median of their measured over predicted step
  // times. The planner multiplies the step time of plans of measured_step_scale_ranks ranks by it
  // (the bound it prunes with too). 1 and 0: not measured.
  double measured_step_scale = 1;
  int measured_step_scale_ranks = 0;
  std::string method;  // how activation bytes were measured ("allocator", "output bytes")
  // What the layers ran in: "fp32", or "bf16" (under autocast: ProfileOptions::precision). Plans
  // made from the profile are measured in it (tune/calibration.h).
  std::string precision = "fp32";

  std::int64_t num_layers() const { return static_cast<std::int64_t>(layers.size()); }
  // Cost of layer l for one micro-batch of `microbatch_size` samples (interpolated).
  LayerCost layer_cost(std::int64_t l, std::int64_t microbatch_size) const;
  // Bytes of the model input for one micro-batch (linear in the size).
  std::int64_t input_bytes_at(std::int64_t microbatch_size) const;
  // process_compute_scale at `microbatch_size` (1 when empty).
  double process_compute_scale_at(std::int64_t microbatch_size) const;
  std::int64_t parameter_bytes() const;

  // Throws pipetrain::BadInput naming the offending layer or size.
  void validate() const;
};

void to_json(nlohmann::json& out, const ModelProfile& profile);
void from_json(const nlohmann::json& in, ModelProfile& profile);

// A profile of `layers` identical layers, for tests and benchmarks: each layer has the given
// forward/backward time (per sample, plus a fixed part), parameter and activation bytes.
struct UniformLayer {
  double forward_seconds_per_sample = 1e-6;
  double backward_seconds_per_sample = 2e-6;
  std::int64_t parameter_bytes = 1 << 20;
  std::int64_t activation_bytes_per_sample = 4096;
  std::int64_t output_bytes_per_sample = 1024;
};
ModelProfile uniform_profile(std::int64_t layers, std::int64_t batch_size,
                             const UniformLayer& layer);

}  // namespace pipetrain::partition
