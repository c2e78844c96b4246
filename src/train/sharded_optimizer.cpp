// ZeRO stages 1, 2 and 3 and the offload (pipetrain/train/sharded_optimizer.h): the options, the
// layout (segments, slices, what the inner optimizer steps), [3] the step and the wiring into a
// pipe. The gradients ([1], [2], streaming) are in sharded_optimizer_gradients.cpp, stage 3's
// gathers in sharded_optimizer_gather.cpp, checkpoints and holdings in
// sharded_optimizer_state.cpp. [n] cite the header's steps.
#include "pipetrain/train/sharded_optimizer.h"

#include <malloc.h>
#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include "pipetrain/base/check.h"
#include "pipetrain/runtime/distributed_pipe.h"
#include "pipetrain/runtime/gradient_reducer.h"
#include "pipetrain/stage/autocast_parameters.h"
#include "pipetrain/stage/precision.h"
#include "pipetrain/stage/tensor_bytes.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain::train {
namespace {

// A tensor of its own over `length` elements of p's storage from `offset` (p contiguous): what
// the inner optimizer steps at stages 1 and 2, writing the parameter itself.
torch::Tensor alias_of(const torch::Tensor& p, int64_t offset, int64_t length) {
  return torch::empty({0}, p.options().requires_grad(false))
      .set_(p.storage(), p.storage_offset() + offset, {length}, {1});
}

}  // namespace

const char* to_string(ZeroGradients gradients) {
  return gradients == ZeroGradients::kStream ? "stream" : "accumulate";
}

const char* to_string(ZeroUnit unit) {
  return unit == ZeroUnit::kLayer ? "layer" : "stage";
}

ZeroGradients parse_zero_gradients(const std::string& text) {
  if (text == "stream") return ZeroGradients::kStream;
  if (text == "accumulate") return ZeroGradients::kAccumulate;
  throw BadInput("--zero-gradients must be stream or accumulate, got '" + text + "'");
}

ZeroUnit parse_zero_unit(const std::string& text) {
  if (text == "layer") return ZeroUnit::kLayer;
  if (text == "stage") return ZeroUnit::kStage;
  throw BadInput("--zero3-unit must be layer or stage, got '" + text + "'");
}

void check_zero_options(const ZeroOptions& zero) {
  const int stage = zero.stage();
  check_reshard_after_forward(zero.reshard_after_forward(), stage);
  PIPETRAIN_CHECK_INPUT(zero.prefetch_bytes() >= 0,
                        "--zero3-prefetch must be 0 or more bytes, got ", zero.prefetch_bytes());
  PIPETRAIN_CHECK_INPUT(zero.max_live_bytes() >= 0,
                        "--zero3-max-live must be 0 (no bound) or more bytes, got ",
                        zero.max_live_bytes());
  PIPETRAIN_CHECK_INPUT(zero.max_reuse_distance() >= -1,
                        "--zero3-max-reuse-distance must be -1 (free after every use) or 0 or "
                        "more bytes, got ",
                        zero.max_reuse_distance());
  PIPETRAIN_CHECK_INPUT(zero.persistence_threshold() >= 0,
                        "--zero3-persistence-threshold must be 0 or more bytes, got ",
                        zero.persistence_threshold());
  check_zero_plus_plus(zero, 0);
}

bool gathers_by_layer(const ZeroOptions& zero) {
  return zero.stage() == 3 && zero.unit() == ZeroUnit::kLayer && !zero.reshard_after_forward();
}

bool streams_gradients(const ZeroOptions& zero) {
  return zero.stage() >= 2 && zero.gradients() == ZeroGradients::kStream;
}

partition::ZeroMemoryPolicy zero_memory_policy(const ZeroOptions& zero, const PipeOptions& pipe) {
  partition::ZeroMemoryPolicy policy;
  policy.stream = zero.gradients() == ZeroGradients::kStream;
  policy.by_layer = zero.unit() == ZeroUnit::kLayer;
  policy.overlap = pipe.overlap_gradient_reduction();
  policy.bucket_bytes = pipe.bucket_bytes();
  policy.units = {zero.prefetch_bytes(), zero.max_live_bytes(), zero.max_reuse_distance()};
  policy.persistence_threshold = zero.persistence_threshold();
  return policy;
}

