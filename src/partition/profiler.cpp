// Profiler (profiler.h): per-layer timing, allocator-based activation bytes, hand-off latency.
#include "pipetrain/partition/profiler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <c10/core/Allocator.h>
#include <torch/torch.h>

#include "pipetrain/base/check.h"
#include "pipetrain/base/median.h"
#include "pipetrain/base/message_of.h"
#include "pipetrain/parallel/expert_parallel.h"
#include "pipetrain/stage/allocation_counter.h"
#include "pipetrain/stage/autocast_parameters.h"
#include "pipetrain/stage/device.h"
#include "pipetrain/stage/skip.h"
#include "pipetrain/stage/stage.h"
#include "pipetrain/stage/tensor_bytes.h"

namespace pipetrain::partition {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Median over trials of the time per call of `body` on `device`: wall-clock on the CPU, CUDA
// events on a GPU (stage/device.h), one call at a time until the trial lasted min_trial_seconds.
double time_call(const ProfileOptions& options, const torch::Device& device,
                 const std::function<void()>& body) {
  for (int w = 0; w < options.warmup(); ++w) body();
  std::vector<double> trials;
  for (int t = 0; t < std::max(options.repeats(), 1); ++t) {
    int calls = 0;
    double elapsed = 0;
    do {
      elapsed += time_on_device(device, 1, body);
      ++calls;
    } while (elapsed < options.min_trial_seconds());
    trials.push_back(elapsed / calls);
  }
  return median(trials);
}

// Restores the thread's intra-op thread count on scope exit.
struct ThreadCountGuard {
  int saved = at::get_num_threads();
  explicit ThreadCountGuard(int threads) {
    if (threads > 0) at::set_num_threads(threads);
  }
  ~ThreadCountGuard() { at::set_num_threads(saved); }
};

std::vector<std::int64_t> default_sizes(std::int64_t batch, int max_sizes) {
  std::vector<std::int64_t> sizes;
  for (std::int64_t m = 1; m <= batch; m *= 2) {
    if (batch % m == 0) sizes.push_back(batch / m);
  }
  if (sizes.back() != 1) sizes.push_back(1);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  if (max_sizes >= 2 && static_cast<int>(sizes.size()) > max_sizes) {
    // Keep the ends and spread the rest evenly (in log scale, since the sizes are powers of 2).
    std::vector<std::int64_t> kept;
    const double step = static_cast<double>(sizes.size() - 1) / (max_sizes - 1);
    for (int k = 0; k < max_sizes; ++k) {
      kept.push_back(sizes[static_cast<std::size_t>(std::llround(k * step))]);
    }
    kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
    sizes = kept;
  }
  return sizes;
}

// Runs layer l on x with `skips` as the thread's skip context (stage/skip.h): stash layers add to
// it, pop layers take from it. A timed trial passes a copy, so every trial sees the same skips.
torch::Tensor run_layer(torch::nn::AnyModule& layer, std::size_t l, const torch::Tensor& x,
                        SkipContext& skips) {
  SkipContextGuard guard(&skips);
  try {
    return layer.forward<torch::Tensor>(x);
  } catch (const std::exception& e) {
    throw BadInput(c10::str("profile_sequential: layer ", l, " (", layer.ptr()->name(),
                            ") failed on an input of shape ", x.sizes(), ": ", message_of(e),
                            " (every layer must map one tensor to one tensor)"));
  }
}

// "torch::nn::LinearImpl" -> "Linear".
std::string short_name(std::string name) {
  const auto colon = name.rfind("::");
  if (colon != std::string::npos) name = name.substr(colon + 2);
  if (name.size() > 4 && name.compare(name.size() - 4, 4, "Impl") == 0)
    name.resize(name.size() - 4);
  return name;
}

std::vector<torch::nn::AnyModule*> layers_of(torch::nn::Sequential& model) {
  std::vector<torch::nn::AnyModule*> layers;
  for (auto& layer : *model) layers.push_back(&layer);
  return layers;
}

// The chain's output from one run without a graph, under the stage's autocast. On a GPU the first
// run is also a warm-up: the first kernels on a stream make what the caching allocator then keeps
// for good (cuBLAS's workspace: 33 MiB on an H200, where it made a Linear's 64 MiB read 97 MiB),
// so chained_activation_bytes counts activations only once one such run has happened.
torch::Tensor run_chain(const std::vector<torch::nn::AnyModule*>& layers,
                        const torch::Tensor& input, Precision precision, SkipContext& skips) {
  torch::NoGradGuard no_grad;
  const AutocastGuard autocast(precision, input.device());
  torch::Tensor x = input.clone();  // an in-place first layer must not change the caller's batch
  for (std::size_t l = 0; l < layers.size(); ++l) x = run_layer(*layers[l], l, x, skips);
  return x;
}

// Which layer inputs a chain keeps referenced, besides what autograd saves.
enum class Keep {
  kNone,      // a chain as a plain forward keeps it
  kSegments,  // the input of each segment's first layer, as a split backward's record (stage.cpp)
  kAll,       // every layer's input (each layer as the first of a stage)
};

// Activation bytes per layer from one chained run under the allocation counter; *seen tells whether
// the counter saw any allocation at all.
std::vector<std::int64_t> chained_activation_bytes(const std::vector<torch::nn::AnyModule*>& layers,
                                                   const torch::Tensor& microbatch, bool* seen,
                                                   Keep keep, Precision precision,
                                                   bool input_wants_grad = false) {
  ThreadCountGuard one_thread(1);
  // One autocast region around the chain, as a stage has around its layers.
  const torch::Device device = microbatch.device();
  const AutocastGuard autocast(precision, device);
  AllocationCounter counter;  // stage/allocation_counter.h: what the stages measure with
  // Live bytes: this thread's CPU allocations, or the GPU's caching allocator on a CUDA device.
  auto live = [&] {
    return device.is_cpu() ? counter.live_bytes() : device_allocated_bytes(device);
  };
  std::vector<std::int64_t> bytes;
  *seen = false;
  {
    CountAllocations guard(counter);
    const std::int64_t before = live();
    // The input is allocated under the counter too, so every free it sees it also saw
    // allocated. Like the first stage's data it wants no gradient: a layer saves what the input's
    // gradient needs only when that is wanted (under bf16 a Linear's bfloat16 weight copy, which a
    // later layer keeps because its input comes with a graph).
    torch::Tensor x = microbatch.clone();
    if (input_wants_grad && x.is_floating_point()) x.requires_grad_(true);
    // The first stage keeps its input as a leaf for the whole step: a layer that drops its last
    // view (a Flatten's output, once the next layer has run) frees nothing.
    const torch::Tensor model_input = x;
    *seen = live() > before;
    std::int64_t previous = live();
    SkipContext skips;  // skips in flight count as kept by the layer that stashed them
    std::vector<torch::Tensor> kept;
    bool segment_starts = true;
    for (std::size_t l = 0; l < layers.size(); ++l) {
      if (keep == Keep::kAll || (keep == Keep::kSegments && segment_starts)) kept.push_back(x);
      // [1] y's graph keeps the saved tensors; [2] dropping our handle on x frees it unless the
      // graph saved it. The net growth is what this layer adds to the stash.
      const std::map<std::string, torch::Tensor> before = skips.pending;
      x = run_layer(*layers[l], l, x, skips);
      bool stashed = false;
      for (const auto& [name, tensor] : skips.pending) {
        auto was = before.find(name);
        stashed = stashed || was == before.end() || !was->second.is_same(tensor);
      }
      segment_starts = ends_split_segment(*layers[l], stashed);
      bytes.push_back(live() - previous);
      previous = live();
    }
  }
  return bytes;
}

}  // namespace

