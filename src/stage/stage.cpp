// One stage's forward, backward (B, or I then W) and checkpoint replay
// (include/pipetrain/stage/stage.h).
//
// Split backward, per segment k of the stage, with skips cut at their stash. A segment is a run
// of layers that ends at a layer with parameters, at a layer that stashed a skip, or at the
// stage's last layer (Linear, ReLU, Linear, ReLU: [Linear] [ReLU, Linear] [ReLU]):
//
//   forward (recorded):  in_0 -> [segment 0] -> out_0, in_1 = leaf(out_0) -> ... -> out_{K-1}
//                         each segment reads fresh leaves of the previous segment's outputs, and
//                         a tensor stashed by layer a is replaced in the skip context by a fresh
//                         leaf s' that the popping layer b reads: every segment's graph is its
//                         own, between its input leaves and its outputs (so a parameter tied
//                         between two layers gets each layer's W once)
//   I, k = K-1 .. 0:     roots = out_k and the tensors segment k stashed, with their gradients
//                        [1] g_in_k, g_s' = grad(roots, {in_k, popped leaves}, retain_graph)
//                        [2] keep (roots, gradients) of segment k for W
//                        and the gradients [1] passed into the nodes where a path to the
//                        segment's parameters leaves it (weight_gradients.h)
//   W, each k:           [3] from those kept gradients down to the params of its last layer
//                        (their own operations only), or, for params no such node serves (an
//                        embedding of token ids), grad(roots_k, params, gradients_k) -> .grad()
//
// Every autograd node belongs to exactly one segment, I runs it for the input side and W for the
// parameter side, so nothing is computed twice and the values equal a full backward's. The only
// parameters of a segment are its last layer's; a layer with many operations (a transformer
// layer: attention, MLP, norms) is one segment, and W starts from the gradients I left at each
// weight's own operation, so it does not run the layer's backward again. Segments rather than
// single layers: one autograd engine call per segment in I, not one per layer (8 x (Linear +
// ReLU): 9, not 16).
//
// Stash accounting of a CPU stage, micro-batch i (what stage.h calls stashed bytes):
//
//   forward(i):   [M1] count this thread's CPU allocations while the layers (and loss) run
//                 [M2] bytes(i) = inputs + still alive - handed over (checkpointed: outputs, loss)
//   recompute(i): [M3] bytes(i) += what the replay allocated and keeps alive
//   release(i):   stashed bytes -= bytes(i)
#include "pipetrain/stage/stage.h"
#include "pipetrain/base/message_of.h"
#include "pipetrain/stage/in_place_gradients.h"

#include <optional>
#include <unordered_set>

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include "pipetrain/base/check.h"
#include "pipetrain/stage/allocation_counter.h"
#include "pipetrain/stage/layer_call.h"
#include "pipetrain/stage/skip.h"
#include "pipetrain/stage/tensor_bytes.h"
#include "weight_gradients.h"