ShardedOptimizer::ShardedOptimizer(
    Distributed* distributed, std::vector<torch::Tensor> parameters,
    const std::vector<torch::Tensor>& counted, const std::string& optimizer,
    const OptimizerOptions& options, const ZeroOptions& zero,
    const std::vector<std::vector<torch::Tensor>>& segments, std::vector<int> segment_stages,
    const std::vector<torch::ScalarType>& segment_gather_dtypes, std::vector<int> segment_layers,
    const std::vector<char>& segment_accumulates, const std::vector<char>& segment_experts)
    : distributed_(distributed),
      rank_(distributed ? distributed->rank() : 0),
      parameters_(unique_parameters(parameters)),
      replicas_(distributed ? distributed->layout().replicas : 1),
      replica_(distributed ? distributed->replica() : 0),
      name_(optimizer),
      stage_(zero.stage()),
      offload_(zero.offload()),
      zero_(zero) {
  const int stage = stage_;
  PIPETRAIN_CHECK_INPUT(stage >= 1 && stage <= 3, "ZeRO stage must be 1, 2 or 3 (got ", stage, ")");
  PIPETRAIN_CHECK_INPUT(!parameters_.empty(), "ZeRO: rank ", rank_, " has no parameters to shard");
  const torch::ScalarType dtype = parameters_.front().scalar_type();
  const torch::Device device = parameters_.front().device();
  PIPETRAIN_CHECK_INPUT(device.is_cpu() || device.is_cuda(),
                        "ZeRO shards parameters on the CPU or a CUDA device; rank ", rank_,
                        " holds them on ", device);
  aliased_ = stage < 3 && !offload_;
  std::map<const void*, size_t> index;
  for (size_t q = 0; q < parameters_.size(); ++q) {
    const torch::Tensor& p = parameters_[q];
    PIPETRAIN_CHECK_INPUT(p.scalar_type() == dtype && p.is_floating_point() && p.device() == device,
                          "ZeRO shards parameters of one floating dtype on one device; rank ",
                          rank_, " holds ", p.scalar_type(), " on ", p.device(), " beside ", dtype,
                          " on ", device);
    // Stage 3 frees each parameter's storage: it must hold that parameter and nothing else.
    PIPETRAIN_CHECK_INPUT(
        stage != 3 || (p.is_contiguous() && p.storage_offset() == 0 &&
                       static_cast<int64_t>(p.storage().nbytes()) == tensor_bytes(p)),
        "ZeRO-3 frees each parameter's storage between uses, and a parameter of "
        "rank ",
        rank_, " (shape ", p.sizes(),
        ") shares its storage with other tensors (a view); give every "
        "parameter storage of its own, or use --zero 2");
    // Stages 1 and 2 step slices of each parameter's storage in place.
    PIPETRAIN_CHECK_INPUT(!aliased_ || p.is_contiguous(),
                          "ZeRO steps slices of each parameter in "
                          "place, and a parameter of rank ",
                          rank_, " (shape ", p.sizes(), ") is not contiguous");
    index[p.unsafeGetTensorImpl()] = q;
    total_ += p.numel();
  }
  // The segments' parameters, each once, all of them.
  std::vector<std::vector<size_t>> groups;
  if (segments.empty()) {
    groups.emplace_back();
    for (size_t q = 0; q < parameters_.size(); ++q) groups.back().push_back(q);
  } else {
    std::set<size_t> placed;
    for (const auto& segment : segments) {
      std::vector<size_t> group;
      for (const torch::Tensor& p : segment) {
        auto found = index.find(p.unsafeGetTensorImpl());
        PIPETRAIN_CHECK_INPUT(found != index.end() && placed.insert(found->second).second,
                              "ZeRO segments: a tensor that is not one of the parameters, or in "
                              "two segments");
        group.push_back(found->second);
      }
      groups.push_back(std::move(group));
    }
    PIPETRAIN_CHECK_INPUT(placed.size() == parameters_.size(), "ZeRO segments hold ", placed.size(),
                          " of the ", parameters_.size(), " parameters");
  }
  PIPETRAIN_CHECK_INPUT(
      segment_gather_dtypes.empty() || segment_gather_dtypes.size() == groups.size(),
      "ZeRO: ", segment_gather_dtypes.size(), " gather dtypes for ", groups.size(), " segments");
  PIPETRAIN_CHECK_INPUT(segment_stages.empty() || segment_stages.size() == groups.size(),
                        "ZeRO: ", segment_stages.size(), " segment stages for ", groups.size(),
                        " segments");
  PIPETRAIN_CHECK_INPUT(segment_layers.empty() || segment_layers.size() == groups.size(),
                        "ZeRO: ", segment_layers.size(), " segment layers for ", groups.size(),
                        " segments");
  PIPETRAIN_CHECK_INPUT(segment_accumulates.empty() || segment_accumulates.size() == groups.size(),
                        "ZeRO: ", segment_accumulates.size(), " accumulate flags for ",
                        groups.size(), " segments");
  PIPETRAIN_CHECK_INPUT(segment_experts.empty() || segment_experts.size() == groups.size(),
                        "ZeRO: ", segment_experts.size(), " expert flags for ", groups.size(),
                        " segments");
  std::set<const void*> counts;
  for (const torch::Tensor& c : counted) counts.insert(c.unsafeGetTensorImpl());
  offsets_.assign(parameters_.size(), 0);
  for (auto& group : groups) {
    const size_t k = segments_.size();
    Segment segment;
    segment.gather_dtype = segment_gather_dtypes.empty() ? dtype : segment_gather_dtypes[k];
    PIPETRAIN_CHECK_INPUT(c10::isFloatingType(segment.gather_dtype) &&
                              c10::elementSize(segment.gather_dtype) <= c10::elementSize(dtype),
                          "ZeRO: segment ", k, " would gather in ", segment.gather_dtype,
                          "; a floating dtype no wider than the parameters' ", dtype, " is needed");
    segment.stage = segment_stages.empty() ? -1 : segment_stages[k];
    segment.layer = segment_layers.empty() ? -1 : segment_layers[k];
    segment.parameters = std::move(group);
    segment.start = flat_size_;
    int64_t elements = 0;
    for (size_t q : segment.parameters) {
      offsets_[q] = segment.start + elements;
      elements += parameters_[q].numel();
    }
    // Its group: the data-parallel replicas, or an expert segment's replicas holding the same
    // experts.
    const bool expert = !segment_experts.empty() && segment_experts[k];
    segment.group = this->group();
    segment.members = replicas_;
    segment.member = replica_;
    if (expert) {
      PIPETRAIN_CHECK_INPUT(distributed_ != nullptr, "ZeRO: expert segments need a Distributed");
      segment.group = distributed_->expert_data_parallel_group().get();
      segment.members = segment.group ? segment.group->size() : 1;
      segment.member = segment.group ? segment.group->rank() : 0;
    }
    segment.piece = (elements + segment.members - 1) / segment.members;
    segment.padded = segment.piece * segment.members;
    segment.shard_offset = shard_size_;
    // This replica's piece, parameter by parameter.
    segment.first_slice = slices_.size();
    const int64_t piece_start = segment.start + segment.member * segment.piece;
    for (size_t q : segment.parameters) {
      const int64_t lo = std::max(offsets_[q], piece_start);
      const int64_t hi =
          std::min(offsets_[q] + parameters_[q].numel(), piece_start + segment.piece);
      if (hi <= lo) continue;
      slices_.push_back(Slice{q, lo - offsets_[q], segment.shard_offset + lo - piece_start, hi - lo,
                              counts.count(parameters_[q].unsafeGetTensorImpl()) > 0});
    }
    segment.end_slice = slices_.size();
    flat_size_ += segment.padded;
    shard_size_ += segment.piece;
    segments_.push_back(std::move(segment));
  }
  gathers_.resize(segments_.size());
  for (const torch::Tensor& p : parameters_) whole_bytes_ += tensor_bytes(p);
  peak_whole_bytes_ = whole_bytes_;

  // Which segments stream their gradients and gather by layer: those of a layer (the others are
  // the persistent ones), where the options ask for it.
  const bool layers = std::any_of(segments_.begin(), segments_.end(),
                                  [](const Segment& s) { return s.layer >= 0; });
  streams_ = layers && streams_gradients(zero);
  by_layer_ = layers && gathers_by_layer(zero);
  for (size_t k = 0; k < segments_.size(); ++k) {
    Segment& s = segments_[k];
    if (s.layer < 0) {
      persistent_.push_back(k);
      continue;
    }
    s.streamed = streams_ && (segment_accumulates.empty() || !segment_accumulates[k]);
    if (s.streamed) streamed_of_layer_[{s.stage, s.layer}].push_back(k);
    if (!by_layer_) continue;
    auto [found, fresh] =
        unit_of_layer_.emplace(std::make_pair(s.stage, s.layer), static_cast<int>(units_.size()));
    if (fresh) units_.push_back(Unit{s.stage, s.layer, {}, 0});
    Unit& unit = units_[static_cast<size_t>(found->second)];
    unit.segments.push_back(k);
    unit.bytes += s.padded * static_cast<int64_t>(c10::elementSize(dtype));
  }
  // The plan numbers a rank's units by stage, then layer (schedule/unit_residency.h).
  std::sort(units_.begin(), units_.end(), [](const Unit& a, const Unit& b) {
    return std::tie(a.stage, a.layer) < std::tie(b.stage, b.layer);
  });
  for (size_t u = 0; u < units_.size(); ++u) {
    unit_of_layer_[{units_[u].stage, units_[u].layer}] = static_cast<int>(u);
  }
  use_of_unit_.assign(units_.size(), 0);

  // Under NCCL the collectives take the device's tensors; Gloo's run on host buffers. Without
  // replicas nothing is communicated: the "collectives" (copies) run where the shard lives, so
  // that an offloaded rank builds its buffers on the host, not on the device.
  const torch::Device state_device = offload_ ? torch::Device(torch::kCPU) : device;
  comm_device_ = group() == nullptr ? state_device : group()->collective_device(device);
  // Offloaded from a GPU the reductions land where the collectives run and are then copied to
  // the host shard. On CPU stages `cpu` takes that path too (a copy apart: how the GPU's path is
  // exercised without one); under nvme, where host memory is the point, nothing is staged: no
  // second shard-sized gradient while a step accumulates, no copy of the shard for the gathers.
  staged_ =
      comm_device_ != state_device || (offload_ && (device.is_cuda() || !zero.offload_to_nvme()));

  torch::NoGradGuard no_grad;
  // The shard and its gradient: in pinned host memory when offloaded from a GPU, so that the
  // copies to and from the device can run without a staging buffer.
  const auto options_of = torch::TensorOptions()
                              .dtype(dtype)
                              .device(state_device)
                              .pinned_memory(offload_ && device.is_cuda());
  PIPETRAIN_CHECK_INPUT(!zero.offload_to_nvme() || offload_,
                        "ZeRO: the optimizer state goes to files (nvme) only with the offload on");
  params_in_file_ = zero.offload_params_to_nvme();
  PIPETRAIN_CHECK_INPUT(!params_in_file_ || (stage == 3 && zero.offload_to_nvme()),
                        "--offload-params nvme puts ZeRO-3's parameter shards in the offload "
                        "files: it needs --zero 3 and --offload-optimizer nvme (got --zero ",
                        stage, zero.offload_to_nvme() ? "" : " without the optimizer in files",
                        ")");
  // The inner optimizer steps one slice at a time (its temporaries are a slice's, not the
  // shard's): aliases of the parameters (aliased_) or of the shard; with the shard in the file,
  // placeholders (meta tensors) that name the slices, stepped from the file's buffers.
  if (!aliased_ && !params_in_file_) shard_ = torch::zeros({shard_size_}, options_of);
  for (const Slice& s : slices_) {
    parts_.push_back(
        aliased_ ? alias_of(parameters_[s.parameter], s.parameter_offset, s.length)
        : params_in_file_
            ? torch::empty({s.length}, torch::TensorOptions().dtype(dtype).device(torch::kMeta))
            : alias_of(shard_, s.shard_offset, s.length));
  }
  grads_in_file_ = params_in_file_ && !staged_;
  if (!(aliased_ && stage == 1) && !grads_in_file_) {
    shard_grad_ = torch::zeros({shard_size_}, options_of);
  }
  inner_ = make_optimizer(name_, parts_, options);
  state_options_ = options_of;
  std::vector<std::string> fields = state_fields();
  if (params_in_file_) {
    values_field_ = fields.size();
    fields.push_back("values");
  }
  if (grads_in_file_) {
    grads_field_ = fields.size();
    fields.push_back("grads");
    grad_written_.assign(segments_.size(), 0);
  }
  if (zero.offload_to_nvme() && !fields.empty()) {
    state_file_ =
        std::make_unique<OptimizerStateFile>(zero.nvme(), fields, shard_size_, dtype,
                                             "pipetrain-optimizer-rank" + std::to_string(rank_));
    file_steps_.assign(parts_.size(), 0);
    if (grads_in_file_) state_file_->read_only_in_step(grads_field_);
  } else {
    place_state(options_of);
  }
  PIPETRAIN_CHECK_INPUT(!zero.initial_values() || (stage == 3 && device.is_cpu()),
                        "ZeRO: values on demand (ZeroOptions::initial_values) are written into "
                        "stage 3's shard from CPU parameters; rank ",
                        rank_, " holds its parameters on ", device, " at stage ", stage);
  values_on_demand_ = static_cast<bool>(zero.initial_values());
  secondary_.resize(segments_.size());
  gathered_this_step_.assign(segments_.size(), 0);
  load_shard();
  make_zero_plus_plus_groups();
}