namespace {

// Parameter bytes and the update time (zero_grad() and an SGD step) of layer l.
LayerProfile parameter_profile(std::size_t l, torch::nn::AnyModule& layer,
                               const ProfileOptions& options) {
  LayerProfile profile;
  profile.name = std::to_string(l) + ":" + short_name(layer.ptr()->name());
  std::vector<torch::Tensor> params;
  for (const auto& p : layer.ptr()->parameters()) {
    profile.parameter_bytes += tensor_bytes(p);
    if (p.requires_grad()) params.push_back(p);
  }
  if (!params.empty()) {
    std::vector<torch::Tensor> grads;
    for (const auto& p : params) grads.push_back(torch::zeros_like(p));
    torch::NoGradGuard no_grad;
    // One pass over the gradients, one over the parameters.
    profile.update_seconds = time_call(options, params.front().device(), [&] {
      for (std::size_t q = 0; q < params.size(); ++q) {
        grads[q].zero_();
        params[q].add_(grads[q], -1e-3);
      }
    });
  }
  return profile;
}

// B, I and W of the layer that made `y` from `leaf`.
void time_backward(const torch::Tensor& y, const torch::Tensor& leaf, bool needs_input_grad,
                   torch::nn::AnyModule& layer, const ProfileOptions& options, LayerCost& cost) {
  std::vector<torch::Tensor> params;
  for (const auto& p : layer.ptr()->parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  if (!y.requires_grad()) return;
  const torch::Tensor g = torch::randn_like(y);
  auto grad_of = [&](const std::vector<torch::Tensor>& wrt) {
    return time_call(options, y.device(), [&] {
      (void)torch::autograd::grad({y}, wrt, {g}, /*retain_graph=*/true,
                                  /*create_graph=*/false, /*allow_unused=*/true);
    });
  };
  // B as the runtime runs it: backward() accumulating into .grad (an add per parameter for every
  // micro-batch after the first).
  if (needs_input_grad || !params.empty()) {
    std::vector<torch::Tensor> saved;  // the caller's gradients, put back afterwards
    for (auto& p : params) saved.push_back(p.grad());
    cost.backward_seconds = time_call(
        options, y.device(), [&] { torch::autograd::backward({y}, {g}, /*retain_graph=*/true); });
    for (std::size_t q = 0; q < params.size(); ++q) params[q].mutable_grad() = saved[q];
  }
  if (needs_input_grad) cost.backward_input_seconds = grad_of({leaf});
  if (!params.empty()) cost.backward_weight_seconds = grad_of(params);
}

// Every layer's costs at one micro-batch size (`input`'s rows), appended to profile.layers[l];
// returns whether the allocation counter saw the activations.
bool profile_microbatch(const std::vector<torch::nn::AnyModule*>& layers,
                        const torch::Tensor& input, const ProfileOptions& options,
                        ModelProfile& profile) {
  profile.input_bytes.push_back(tensor_bytes(input));
  const Precision precision = options.precision();
  bool seen = false;
  const std::vector<std::int64_t> chained =
      chained_activation_bytes(layers, input, &seen, Keep::kNone, precision);
  bool split_seen = false;
  const std::vector<std::int64_t> split =
      chained_activation_bytes(layers, input, &split_seen, Keep::kSegments, precision);
  const std::vector<std::int64_t> split_first =
      chained_activation_bytes(layers, input, &split_seen, Keep::kAll, precision);
  const AutocastGuard autocast(precision, input.device());
  torch::Tensor x = input;
  SkipContext skips;  // the skips in flight before layer l, in the chained pass
  for (std::size_t l = 0; l < layers.size(); ++l) {
    torch::Tensor leaf = x.detach();
    // The first stage's input is data: nobody needs its gradient.
    const bool needs_input_grad = l > 0 && leaf.is_floating_point();
    leaf.requires_grad_(needs_input_grad);
    LayerCost cost;
    cost.forward_seconds = time_call(options, leaf.device(), [&] {
      SkipContext trial = skips;
      (void)run_layer(*layers[l], l, leaf, trial);
    });
    torch::Tensor y = run_layer(*layers[l], l, leaf, skips);
    // Skips in flight become leaves like the layer input: a later pop layer's backward then stops
    // at them instead of running the earlier layers' backward again.
    for (auto& entry : skips.pending) {
      entry.second = entry.second.detach().requires_grad_(entry.second.is_floating_point());
    }
    // What crosses a stage boundary: the output and the skips in flight (stashed, not yet
    // popped: a later stage's pop layer needs them), in the wire dtype (stage.cpp's to_wire).
    auto wire_bytes = [&](const torch::Tensor& t) -> std::int64_t {
      return precision != Precision::kFloat32 && t.is_floating_point()
                 ? t.numel() * static_cast<std::int64_t>(c10::elementSize(compute_dtype(precision)))
                 : tensor_bytes(t);
    };
    const std::int64_t own_output = wire_bytes(y);
    cost.output_bytes = own_output;
    for (const auto& entry : skips.pending) cost.output_bytes += wire_bytes(entry.second);
    cost.activation_bytes = seen ? chained[l] : own_output;
    cost.split_activation_bytes = seen ? split[l] : own_output;
    cost.split_first_activation_bytes = seen ? split_first[l] : own_output;
    time_backward(y, leaf, needs_input_grad, *layers[l], options, cost);
    profile.layers[l].costs.push_back(cost);
    x = y.detach();
  }
  return seen;
}

}  // namespace

ModelProfile profile_sequential(torch::nn::Sequential& model, const torch::Tensor& sample_batch,
                                const ProfileOptions& options) {
  PIPETRAIN_CHECK_INPUT(
      sample_batch.defined() && sample_batch.dim() >= 1 && sample_batch.size(0) >= 1,
      "profile_sequential: the sample batch needs at least one row (got ",
      sample_batch.defined() ? sample_batch.sizes() : at::IntArrayRef{},
      "); pass a batch shaped like the training input");
  PIPETRAIN_CHECK_INPUT(!model->is_empty(),
                        "profile_sequential: the Sequential has no layers; add some");
  ThreadCountGuard threads(options.intra_op_threads());

  ModelProfile profile;
  profile.batch_size = sample_batch.size(0);
  profile.intra_op_threads = at::get_num_threads();
  profile.precision = to_string(options.precision());
  profile.microbatch_sizes = options.microbatch_sizes().empty()
                                 ? default_sizes(profile.batch_size, options.max_sizes())
                                 : options.microbatch_sizes();
  std::sort(profile.microbatch_sizes.begin(), profile.microbatch_sizes.end());
  profile.microbatch_sizes.erase(
      std::unique(profile.microbatch_sizes.begin(), profile.microbatch_sizes.end()),
      profile.microbatch_sizes.end());
  for (std::int64_t b : profile.microbatch_sizes) {
    PIPETRAIN_CHECK_INPUT(b >= 1 && b <= profile.batch_size,
                          "profile_sequential: micro-batch size ", b, " is outside 1..",
                          profile.batch_size, " (the sample batch's rows)");
  }
  for (const auto& parameter : model->named_parameters()) {
    PIPETRAIN_CHECK_INPUT(
        parameter.value().device() == sample_batch.device(), "profile_sequential: parameter ",
        parameter.key(), " is on ", parameter.value().device().str(), " but the sample batch on ",
        sample_batch.device().str(), "; move the model and the batch to the device to profile on");
  }
  check_device_usable(sample_batch.device());
  const std::vector<torch::nn::AnyModule*> layers = layers_of(model);
  // Which parameters autocast alone reads is decided over the whole model: a weight tied to a
  // layer that reads it in float32 does not qualify in any layer.
  const std::set<const void*> narrowable = narrowable_parameters(*model);
  std::map<const void*, int> users;  // layers using each parameter tensor
  for (const auto* layer : layers) {
    for (const auto& p : layer->ptr()->parameters()) ++users[p.unsafeGetTensorImpl()];
  }
  for (std::size_t l = 0; l < layers.size(); ++l) {
    profile.layers.push_back(parameter_profile(l, *layers[l], options));
    LayerProfile& layer = profile.layers.back();
    bool experts = false;
    for (const auto& item : layers[l]->ptr()->named_parameters()) {
      const torch::Tensor& p = item.value();
      const bool cast = narrowable.count(p.unsafeGetTensorImpl()) > 0;
      if (cast) layer.cast_parameter_bytes += tensor_bytes(p);
      layer.parameter_sizes.push_back(tensor_bytes(p));
      layer.shared_parameters.push_back(users[p.unsafeGetTensorImpl()] > 1);
      layer.cast_parameters.push_back(cast);
      layer.expert_parameters.push_back(parallel::is_expert_parameter("." + item.key()));
      experts = experts || layer.expert_parameters.back();
    }
    if (!experts) layer.expert_parameters.clear();
  }
  if (!sample_batch.device().is_cpu()) {
    SkipContext skips;
    (void)run_chain(layers, sample_batch.narrow(0, 0, profile.microbatch_sizes.front()),
                    options.precision(), skips);  // the GPU warm-up (run_chain)
  }
  bool allocator_seen = true;
  for (std::int64_t b : profile.microbatch_sizes) {
    const torch::Tensor input = sample_batch.narrow(0, 0, b).contiguous();
    allocator_seen = profile_microbatch(layers, input, options, profile) && allocator_seen;
  }
  profile.method = allocator_seen ? "allocator" : "output bytes";
  if (options.measure_transfer()) {
    profile.transfer = measure_local_transfer();
  } else {
    profile.transfer.method = "not measured (zero cost)";
  }
  profile.validate();
  return profile;
}

StageChain profile_stage_chain(torch::nn::Sequential& model, std::int64_t first, std::int64_t end,
                               const torch::Tensor& input, Precision precision) {
  const std::vector<torch::nn::AnyModule*> all = layers_of(model);
  PIPETRAIN_CHECK_INPUT(first >= 0 && first < end && end <= static_cast<std::int64_t>(all.size()),
                        "profile_stage_chain: layers [", first, ", ", end, ") are not within the ",
                        all.size(), " layers of the model");
  const std::vector<torch::nn::AnyModule*> layers(all.begin() + first, all.begin() + end);
  StageChain chain;
  // What the stage hands on: its output in the wire dtype (stage.cpp's to_wire). Run first, it is
  // also the GPU warm-up the byte counts below need (run_chain).
  SkipContext skips;
  const torch::Tensor x = run_chain(layers, input, precision, skips);
  chain.skips_in_flight = !skips.pending.empty();
  bool seen = false;
  chain.activation_bytes = chained_activation_bytes(layers, input, &seen, Keep::kNone, precision,
                                                    /*input_wants_grad=*/first > 0);
  // The stage's own segments: its first layer begins one, as in the stage.
  chain.split_activation_bytes = chained_activation_bytes(
      layers, input, &seen, Keep::kSegments, precision, /*input_wants_grad=*/first > 0);
  chain.output = precision != Precision::kFloat32 && x.is_floating_point()
                     ? x.to(compute_dtype(precision))
                     : x;
  return chain;
}

TransferModel measure_local_transfer(int repeats) {
  std::mutex mutex;
  std::condition_variable changed;
  int turn = 0;  // even: ping's turn, odd: pong's
  constexpr int kRounds = 200;
  std::vector<double> trials;
  for (int t = 0; t < std::max(repeats, 1); ++t) {
    turn = 0;
    std::thread pong([&] {
      for (int k = 0; k < kRounds; ++k) {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return turn % 2 == 1; });
        ++turn;
        changed.notify_all();
      }
    });
    const auto start = Clock::now();
    for (int k = 0; k < kRounds; ++k) {
      std::unique_lock<std::mutex> lock(mutex);
      ++turn;
      changed.notify_all();
      changed.wait(lock, [&] { return turn % 2 == 0; });
    }
    trials.push_back(seconds_since(start) / (2.0 * kRounds));
    pong.join();
  }
  TransferModel model;
  model.latency_seconds = median(trials);
  model.method = "in-process hand-off, no copy (condition-variable ping-pong, one way)";
  return model;
}

}  // namespace pipetrain::partition