namespace pipetrain {

struct Stage::LayerRecord {           // one segment (the top of this file)
  size_t first = 0;                   // its first layer
  size_t last = 0;                    // its last layer: the only one with parameters
  WeightGradients weights;            // what I passed on the way to them (weight_gradients.h)
  std::vector<torch::Tensor> inputs;  // its first layer's: leaves, kept until I
  std::vector<torch::Tensor> outputs;
  std::map<std::string, torch::Tensor> popped;   // leaves the layer read from the skip context
  std::map<std::string, torch::Tensor> stashed;  // what the layer stashed (before the cut)
  std::vector<torch::Tensor> roots;              // filled by I for W
  std::vector<torch::Tensor> root_grads;
  bool awaits_weights = false;  // I ran and left W to do (the segment has parameters)
};

struct Stage::Microbatch {
  std::vector<torch::Tensor> inputs;                 // leaves
  std::map<std::string, torch::Tensor> skip_inputs;  // leaves
  std::vector<torch::Tensor> outputs;
  std::map<std::string, torch::Tensor> skip_outputs;
  torch::Tensor loss;  // weighted, last stage only
  LossHook loss_hook;
  bool checkpointed = false;
  bool recomputed = false;
  bool split = false;
  bool input_grads_done = false;
  StageRng::Snapshot rng;
  std::vector<LayerRecord> layers;
  int64_t bytes = 0;
  // Offload: the inputs (positional, then the skips in name order) while they are in host memory,
  // whether each wants a gradient, and the marker of their copy back to the device.
  std::optional<HostCopies> offloaded;
  std::vector<bool> wants_grad;
  int64_t offloaded_bytes = 0;
  ReadyMarker fetched;
};

namespace {

bool wants_grad(const torch::Tensor& t) {
  return t.defined() && (t.is_floating_point() || t.is_complex());
}

// Accumulates like autograd's AccumulateGrad: the first gradient is stored, later ones added.
void accumulate_grad(const torch::Tensor& parameter, const torch::Tensor& grad) {
  if (!grad.defined()) return;
  if (!parameter.grad().defined()) {
    parameter.mutable_grad() = grad.detach();
  } else {
    parameter.mutable_grad().add_(grad);
  }
}

// autograd::grad over the roots that carry a gradient; undefined results where nothing flows.
std::vector<torch::Tensor> grad_of(const std::vector<torch::Tensor>& roots,
                                   const std::vector<torch::Tensor>& root_grads,
                                   const std::vector<torch::Tensor>& targets, bool retain_graph) {
  std::vector<torch::Tensor> result(targets.size());
  std::vector<torch::Tensor> wanted;
  std::vector<size_t> wanted_index;
  for (size_t t = 0; t < targets.size(); ++t) {
    if (targets[t].defined() && targets[t].requires_grad()) {
      wanted.push_back(targets[t]);
      wanted_index.push_back(t);
    }
  }
  if (roots.empty() || wanted.empty()) return result;
  auto grads = torch::autograd::grad(roots, wanted, root_grads, retain_graph,
                                     /*create_graph=*/false, /*allow_unused=*/true);
  for (size_t w = 0; w < wanted.size(); ++w) result[wanted_index[w]] = grads[w];
  return result;
}

// f() with this thread's allocations counted nowhere: what the parameter hooks gather during a
// forward is the parameters' memory (ZeRO's gathered category), not the micro-batch's stash.
template <typename F>
void uncounted(F&& f) {
  AllocationCounter elsewhere;
  CountAllocations not_the_stash(elsewhere);
  f();
}

// A received gradient crossed in the wire dtype (stage/precision.h): it takes its root's dtype.
void add_root(const torch::Tensor& root, const torch::Tensor& grad,
              std::vector<torch::Tensor>& roots, std::vector<torch::Tensor>& grads) {
  if (!root.defined() || !root.requires_grad() || !grad.defined()) return;
  roots.push_back(root);
  grads.push_back(grad.scalar_type() == root.scalar_type() ? grad : grad.to(root.scalar_type()));
}

std::vector<torch::Tensor> parameters_of(const torch::nn::AnyModule& layer) {
  std::vector<torch::Tensor> result;
  for (const auto& p : layer.ptr()->parameters()) {
    if (p.requires_grad()) result.push_back(p);
  }
  return result;
}

}  // namespace

bool ends_split_segment(const torch::nn::AnyModule& layer, bool stashed) {
  return stashed || !parameters_of(layer).empty();
}

std::vector<StageLayer> slice_layers(const torch::nn::Sequential& model, int64_t first,
                                     int64_t count, const torch::Device& device) {
  const int64_t size = static_cast<int64_t>(model->size());
  PIPETRAIN_CHECK_INPUT(first >= 0 && count >= 1 && first + count <= size, "layers [", first, ", ",
                        first + count, ") are not inside the model's ", size, " layers");
  const auto named = model->named_children();
  std::vector<StageLayer> layers;
  for (int64_t l = first; l < first + count; ++l) {
    torch::nn::AnyModule module = *(model->begin() + l);
    module.ptr()->to(device);
    layers.push_back({named[static_cast<size_t>(l)].key(), module});
  }
  return layers;
}

Stage::Stage(int index, int first_layer, std::vector<StageLayer> layers, torch::Device device,
             uint64_t seed)
    : index_(index),
      first_layer_(first_layer),
      layers_(std::move(layers)),
      device_(device),
      measured_(device.is_cpu() || count_device_allocations(device)),
      rng_(seed, device) {
  TORCH_INTERNAL_ASSERT(!layers_.empty(), "stage ", index, " has no layers");
  for (const StageLayer& layer : layers_) {
    has_parameters_.push_back(!layer.module.ptr()->parameters().empty());
  }
}

void Stage::set_parameter_hooks(StageParameterHooks* hooks) {
  TORCH_INTERNAL_ASSERT(stash_.empty(), "stage ", index_,
                        " changes its parameter hooks with micro-batches stashed");
  hooks_ = hooks;
}

void Stage::acquire_segment(const LayerRecord& rec) const {
  if (!hooks_) return;
  for (size_t l = rec.last + 1; l-- > rec.first;) {
    if (has_parameters_[l]) hooks_->acquire(index_, l);
  }
}

void Stage::release_segment(const LayerRecord& rec) const {
  if (!hooks_) return;
  for (size_t l = rec.last + 1; l-- > rec.first;) {
    if (has_parameters_[l]) hooks_->release(index_, l);
  }
}

Stage::~Stage() = default;

void Stage::set_precision(Precision precision, bool last) {
  check_precision_usable(precision, device_);
  precision_ = precision;
  last_ = last;
}

std::vector<torch::Tensor> Stage::to_wire(const std::vector<torch::Tensor>& tensors) const {
  if (precision_ == Precision::kFloat32) return tensors;
  std::vector<torch::Tensor> values;
  for (const auto& t : tensors) values.push_back(t.defined() ? t.detach() : t);
  return cast_floating(values, last_ ? torch::kFloat : compute_dtype(precision_));
}

std::vector<torch::Tensor> Stage::make_leaves(const std::vector<torch::Tensor>& tensors) const {
  std::vector<torch::Tensor> leaves;
  leaves.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (!t.defined()) {
      leaves.push_back(t);
      continue;
    }
    torch::Tensor on_device = t.device() == device_ ? t : t.to(device_);
    // Stage 0 reads user data: no gradient is wanted for it (and computing one would cost a
    // matrix product per step). Later stages' float inputs are activations: they need one.
    leaves.push_back(on_device.detach().requires_grad_(index_ > 0 && wants_grad(on_device)));
  }
  return leaves;
}