void ShardedOptimizer::for_each_slice_in(
    int64_t first, int64_t end, const std::function<void(size_t, int64_t, int64_t)>& f) const {
  // The first slice ending after `first` (slices_ is in shard order).
  auto it = std::upper_bound(slices_.begin(), slices_.end(), first, [](int64_t at, const Slice& s) {
    return at < s.shard_offset + s.length;
  });
  for (; it != slices_.end() && it->shard_offset < end; ++it) {
    const int64_t lo = std::max(it->shard_offset, first);
    const int64_t hi = std::min(it->shard_offset + it->length, end);
    if (hi > lo) f(static_cast<size_t>(it - slices_.begin()), lo, hi);
  }
}

std::vector<std::string> ShardedOptimizer::state_fields() const {
  if (name_ == "sgd") {
    const auto& group =
        static_cast<const torch::optim::SGDOptions&>(inner_->param_groups().front().options());
    if (group.momentum() == 0 || group.dampening() != 0) return {};
    return {"momentum_buffer"};
  }
  return {"exp_avg", "exp_avg_sq"};
}

std::vector<torch::Tensor> ShardedOptimizer::place_state(const torch::TensorOptions& options) {
  // The state the inner optimizer would make at its first step (zeros; SGD's momentum buffer is
  // then the gradient itself, as 0 x momentum + gradient), made now as slices of one buffer per
  // field: two shard-sized blocks instead of a small one per slice among the step's temporaries.
  torch::NoGradGuard no_grad;
  auto& states = inner_->state();
  std::vector<torch::Tensor> fields;
  if (name_ == "sgd") {
    const auto& group =
        static_cast<const torch::optim::SGDOptions&>(inner_->param_groups().front().options());
    if (group.momentum() == 0 || group.dampening() != 0) return fields;
    fields.push_back(torch::zeros({shard_size_}, options));
    for (size_t i = 0; i < parts_.size(); ++i) {
      auto state = std::make_unique<torch::optim::SGDParamState>();
      state->momentum_buffer(fields[0].narrow(0, slices_[i].shard_offset, slices_[i].length));
      states[parts_[i].unsafeGetTensorImpl()] = std::move(state);
    }
    return fields;
  }
  const torch::Tensor exp_avg = torch::zeros({shard_size_}, options);
  const torch::Tensor exp_avg_sq = torch::zeros({shard_size_}, options);
  for (size_t i = 0; i < parts_.size(); ++i) {
    const Slice& s = slices_[i];
    auto place = [&](auto state) {
      state->step(0);
      state->exp_avg(exp_avg.narrow(0, s.shard_offset, s.length));
      state->exp_avg_sq(exp_avg_sq.narrow(0, s.shard_offset, s.length));
      states[parts_[i].unsafeGetTensorImpl()] = std::move(state);
    };
    if (name_ == "adam") {
      place(std::make_unique<torch::optim::AdamParamState>());
    } else {
      place(std::make_unique<torch::optim::AdamWParamState>());
    }
  }
  return {exp_avg, exp_avg_sq};
}

ShardedOptimizer::~ShardedOptimizer() = default;

C10dGroup* ShardedOptimizer::group() const {
  return distributed_ ? distributed_->data_parallel_group().get() : nullptr;
}

torch::TensorOptions ShardedOptimizer::comm_options() const {
  return torch::TensorOptions().dtype(parameters_.front().scalar_type()).device(comm_device_);
}

torch::Tensor ShardedOptimizer::flat_parameter(size_t q) const {
  return parameters_[q].detach().view({-1});
}

void ShardedOptimizer::load_shard() {
  if (aliased_) return;  // the parts are the parameters
  drop_secondaries();    // hpZ's copies are of the shard's values before
  torch::NoGradGuard no_grad;
  // Values on demand (the first take only): each parameter's written just before the shard takes
  // them, and each segment freed as soon as the shard holds it, in shard order.
  const bool on_demand = values_on_demand_;
  values_on_demand_ = false;
  size_t next_release = 0;
  auto values_of = [&](size_t q) {
    if (on_demand) zero_.initial_values()(parameters_[q]);
    return flat_parameter(q);
  };
  auto release_up_to = [&](int64_t end) {
    if (!on_demand) return;
    const size_t before = next_release;
    while (next_release < segments_.size() &&
           segments_[next_release].shard_offset + segments_[next_release].piece <= end) {
      // A parameter is written before it is freed, even one with nothing in this replica's
      // piece: its layer's values may be written later, through another parameter.
      for (size_t q : segments_[next_release].parameters) zero_.initial_values()(parameters_[q]);
      release_segment(next_release++);
    }
    if (next_release > before) return_freed_memory();
  };
  if (params_in_file_) {  // into the file, a sub-group at a time
    state_file_->fill(values_field_, [&](int64_t first, int64_t length, const torch::Tensor& w) {
      w.zero_();
      for_each_slice_in(first, first + length, [&](size_t i, int64_t lo, int64_t hi) {
        const Slice& s = slices_[i];
        w.narrow(0, lo - first, hi - lo)
            .copy_(values_of(s.parameter)
                       .narrow(0, s.parameter_offset + (lo - s.shard_offset), hi - lo));
      });
      release_up_to(first + length);
    });
  } else {
    for (const Slice& s : slices_) {
      shard_.narrow(0, s.shard_offset, s.length)
          .copy_(values_of(s.parameter).narrow(0, s.parameter_offset, s.length));
      release_up_to(s.shard_offset + s.length);
    }
    if (staged_ && stage_ == 3) device_shard_ = shard_.to(comm_device_, false, /*copy=*/true);
  }
  if (on_demand) {  // every segment freed: the shard is the truth
    release_up_to(std::numeric_limits<int64_t>::max());
    parameters_are_truth_ = false;
  }
}