void Stage::run_layers(Microbatch& state, bool record, bool recomputing, bool hooked) const {
  SkipContext context;
  context.recomputing = recomputing;
  context.pending = state.skip_inputs;
  SkipContextGuard guard(&context);
  if (record) {
    state.layers.clear();
    state.layers.emplace_back();
  }
  std::vector<torch::Tensor> values = state.inputs;
  std::optional<AutocastGuard> autocast;
  autocast.emplace(precision_, device_);
  bool segment_starts = true;  // layer l begins a segment (record)
  for (size_t l = 0; l < layers_.size(); ++l) {
    std::map<std::string, torch::Tensor> before;
    if (record) before = context.pending;
    std::vector<uint32_t> versions;
    if (record) {
      for (const auto& t : values) versions.push_back(t.defined() ? t._version() : 0);
    }
    std::vector<torch::Tensor> outputs;
    const bool hook = hooked && hooks_ && has_parameters_[l];
    try {
      if (hook) uncounted([&] { hooks_->acquire(index_, l); });
      outputs =
          call_layer(const_cast<torch::nn::AnyModule&>(layers_[l].module), layers_[l].name, values);
      if (hook) uncounted([&] { hooks_->release(index_, l); });
    } catch (const std::exception& e) {
      // The layer's own error keeps its kind (a misused skip is still BadInput); anything else
      // a layer throws is a failure at run time.
      const auto* cause = dynamic_cast<const Error*>(&e);
      throw_error(cause ? cause->kind() : ErrorKind::Runtime,
                  "layer '" + layers_[l].name + "' (layer " +
                      std::to_string(first_layer_ + static_cast<int>(l)) + " of the model)" +
                      (recomputing ? " during recompute" : "") + ": " + message_of(e));
    }
    if (record) {
      for (size_t t = 0; t < values.size(); ++t) {
        PIPETRAIN_CHECK_INPUT(
            !values[t].defined() || !values[t].requires_grad() ||
                values[t]._version() == versions[t],
            "layer '", layers_[l].name, "' modified its input ", t,
            " in place; a split backward (I/W, zero-bubble schedules) needs out-of-place "
            "layers: construct it with inplace=false");
      }
      LayerRecord& rec = state.layers.back();
      if (segment_starts) {
        rec.first = l;
        rec.inputs = values;
      }
      segment_starts = false;
      rec.last = l;
      rec.outputs = outputs;
      bool stashed = false;
      for (const auto& entry : before) {
        auto now = context.pending.find(entry.first);
        if (now == context.pending.end() || !now->second.is_same(entry.second)) {
          rec.popped.insert(entry);
        }
      }
      for (auto& entry : context.pending) {
        auto was = before.find(entry.first);
        if (was != before.end() && was->second.is_same(entry.second)) continue;
        rec.stashed.insert(entry);
        stashed = true;
        // The cut: later layers read a leaf, so this segment's graph ends at what it stashed.
        if (entry.second.defined() && entry.second.requires_grad()) {
          entry.second = entry.second.detach().requires_grad_();
        }
      }
      // The cut between segments: the next segment reads leaves, so W of a layer reaches only
      // its own use of a parameter; a parameter tied between two layers of this stage gets each
      // layer's part once, and no W walks into a graph another W has freed. A segment ends after
      // a layer with parameters (W must not walk into a later layer) and after a stash (I of the
      // stashing segment needs the gradient a later segment's pop receives).
      const bool ends = ends_split_segment(layers_[l].module, stashed);
      if (l + 1 < layers_.size() && ends) {
        for (auto& t : outputs) {
          if (t.defined() && t.requires_grad()) t = t.detach().requires_grad_();
        }
        state.layers.emplace_back();
        segment_starts = true;
      }
    }
    values = std::move(outputs);
  }
  autocast.reset();
  state.outputs = std::move(values);
  state.skip_outputs = context.pending;
  if (state.loss_hook) {
    // The loss in float32, outside autocast; its gradient reaches the outputs in their dtype.
    state.loss = state.loss_hook(precision_ == Precision::kFloat32
                                     ? state.outputs
                                     : cast_floating(state.outputs, torch::kFloat));
  }
}