torch::Tensor ShardedOptimizer::piece_values(size_t k) const {
  const Segment& s = segments_[k];
  if (!aliased_) {
    torch::Tensor shard = shard_;
    // Offloaded, the stepped shard goes where the collectives run (stage 3 keeps that copy).
    if (staged_ && stage_ == 3) shard = device_shard_;
    torch::Tensor piece = shard.narrow(0, s.shard_offset, s.piece);
    if (piece.device() == comm_device_) return piece;
    // From pinned memory to a GPU the copy is not waited for: the collective is ordered after
    // it on the device.
    return piece.to(comm_device_, /*non_blocking=*/piece.is_pinned() && comm_device_.is_cuda(),
                    /*copy=*/true);
  }
  torch::Tensor piece = pool_->take(s.piece, comm_options());
  piece.zero_();
  for (size_t i = s.first_slice; i < s.end_slice; ++i) {
    const Slice& slice = slices_[i];
    piece.narrow(0, slice.shard_offset - s.shard_offset, slice.length)
        .copy_(flat_parameter(slice.parameter).narrow(0, slice.parameter_offset, slice.length));
  }
  return piece;
}

void ShardedOptimizer::zero_grad() {
  finish_started_reductions();  // a skipped step's: nothing of them may land in this step
  finish_streams();
  for (torch::Tensor& p : parameters_) p.mutable_grad() = torch::Tensor();
  if (shard_grad_.defined()) shard_grad_.zero_();
  std::fill(grad_written_.begin(), grad_written_.end(), 0);  // the file's: zeros from here
  grad_factors_.clear();
  for (torch::Tensor& part : parts_) part.mutable_grad() = torch::Tensor();
  take_parameters();
  std::fill(gathered_this_step_.begin(), gathered_this_step_.end(), 0);
  peak_whole_bytes_ = whole_bytes_;
  peak_buffer_bytes_ = buffer_bytes_;
  reduce_buffer_bytes_ = reduce_buffer_bytes_now_;
  streamed_gradient_peak_ = 0;
}

void ShardedOptimizer::step() {  // [3]
  drop_secondaries();            // the step changes what they are copies of
  if (stage_ == 3) {
    // The shard is the truth; whatever is whole now would be stale after the step.
    release_all();
  } else {
    // The parameters are the truth (a restore may have written them since the last step).
    load_shard();
  }
  torch::NoGradGuard no_grad;
  if (shard_grad_.defined()) {
    for (size_t i = 0; i < parts_.size(); ++i) {
      parts_[i].mutable_grad() = shard_grad_.narrow(0, slices_[i].shard_offset, slices_[i].length);
    }
  }
  if (state_file_) {
    step_from_file();
  } else {
    inner_->step();
  }
  if (stage_ == 3) {  // gathered where a stage next computes
    // From pinned memory the copy need not be waited for: the next gather is ordered after it on
    // the device, and the host shard is not written before the next reduction's blocking copy.
    if (staged_ && !params_in_file_) {
      device_shard_.copy_(shard_, /*non_blocking=*/shard_.is_pinned());
    }
    return;
  }
  // Every segment's pieces all-gathered into a buffer of its size and copied into the
  // parameters, one segment in flight while the previous one is copied. Gathered on the host for
  // a GPU's parameters (offloaded, or Gloo): into pinned memory, so that the copies into the
  // parameters are queued on the device and the step returns without waiting for them.
  const torch::Device device = parameters_.front().device();
  const bool to_device = comm_device_.is_cpu() && device.is_cuda();
  reduce_thread_.drain();  // the group's collectives in one order on every replica
  auto start = [&](size_t k) {
    const Segment& s = segments_[k];
    C10dGroup* dp = s.group;
    InFlight g;
    g.segment = k;
    g.piece = piece_values(k);
    // One parameter needing no padding, where the collectives run: gathered into itself.
    const torch::Tensor& first = parameters_[s.parameters.front()];
    g.pooled_flat =
        !(s.parameters.size() == 1 && first.numel() == s.padded && first.is_contiguous() &&
          first.device() == comm_device_ && first.scalar_type() == g.piece.scalar_type());
    g.flat = g.pooled_flat ? pool_->take(s.padded, g.piece.options().pinned_memory(to_device))
                           : first.detach().view({-1});
    // Counted with the reductions' buffers: the step's gathers are their mirror image.
    g.bytes = ((g.pooled_flat ? g.flat.numel() : 0) + (aliased_ ? g.piece.numel() : 0)) *
              g.flat.element_size();
    reduce_buffer_bytes_now_ += g.bytes;
    reduce_buffer_bytes_ = std::max(reduce_buffer_bytes_, reduce_buffer_bytes_now_);
    g.start_us = CollectiveLog::now_us();
    if (dp) {
      g.wait = dp->all_gather_start(g.piece, g.flat);
    } else {
      g.flat.copy_(g.piece);
      g.wait = [] {};
    }
    return g;
  };
  auto finish = [&](InFlight& g) {
    g.wait();
    reduce_buffer_bytes_now_ -= g.bytes;
    const Segment& s = segments_[g.segment];
    if (log_)
      log_->finished(CollectiveKind::kAllGather, s.stage, g.start_us, tensor_bytes(g.piece));
    for (size_t q : s.parameters) {
      torch::Tensor& p = parameters_[q];
      if (!g.pooled_flat) break;  // gathered into the parameter itself
      p.copy_(g.flat.narrow(0, offsets_[q] - s.start, p.numel()).view(p.sizes()),
              /*non_blocking=*/to_device);
    }
    g.wait = nullptr;
    if (g.pooled_flat) pool_->give(g.flat);
    if (aliased_) pool_->give(g.piece);
  };
  std::deque<InFlight> in_flight;
  for (size_t k = 0; k < segments_.size(); ++k) {
    in_flight.push_back(start(k));
    if (in_flight.size() > 1) {
      finish(in_flight.front());
      in_flight.pop_front();
    }
  }
  for (InFlight& g : in_flight) finish(g);
}