int64_t Stage::input_bytes(const Microbatch& state) const {
  int64_t bytes = 0;
  for (const auto& t : state.inputs) bytes += tensor_bytes(t);
  for (const auto& entry : state.skip_inputs) bytes += tensor_bytes(entry.second);
  return bytes;
}

int64_t Stage::estimated_stash_bytes(const Microbatch& state) const {
  int64_t bytes = input_bytes(state);
  if (!state.checkpointed || state.recomputed) {
    if (state.layers.empty()) {
      for (const auto& t : state.outputs) bytes += tensor_bytes(t);
    }
    for (const auto& rec : state.layers) {
      for (const auto& t : rec.outputs) bytes += tensor_bytes(t);
    }
  }
  return bytes;
}

Bundle Stage::forward(int i, Bundle input, const StageForwardOptions& options,
                      torch::Tensor* loss_value) {
  PIPETRAIN_CHECK(stashed_count(i) == 0, ScheduleInvalid, "stage ", index_,
                  " ran the forward of micro-batch ", i,
                  " twice without its backward; check the schedule");
  auto state = std::make_unique<Microbatch>();
  const size_t skips = input.skip_names.size();
  TORCH_INTERNAL_ASSERT(input.tensors.size() >= skips);
  std::vector<torch::Tensor> positional(input.tensors.begin(), input.tensors.end() - skips);
  std::vector<torch::Tensor> skip_tensors(input.tensors.end() - skips, input.tensors.end());
  state->inputs = make_leaves(positional);
  skip_tensors = make_leaves(skip_tensors);
  for (size_t s = 0; s < skips; ++s) {
    // Skip tensors always come from an earlier stage's activations: they need gradients.
    torch::Tensor leaf = skip_tensors[s];
    if (index_ == 0 && wants_grad(leaf)) leaf.requires_grad_(true);
    state->skip_inputs[input.skip_names[s]] = leaf;
  }
  state->loss_hook = options.loss;
  state->checkpointed = options.checkpoint;
  // With hooks every backward goes by segment (stage/parameter_hooks.h).
  state->split = options.split_backward || hooks_ != nullptr;

  AllocationCounter kept;  // [M1]
  state->rng = rng_.run_forward([&] {
    std::optional<CountAllocations> counting;
    if (measures_allocations()) counting.emplace(kept);
    if (options.checkpoint) {
      torch::NoGradGuard no_grad;  // keep only the inputs; the graph is rebuilt by recompute
      run_layers(*state, /*record=*/false, /*recomputing=*/false, /*hooked=*/true);
    } else {
      run_layers(*state, /*record=*/state->split, /*recomputing=*/false, /*hooked=*/true);
    }
  });
  if (loss_value && state->loss.defined()) *loss_value = state->loss.detach();

  Bundle output;
  output.tensors = to_wire(state->outputs);
  for (const auto& entry : state->skip_outputs) {
    output.tensors.push_back(to_wire({entry.second}).front());
    output.skip_names.push_back(entry.first);
  }
  if (options.checkpoint) {
    // The outputs were made without a graph; recompute makes them again before backward.
    state->outputs.clear();
    state->skip_outputs.clear();
    state->loss = torch::Tensor();
  }
  if (measures_allocations()) {
    // [M2] What the forward allocated and is still alive, less what left with the outputs and
    // the stage no longer holds (a checkpointed micro-batch's outputs and loss: the next stage's
    // input and the caller's value). Each storage once: outputs may share one.
    int64_t handed_over = 0;
    if (options.checkpoint) {
      std::unordered_set<const void*> storages;
      std::vector<torch::Tensor> gone = output.tensors;
      if (loss_value) gone.push_back(*loss_value);
      for (const auto& t : gone) {
        if (t.defined() && t.has_storage() &&
            storages.insert(t.storage().unsafeGetStorageImpl()).second) {
          handed_over += kept.counted_bytes_of(t);
        }
      }
    }
    state->bytes = input_bytes(*state) + kept.live_bytes() - handed_over;
  } else {
    state->bytes = estimated_stash_bytes(*state);
  }
  change_stash(state->bytes);
  if (options.offload && options.checkpoint) offload(*state);
  const std::lock_guard<std::mutex> lock(bookkeeping());
  stash_.emplace(i, std::move(state));
  ++accounting_.microbatches;
  accounting_.peak_stashed_microbatches =
      std::max(accounting_.peak_stashed_microbatches, static_cast<int64_t>(stash_.size()));
  accounting_.peak_stashed_bytes = std::max(accounting_.peak_stashed_bytes, stashed_bytes_);
  return output;
}