void ShardedOptimizer::step_from_file() {
  // Each sub-group's slices (cut at its bounds) stepped by an optimizer of the inner one's kind
  // and settings over views of the sub-group's buffers: the same kernels on the same values as
  // the inner optimizer's step over the whole slices (each element's update is its own), so the
  // weights equal the in-memory offload's bit for bit.
  torch::NoGradGuard no_grad;
  drop_file_state();
  // The transfers in flight need a core of their own (the I/O engine's completions, the kernel's
  // side of O_DIRECT): the compute takes one intra-op thread fewer meanwhile. Measured on 2 cores
  // (bench_zero_offload, 64M parameters): with both threads computing, the overlap hid 11% of the
  // transfers' time; with one, 83%, at a compute 8% slower.
  const int threads = at::get_num_threads();
  struct RestoreThreads {
    int threads;
    ~RestoreThreads() { at::set_num_threads(threads); }
  } restore{threads};
  if (threads > 1) at::set_num_threads(threads - 1);
  const torch::optim::OptimizerOptions& settings = inner_->param_groups().front().options();
  const bool sgd = name_ == "sgd";
  const bool momentum = !state_fields().empty();  // SGD's: windows[0]
  std::vector<int64_t> stepped = file_steps_;
  state_file_->step([&](int64_t first, int64_t length, const std::vector<torch::Tensor>& windows) {
    if (grads_in_file_) {
      torch::Tensor grads = windows[grads_field_];
      for (double factor : grad_factors_) grads.mul_(factor);
    }
    std::vector<torch::Tensor> parts;
    std::vector<size_t> owner;
    std::vector<int64_t> at;
    for_each_slice_in(first, first + length, [&](size_t i, int64_t lo, int64_t hi) {
      // The shard's values: in memory, or (in the file) in this sub-group's window.
      torch::Tensor part = params_in_file_ ? alias_of(windows[values_field_], lo - first, hi - lo)
                                           : alias_of(shard_, lo, hi - lo);
      part.mutable_grad() = grads_in_file_ ? alias_of(windows[grads_field_], lo - first, hi - lo)
                                           : shard_grad_.narrow(0, lo, hi - lo);
      parts.push_back(part);
      owner.push_back(i);
      at.push_back(lo - first);
    });
    if (parts.empty()) return;
    std::unique_ptr<torch::optim::Optimizer> optimizer = make_optimizer(name_, parts);
    optimizer->param_groups().front().set_options(settings.clone());
    auto& states = optimizer->state();
    for (size_t j = 0; j < parts.size(); ++j) {
      const int64_t n = parts[j].numel();
      void* key = parts[j].unsafeGetTensorImpl();
      if (sgd) {
        if (!momentum) continue;
        auto state = std::make_unique<torch::optim::SGDParamState>();
        state->momentum_buffer(windows[0].narrow(0, at[j], n));
        states[key] = std::move(state);
        continue;
      }
      auto place = [&](auto state) {
        state->step(file_steps_[owner[j]]);
        state->exp_avg(windows[0].narrow(0, at[j], n));
        state->exp_avg_sq(windows[1].narrow(0, at[j], n));
        states[key] = std::move(state);
      };
      if (name_ == "adam") {
        place(std::make_unique<torch::optim::AdamParamState>());
      } else {
        place(std::make_unique<torch::optim::AdamWParamState>());
      }
    }
    optimizer->step();
    if (sgd) return;
    for (size_t j = 0; j < parts.size(); ++j) {
      const auto& state = *states.at(parts[j].unsafeGetTensorImpl());
      stepped[owner[j]] = name_ == "adam"
                              ? static_cast<const torch::optim::AdamParamState&>(state).step()
                              : static_cast<const torch::optim::AdamWParamState&>(state).step();
    }
  });
  file_steps_ = stepped;
}

void ShardedOptimizer::return_freed_memory() const {
#ifdef __GLIBC__
  if (zero_.return_freed_memory() && parameters_.front().device().is_cpu()) malloc_trim(0);
#endif
}

void ShardedOptimizer::set_learning_rate(double lr) {
  train::set_learning_rate(*inner_, lr);
}

double ShardedOptimizer::learning_rate() const {
  return train::learning_rate(*inner_);
}

void check_reshard_after_forward(bool reshard_after_forward, int zero_stage) {
  PIPETRAIN_CHECK_INPUT(!reshard_after_forward || zero_stage == 3,
                        "--reshard-after-forward frees ZeRO-3's gathered parameters; it needs "
                        "--zero 3, got --zero ",
                        zero_stage);
}

std::set<const void*> narrowed_gather_parameters(const torch::nn::Module& model,
                                                 const ZeroOptions& zero, Precision precision) {
  if (!gathers_narrowed(zero, precision)) return {};
  return narrowable_parameters(model);
}

bool gathers_narrowed(const ZeroOptions& zero, Precision precision) {
  return zero.stage() == 3 && zero.cast_gather() && precision != Precision::kFloat32;
}