Bundle Stage::infer(Bundle input) const {
  torch::NoGradGuard no_grad;
  Microbatch state;
  const size_t skips = input.skip_names.size();
  for (size_t t = 0; t + skips < input.tensors.size(); ++t) {
    const auto& tensor = input.tensors[t];
    state.inputs.push_back(tensor.defined() ? tensor.to(device_) : tensor);
  }
  for (size_t s = 0; s < skips; ++s) {
    const auto& tensor = input.tensors[input.tensors.size() - skips + s];
    state.skip_inputs[input.skip_names[s]] = tensor.defined() ? tensor.to(device_) : tensor;
  }
  run_layers(state, /*record=*/false, /*recomputing=*/false, /*hooked=*/false);
  Bundle output;
  output.tensors = to_wire(state.outputs);
  for (const auto& entry : state.skip_outputs) {
    output.tensors.push_back(to_wire({entry.second}).front());
    output.skip_names.push_back(entry.first);
  }
  return output;
}

Stage::Microbatch& Stage::stashed(int i, const char* action) {
  const std::lock_guard<std::mutex> lock(bookkeeping());
  auto found = stash_.find(i);
  PIPETRAIN_CHECK(found != stash_.end(), ScheduleInvalid, "stage ", index_,
                  " has no stash for micro-batch ", i, " at its ", action,
                  "; the schedule must run the forward first (and W after I)");
  return *found->second;
}

void Stage::offload(Microbatch& state) {
  std::vector<torch::Tensor> tensors = state.inputs;
  for (const auto& entry : state.skip_inputs) tensors.push_back(entry.second);
  state.wants_grad.clear();
  for (const auto& t : tensors) state.wants_grad.push_back(t.defined() && t.requires_grad());
  state.offloaded_bytes = input_bytes(state);
  state.offloaded = copy_to_host(tensors, device_);
  for (auto& t : state.inputs) t = torch::Tensor();
  for (auto& entry : state.skip_inputs) entry.second = torch::Tensor();
  if (!measures_allocations()) {
    // The estimate of a device stage's stash drops the inputs that left it.
    const int64_t before = state.bytes;
    state.bytes = estimated_stash_bytes(state);
    change_stash(state.bytes - before);
  } else if (!device_.is_cpu()) {
    // So does a GPU stage's measured figure, which counted them; a CPU stage's keeps them: they
    // are still in its memory.
    state.bytes -= state.offloaded_bytes;
    change_stash(-state.offloaded_bytes);
  }
  const std::lock_guard<std::mutex> lock(bookkeeping());
  offloaded_bytes_ += state.offloaded_bytes;
  accounting_.peak_offloaded_bytes = std::max(accounting_.peak_offloaded_bytes, offloaded_bytes_);
}

void Stage::prefetch(int i) {
  Microbatch* found = nullptr;
  {
    const std::lock_guard<std::mutex> lock(bookkeeping());
    auto at = stash_.find(i);
    if (at == stash_.end() || !at->second->offloaded) return;
    found = at->second.get();
  }
  Microbatch& state = *found;
  std::vector<torch::Tensor> back = copy_to_device(*state.offloaded, device_, state.fetched);
  state.offloaded.reset();
  // New leaves over the returned tensors: the recompute builds the graph from them.
  for (size_t t = 0; t < back.size(); ++t) {
    if (back[t].defined()) back[t] = back[t].detach().requires_grad_(state.wants_grad[t]);
  }
  size_t next = 0;
  for (auto& t : state.inputs) t = back[next++];
  for (auto& entry : state.skip_inputs) entry.second = back[next++];
  {
    const std::lock_guard<std::mutex> lock(bookkeeping());
    offloaded_bytes_ -= state.offloaded_bytes;
  }
  if (!measures_allocations()) {
    const int64_t before = state.bytes;
    state.bytes = estimated_stash_bytes(state);
    change_stash(state.bytes - before);
  } else if (!device_.is_cpu()) {
    state.bytes += state.offloaded_bytes;  // back on the GPU
    change_stash(state.offloaded_bytes);
  }
}

void Stage::recompute_if_needed(int i, Microbatch& state) {
  if (!state.checkpointed || state.recomputed) return;
  if (state.offloaded) prefetch(i);  // nobody prefetched: copy back now
  wait_ready(state.fetched, device_);
  // Replay the forward with the RNG state it started from: dropout draws the same masks, and
  // the skip context reproduces the same stashes. is_recomputing() is true meanwhile.
  AllocationCounter kept;
  rng_.run_replay(state.rng, [&] {
    std::optional<CountAllocations> counting;
    if (measures_allocations()) counting.emplace(kept);
    run_layers(state, /*record=*/state.split, /*recomputing=*/true, /*hooked=*/true);
  });
  state.recomputed = true;
  // [M3] All the replay keeps alive is held by the stage until the backward frees i.
  const int64_t before = state.bytes;
  state.bytes =
      measures_allocations() ? state.bytes + kept.live_bytes() : estimated_stash_bytes(state);
  change_stash(state.bytes - before);
  const std::lock_guard<std::mutex> lock(bookkeeping());
  accounting_.peak_stashed_bytes = std::max(accounting_.peak_stashed_bytes, stashed_bytes_);
}

void Stage::release(int i) {
  std::unique_ptr<Microbatch> freed;  // its tensors go after the lock
  const std::lock_guard<std::mutex> lock(bookkeeping());
  auto found = stash_.find(i);
  if (found == stash_.end()) return;
  if (found->second->offloaded) offloaded_bytes_ -= found->second->offloaded_bytes;
  change_stash_locked(-found->second->bytes);
  freed = std::move(found->second);
  stash_.erase(found);
}

Bundle Stage::backward(int i, const Bundle& output_grads) {
  Microbatch& state = stashed(i, "backward (B)");
  if (state.split) {
    if (hooks_) {  // segment by segment: one layer's parameters in use at a time
      PIPETRAIN_CHECK(!state.input_grads_done, ScheduleInvalid, "stage ", index_,
                      " ran B of micro-batch ", i, " after its I");
      recompute_if_needed(i, state);
      Bundle grads = backward_segments(i, state, output_grads, /*with_weights=*/true);
      release(i);
      return grads;
    }
    // Forwarded for a split backward: B is I immediately followed by W.
    Bundle grads = backward_input(i, output_grads);
    backward_weight(i);
    return grads;
  }
  recompute_if_needed(i, state);
  std::vector<torch::Tensor> roots;
  std::vector<torch::Tensor> grads;
  if (state.loss_hook) {
    PIPETRAIN_CHECK_INPUT(state.loss.defined() && state.loss.requires_grad(), "stage ", index_,
                          ": the loss of micro-batch ", i,
                          " does not require grad; does the model have trainable parameters?");
    roots.push_back(state.loss);
    grads.push_back(torch::ones_like(state.loss));
  } else {
    const size_t n = state.outputs.size();
    TORCH_INTERNAL_ASSERT(output_grads.tensors.size() == n + state.skip_outputs.size(), "stage ",
                          index_, " received ", output_grads.tensors.size(),
                          " gradients for micro-batch ", i, " but sent ",
                          n + state.skip_outputs.size(), " tensors");
    for (size_t t = 0; t < n; ++t)
      add_root(state.outputs[t], output_grads.tensors[t], roots, grads);
    size_t s = n;
    for (const auto& entry : state.skip_outputs) {
      add_root(entry.second, output_grads.tensors[s++], roots, grads);
    }
  }
  if (!roots.empty()) {
    // No hooks here: every weight's gradient is only accumulated into .grad().
    std::vector<torch::Tensor> weights;
    for (const auto& layer : layers_) {
      for (const torch::Tensor& p : parameters_of(layer.module)) weights.push_back(p);
    }
    const InPlaceGradients in_place(weights);
    torch::autograd::backward(roots, grads);
  }

  Bundle input_grads;
  for (const auto& leaf : state.inputs) {
    input_grads.tensors.push_back(leaf.defined() && leaf.requires_grad() ? leaf.grad()
                                                                         : torch::Tensor());
  }
  for (const auto& entry : state.skip_inputs) {
    input_grads.tensors.push_back(entry.second.defined() && entry.second.requires_grad()
                                      ? entry.second.grad()
                                      : torch::Tensor());
    input_grads.skip_names.push_back(entry.first);
  }
  release(i);
  return input_grads;
}