std::unique_ptr<ShardedOptimizer> make_pipe_sharded_optimizer(
    Distributed& distributed, DistributedPipe& pipe, const std::vector<torch::Tensor>& counted,
    const std::string& optimizer, const OptimizerOptions& options, const ZeroOptions& zero,
    bool overlap) {
  const int stage = zero.stage();
  check_zero_options(zero);
  // The layout: per local stage its parameters by layer (streaming, or stage 3 by layer) or
  // whole, each cut into buckets of at most PipeOptions::bucket_bytes (--bucket-size; a
  // parameter larger than that is a bucket of its own), so that no buffer of a reduction or a
  // gather is larger than a bucket. A layer's or stage's parameters that autocast only casts
  // form buckets of their own under bf16/fp16 at stage 3, gathered in the compute dtype
  // (ZeroOptions::cast_gather). Last, the pipe's group -1 (ties, tp-summed tensors), the
  // parameters several layers use and, at stage 3, those under the persistence threshold: one
  // segment, whole through the step and reduced after it.
  const Precision precision = pipe.options().precision();
  const std::set<const void*> cast = narrowed_gather_parameters(*pipe.model(), zero, precision);
  const bool by_layer = streams_gradients(zero) || gathers_by_layer(zero);
  const int64_t bucket_bytes = pipe.options().bucket_bytes();
  std::vector<std::vector<torch::Tensor>> segments;
  std::vector<int> segment_stages, segment_layers;
  std::vector<torch::ScalarType> gather_dtypes;
  std::vector<char> accumulates, experts;
  std::multimap<int, size_t> segments_of_stage;  // what the overlap starts after a stage
  // Expert parallelism: the experts' tensors in segments of their own, over their own replicas.
  std::set<const void*> expert_tensors;
  for (const torch::Tensor& t : pipe.expert_parameters()) {
    expert_tensors.insert(t.unsafeGetTensorImpl());
  }
  auto add_buckets = [&](int stage_index, int layer, const std::vector<torch::Tensor>& tensors,
                         torch::ScalarType gather_dtype, bool accumulate, bool expert) {
    for (auto& bucket : cut_into_buckets(tensors, bucket_bytes)) {
      if (stage_index >= 0 && !accumulate) segments_of_stage.emplace(stage_index, segments.size());
      gather_dtypes.push_back(gather_dtype);
      segments.push_back(std::move(bucket));
      segment_stages.push_back(stage_index);
      segment_layers.push_back(layer);
      accumulates.push_back(accumulate);
      experts.push_back(expert);
    }
  };
  auto add_group = [&](int stage_index, int layer, const std::vector<torch::Tensor>& tensors,
                       bool accumulate = false) {
    if (tensors.empty()) return;
    const torch::ScalarType dtype = tensors.front().scalar_type();
    for (const bool expert : {false, true}) {
      std::vector<torch::Tensor> kept, narrowed;
      for (const torch::Tensor& t : tensors) {
        if (expert_tensors.count(t.unsafeGetTensorImpl()) != (expert ? 1u : 0u)) continue;
        (cast.count(t.unsafeGetTensorImpl()) ? narrowed : kept).push_back(t);
      }
      add_buckets(stage_index, layer, kept, dtype, accumulate, expert);
      add_buckets(stage_index, layer, narrowed, compute_dtype(precision), accumulate, expert);
    }
  };
  const std::vector<std::pair<int, std::vector<torch::Tensor>>> groups = pipe.gradient_groups();
  std::vector<torch::Tensor> persistent;
  if (!by_layer) {
    for (const auto& [stage_index, tensors] : groups) {
      if (stage_index >= 0) {
        add_group(stage_index, -1, tensors);
      } else {
        persistent.insert(persistent.end(), tensors.begin(), tensors.end());
      }
    }
  } else {
    // By layer: a tensor one layer of this rank uses is that layer's (one its stage reduces
    // after the step, a tie with another rank or a tp-summed one, accumulates); one several
    // layers of the rank use, and (stage 3) a small one, is persistent.
    std::set<const void*> after_step;
    for (const auto& [stage_index, tensors] : groups) {
      if (stage_index >= 0) continue;
      for (const torch::Tensor& t : tensors) after_step.insert(t.unsafeGetTensorImpl());
    }
    std::map<int, std::vector<std::vector<torch::Tensor>>> layers_of;
    std::map<const void*, int> uses;
    for (const auto& [stage_index, tensors] : groups) {
      if (stage_index < 0) continue;
      layers_of[stage_index] = pipe.stage_layer_parameters(stage_index);
    }
    for (const int j : pipe.local_stages()) {
      if (!layers_of.count(j)) layers_of[j] = pipe.stage_layer_parameters(j);
    }
    for (const auto& [stage_index, layers] : layers_of) {
      for (const auto& layer : layers) {
        std::set<const void*> once;  // a layer lists a tensor it uses twice once
        for (const torch::Tensor& t : layer) {
          if (once.insert(t.unsafeGetTensorImpl()).second) ++uses[t.unsafeGetTensorImpl()];
        }
      }
    }
    std::set<const void*> placed;
    for (const auto& [stage_index, layers] : layers_of) {
      for (size_t l = 0; l < layers.size(); ++l) {
        std::vector<torch::Tensor> streamed, accumulated;
        for (const torch::Tensor& t : layers[l]) {
          const void* key = t.unsafeGetTensorImpl();
          if (!placed.insert(key).second) continue;
          const bool small = stage == 3 && tensor_bytes(t) < zero.persistence_threshold();
          if (uses[key] > 1 || small) {
            persistent.push_back(t);
          } else {
            (after_step.count(key) ? accumulated : streamed).push_back(t);
          }
        }
        add_group(stage_index, static_cast<int>(l), streamed);
        add_group(stage_index, static_cast<int>(l), accumulated, /*accumulate=*/true);
      }
    }
  }
  add_group(-1, -1, persistent);
  auto sharded = std::make_unique<ShardedOptimizer>(
      &distributed, pipe.parameters(), counted, optimizer, options, zero, segments, segment_stages,
      gather_dtypes, segment_layers, accumulates, experts);
  pipe.set_allreduce_gradients(false);
  ShardedOptimizer* shards = sharded.get();
  shards->set_collective_log(&pipe.collective_log());
  if (stage == 3 && !gathers_by_layer(zero)) {
    pipe.set_stage_parameters(shards, zero.reshard_after_forward());
  }
  if (shards->uses_hooks()) pipe.set_parameter_hooks(shards);
  // The overlap reduces what does not stream as soon as a stage's gradients are final.
  if (overlap && !streams_gradients(zero)) {
    pipe.set_stage_gradients_hook([shards, segments_of_stage](int j) {
      const auto [first, last] = segments_of_stage.equal_range(j);
      for (auto it = first; it != last; ++it) shards->start_reduce(it->second);
    });
  }
  return sharded;
}

}  // namespace pipetrain::train