Bundle Stage::backward_input(int i, const Bundle& output_grads) {
  Microbatch& state = stashed(i, "input backward (I)");
  TORCH_INTERNAL_ASSERT(
      state.split, "stage ", index_, " got an I for micro-batch ", i,
      " whose forward was not recorded for a split backward (internal: the interpreter "
      "decides this from the schedule)");
  PIPETRAIN_CHECK(!state.input_grads_done, ScheduleInvalid, "stage ", index_,
                  " ran I of micro-batch ", i, " twice");
  recompute_if_needed(i, state);
  return backward_segments(i, state, output_grads, /*with_weights=*/false);
}

Bundle Stage::backward_segments(int i, Microbatch& state, const Bundle& output_grads,
                                bool with_weights) {
  // Gradients of the stage's outputs: from the loss on the last stage, received otherwise.
  std::vector<torch::Tensor> grads_out(state.outputs.size());
  std::map<std::string, torch::Tensor> skip_grads;
  if (state.loss_hook) {
    PIPETRAIN_CHECK_INPUT(state.loss.defined() && state.loss.requires_grad(), "stage ", index_,
                          ": the loss of micro-batch ", i, " does not require grad");
    grads_out = grad_of({state.loss}, {torch::ones_like(state.loss)}, state.outputs,
                        /*retain_graph=*/true);
  } else {
    TORCH_INTERNAL_ASSERT(
        output_grads.tensors.size() == state.outputs.size() + state.skip_outputs.size(), "stage ",
        index_, " received ", output_grads.tensors.size(), " gradients for micro-batch ", i,
        " but sent ", state.outputs.size() + state.skip_outputs.size(), " tensors");
    for (size_t t = 0; t < state.outputs.size(); ++t) grads_out[t] = output_grads.tensors[t];
    size_t s = state.outputs.size();
    for (const auto& entry : state.skip_outputs)
      skip_grads[entry.first] = output_grads.tensors[s++];
  }

  for (size_t k = state.layers.size(); k-- > 0;) {
    LayerRecord& rec = state.layers[k];
    rec.roots.clear();
    rec.root_grads.clear();
    for (size_t t = 0; t < rec.outputs.size() && t < grads_out.size(); ++t) {
      add_root(rec.outputs[t], grads_out[t], rec.roots, rec.root_grads);
    }
    for (const auto& entry : rec.stashed) {
      auto grad = skip_grads.find(entry.first);
      if (grad != skip_grads.end()) {
        add_root(entry.second, grad->second, rec.roots, rec.root_grads);
        skip_grads.erase(grad);
      }
    }
    std::vector<torch::Tensor> targets = rec.inputs;  // [1]
    for (const auto& entry : rec.popped) targets.push_back(entry.second);
    const size_t input_count = targets.size();
    const std::vector<torch::Tensor> params = parameters_of(layers_[rec.last].module);
    acquire_segment(rec);
    std::vector<torch::Tensor> grads;
    if (with_weights) {
      // I and W of the segment in one engine call: what B computes for it.
      targets.insert(targets.end(), params.begin(), params.end());
      const InPlaceGradients in_place(in_place_weights(rec.last, params));
      grads = grad_of(rec.roots, rec.root_grads, targets, /*retain_graph=*/false);
      if (!params.empty()) {
        segment_weight_gradients(
            rec, std::vector<torch::Tensor>(grads.begin() + static_cast<int64_t>(input_count),
                                            grads.end()));
      }
    } else {
      if (!params.empty()) rec.weights.capture(rec.roots, targets, params);
      grads = grad_of(rec.roots, rec.root_grads, targets, /*retain_graph=*/true);
      rec.weights.stop_capturing();
    }
    release_segment(rec);
    grads_out.assign(grads.begin(), grads.begin() + static_cast<int64_t>(rec.inputs.size()));
    size_t p = rec.inputs.size();
    for (const auto& entry : rec.popped) skip_grads[entry.first] = grads[p++];
    if (params.empty() || with_weights) {
      rec = LayerRecord{};  // no W for this segment: free what it kept now
    } else {
      rec.inputs.clear();  // [2] W needs only the roots and their gradients
      rec.popped.clear();
      rec.awaits_weights = true;
    }
  }

  Bundle input_grads;
  input_grads.tensors = grads_out;
  input_grads.tensors.resize(state.inputs.size());
  for (const auto& entry : state.skip_inputs) {
    auto grad = skip_grads.find(entry.first);
    input_grads.tensors.push_back(grad != skip_grads.end() ? grad->second : torch::Tensor());
    input_grads.skip_names.push_back(entry.first);
  }
  state.input_grads_done = true;
  state.inputs.clear();
  state.skip_inputs.clear();
  state.outputs.clear();
  state.skip_outputs.clear();
  return input_grads;
}

void Stage::segment_weight_gradients(const LayerRecord& rec,
                                     std::vector<torch::Tensor> grads) const {
  const std::vector<torch::Tensor> params = parameters_of(layers_[rec.last].module);
  grads.resize(params.size());
  if (hooks_) hooks_->gradients(index_, rec.last, params, grads);
  for (size_t p = 0; p < params.size(); ++p) accumulate_grad(params[p], grads[p]);
}

std::vector<torch::Tensor> Stage::in_place_weights(size_t l,
                                                   const std::vector<torch::Tensor>& params) const {
  if (!hooks_) return params;
  std::vector<torch::Tensor> kept;
  for (const torch::Tensor& p : params) {
    if (!hooks_->takes_gradient(index_, l, p)) kept.push_back(p);
  }
  return kept;
}

void Stage::backward_weight(int i) {
  Microbatch& state = stashed(i, "weight backward (W)");
  PIPETRAIN_CHECK(state.input_grads_done, ScheduleInvalid, "stage ", index_,
                  " got W of micro-batch ", i, " before its I; a schedule must run I before W");
  for (size_t k = 0; k < state.layers.size(); ++k) {
    LayerRecord& rec = state.layers[k];
    if (!rec.awaits_weights) continue;
    const std::vector<torch::Tensor> params = parameters_of(layers_[rec.last].module);
    acquire_segment(rec);
    std::vector<torch::Tensor> grads;
    if (!rec.roots.empty()) {
      const InPlaceGradients in_place(in_place_weights(rec.last, params));
      grads = rec.weights.compute(rec.roots, rec.root_grads, params);  // [3]
    }
    segment_weight_gradients(rec, std::move(grads));
    release_segment(rec);
    rec = LayerRecord{};
  }
  release(i);
}

void Stage::clear() {
  const std::lock_guard<std::mutex> lock(bookkeeping());
  stash_.clear();
  offloaded_bytes_ = 0;
  change_stash_locked(-stashed_bytes_);
}

std::mutex& Stage::bookkeeping() {
  static std::mutex mutex;
  return mutex;
}

void Stage::change_stash(int64_t delta) {
  const std::lock_guard<std::mutex> lock(bookkeeping());
  change_stash_locked(delta);
}

void Stage::change_stash_locked(int64_t delta) {
  stashed_bytes_ += delta;
  if (rank_stash_) rank_stash_->add(delta);
}

int64_t Stage::stashed_count(int i) const {
  const std::lock_guard<std::mutex> lock(bookkeeping());
  return static_cast<int64_t>(stash_.count(i));
}

int64_t Stage::stashed_microbatches() const {
  const std::lock_guard<std::mutex> lock(bookkeeping());
  return static_cast<int64_t>(stash_.size());
}

StageAccounting Stage::accounting() const {
  const std::lock_guard<std::mutex> lock(bookkeeping());
  return accounting_;
}

void Stage::reset_accounting() {
  const std::lock_guard<std::mutex> lock(bookkeeping());
  accounting_ = StageAccounting{};
  accounting_.peak_stashed_microbatches = static_cast<int64_t>(stash_.size());
  accounting_.peak_stashed_bytes = stashed_bytes_;
  accounting_.peak_offloaded_bytes = offloaded_bytes_;
}

}  // namespace pipetrain
