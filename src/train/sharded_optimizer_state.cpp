// ZeRO's state in checkpoint form and what a replica holds (pipetrain/train/sharded_optimizer.h):
// capture() gathers each optimizer-state field by segment into the per-parameter form of an
// unsharded checkpoint, restore() takes this replica's slices of it, holdings() counts bytes.
#include "pipetrain/train/sharded_optimizer.h"

#include <algorithm>
#include <map>
#include <set>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include "pipetrain/base/check.h"
#include "pipetrain/stage/tensor_bytes.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain::train {
namespace {

// The names the inner optimizer's parameters (the shard, or its slices) go by in checkpoint form.
NamedTensors part_names(const std::vector<torch::Tensor>& parts) {
  NamedTensors names;
  for (size_t i = 0; i < parts.size(); ++i) names.insert("shard." + std::to_string(i), parts[i]);
  return names;
}

// A state's field by its checkpoint name, and Adam's step count (-1: none).
torch::Tensor field_of(const torch::optim::OptimizerParamState& state, const std::string& field) {
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    return sgd->momentum_buffer();
  }
  auto of = [&](const auto& adam) {
    return field == "exp_avg" ? adam.exp_avg() : adam.exp_avg_sq();
  };
  if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
    return of(*adam);
  }
  return of(dynamic_cast<const torch::optim::AdamWParamState&>(state));
}

int64_t step_of(const torch::optim::OptimizerParamState& state) {
  if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
    return adam->step();
  }
  if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    return adamw->step();
  }
  return -1;
}

}  // namespace

void ShardedOptimizer::load_file_state() {
  if (!state_file_ || state_fields().empty() || !state_file_->written(0) ||
      !inner_->state().empty()) {
    return;
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> fields = place_state(state_options_);
  for (size_t f = 0; f < fields.size(); ++f) state_file_->read(f, fields[f]);
  for (size_t i = 0; i < parts_.size(); ++i) {
    auto& state = *inner_->state().at(parts_[i].unsafeGetTensorImpl());
    if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(&state)) {
      adam->step(file_steps_[i]);
    } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(&state)) {
      adamw->step(file_steps_[i]);
    }
  }
}

void ShardedOptimizer::drop_file_state() {
  if (state_file_) inner_->state().clear();
}

void ShardedOptimizer::store_file_state() {
  torch::NoGradGuard no_grad;
  const auto& states = inner_->state();
  const std::vector<std::string> fields = state_fields();
  for (size_t f = 0; f < fields.size(); ++f) {
    torch::Tensor flat = torch::zeros({shard_size_}, state_options_);
    for (size_t i = 0; i < parts_.size(); ++i) {
      const auto& state = *states.at(parts_[i].unsafeGetTensorImpl());
      flat.narrow(0, slices_[i].shard_offset, slices_[i].length)
          .copy_(field_of(state, fields[f]).reshape({-1}));
    }
    state_file_->write(f, flat);
  }
  for (size_t i = 0; i < parts_.size(); ++i) {
    file_steps_[i] = step_of(*states.at(parts_[i].unsafeGetTensorImpl()));
  }
  drop_file_state();
}

void ShardedOptimizer::capture(Checkpoint& part, const NamedTensors& named) {
  // Under nvme the file's state is placed into the inner optimizer while it is read, and
  // dropped after (a copy of the shard's state in memory meanwhile).
  load_file_state();
  struct Drop {
    ShardedOptimizer* self;
    ~Drop() { self->drop_file_state(); }
  } drop{this};
  Checkpoint shard_form;
  const NamedTensors names = part_names(parts_);
  capture_optimizer(shard_form, *inner_, names);
  // The form is member 0's of each segment's group: replica 0's, and an expert segment's first
  // holder's (expert parallelism).
  std::vector<char> contributes(parameters_.size(), 0);
  for (const Segment& s : segments_) {
    for (size_t q : s.parameters) contributes[q] = s.member == 0;
  }
  if (std::find(contributes.begin(), contributes.end(), 1) != contributes.end()) {
    part.optimizer = shard_form.optimizer;
  }
  if (shard_form.optimizer_state.empty()) return;  // no step yet, on every replica alike
  const auto& first = shard_form.optimizer_state.begin()->second;
  // Per field: this replica's shard of it in shard order (zeros in the padding), all-gathered by
  // segment into the padded flat vector of every parameter's state.
  std::map<std::string, torch::Tensor> whole;
  reduce_thread_.drain();  // the group's collectives in one order on every replica
  for (const auto& [field, sample] : first) {
    if (field == "step") continue;
    torch::Tensor shard = torch::zeros({shard_size_}, sample.options().device(comm_device_));
    for (size_t i = 0; i < parts_.size(); ++i) {
      const auto state = shard_form.optimizer_state.find("shard." + std::to_string(i));
      if (state == shard_form.optimizer_state.end()) continue;
      const torch::Tensor& value = state->second.at(field);
      shard.narrow(0, slices_[i].shard_offset, slices_[i].length).copy_(value.reshape({-1}));
    }
    torch::Tensor flat = torch::empty({flat_size_}, shard.options());
    for (const Segment& s : segments_) {
      const torch::Tensor mine = shard.narrow(0, s.shard_offset, s.piece);
      torch::Tensor all = flat.narrow(0, s.start, s.padded);
      if (C10dGroup* dp = s.group) {
        dp->all_gather(mine, all);
      } else {
        all.copy_(mine);
      }
    }
    whole[field] = flat;
  }
  std::map<const void*, size_t> index;
  for (size_t q = 0; q < parameters_.size(); ++q) index[parameters_[q].unsafeGetTensorImpl()] = q;
  for (const auto& item : named) {
    auto found = index.find(item.value().unsafeGetTensorImpl());
    if (found == index.end() || !contributes[found->second]) continue;
    const torch::Tensor& p = parameters_[found->second];
    auto& state = part.optimizer_state[item.key()];
    for (const auto& [field, flat] : whole) {
      // A copy of its own on the host (one copy from a GPU, a clone on the CPU).
      state[field] = flat.narrow(0, offsets_[found->second], p.numel())
                         .view(p.sizes())
                         .to(flat.options().device(torch::kCPU), false, /*copy=*/true);
    }
    auto step = first.find("step");
    if (step != first.end()) {
      state["step"] = step->second.to(step->second.options().device(torch::kCPU), false, true);
    }
  }
}

std::vector<ShardedOptimizer::OwnedSlice> ShardedOptimizer::owned_slices(
    const NamedTensors& named) {
  reduce_thread_.drain();  // nothing of the last step in flight
  load_file_state();       // under nvme: a copy of the file's state, kept until the next step
  Checkpoint views;
  capture_optimizer_views(views, *inner_, part_names(parts_));
  std::map<const void*, size_t> index;
  for (size_t q = 0; q < parameters_.size(); ++q) index[parameters_[q].unsafeGetTensorImpl()] = q;
  std::multimap<size_t, std::string> names;
  for (const auto& item : named) {
    const auto found = index.find(item.value().unsafeGetTensorImpl());
    if (found != index.end()) names.emplace(found->second, item.key());
  }
  // Stage 3 while the parameters are the truth (after construction, gather_all() or a restore):
  // from them; else from what the inner optimizer steps (the shard, or slices of the parameters).
  const bool from_parameters = stage_ == 3 && parameters_are_truth_;
  // The shard's values in the file: read whole (a copy in memory until the next step's drop).
  torch::Tensor file_values;
  if (params_in_file_ && !from_parameters) {
    file_values = torch::empty({shard_size_}, state_options_);
    state_file_->read(values_field_, file_values);
  }
  std::vector<OwnedSlice> owned;
  for (size_t i = 0; i < slices_.size(); ++i) {
    const Slice& s = slices_[i];
    const torch::Tensor values =
        from_parameters
            ? flat_parameter(s.parameter).detach().narrow(0, s.parameter_offset, s.length)
        : file_values.defined() ? file_values.narrow(0, s.shard_offset, s.length)
                                : parts_[i].detach();
    const auto state = views.optimizer_state.find("shard." + std::to_string(i));
    const auto range = names.equal_range(s.parameter);
    for (auto it = range.first; it != range.second; ++it) {
      OwnedSlice slice{it->second, s.parameter_offset, values, {}};
      if (state != views.optimizer_state.end()) slice.state = state->second;
      owned.push_back(std::move(slice));
    }
  }
  // A parameter that lies wholly in other replicas' pieces: owned here with no elements.
  std::set<size_t> with_slice;
  for (const Slice& s : slices_) with_slice.insert(s.parameter);
  for (const auto& [q, name] : names) {
    if (!with_slice.count(q)) {
      owned.push_back(
          {name, 0, torch::empty({0}, parameters_[q].options().requires_grad(false)), {}});
    }
  }
  return owned;
}

void ShardedOptimizer::restore(const Checkpoint& checkpoint, const NamedTensors& named) {
  drop_secondaries();                              // hpZ's copies are of the values before
  if (checkpoint.optimizer_state.empty()) return;  // no step was taken before the save
  if (checkpoint.optimizer != name_) {
    throw CheckpointError("checkpoint holds '" + checkpoint.optimizer +
                          "' optimizer state but this run uses '" + name_ +
                          "'; resume with "
                          "--optimizer " +
                          checkpoint.optimizer);
  }
  // Each parameter's name, and its state in the checkpoint.
  std::vector<const std::map<std::string, torch::Tensor>*> states(parameters_.size(), nullptr);
  std::vector<std::string> names(parameters_.size());
  std::map<const void*, size_t> index;
  for (size_t q = 0; q < parameters_.size(); ++q) index[parameters_[q].unsafeGetTensorImpl()] = q;
  for (const auto& item : named) {
    auto found = index.find(item.value().unsafeGetTensorImpl());
    if (found == index.end()) continue;
    names[found->second] = item.key();
    auto state = checkpoint.optimizer_state.find(item.key());
    if (state != checkpoint.optimizer_state.end()) states[found->second] = &state->second;
  }
  size_t with_state = 0;
  for (const auto* state : states) with_state += state != nullptr;
  if (with_state == 0) return;
  for (size_t q = 0; q < parameters_.size(); ++q) {
    if (states[q] == nullptr) {
      throw CheckpointError("checkpoint has optimizer state for some parameters of rank " +
                            std::to_string(rank_) + " but not for '" + names[q] + "'");
    }
  }
  // Per field: this replica's shard of it, slice by slice.
  std::map<std::string, torch::Tensor> shard_state;
  for (const auto& [field, sample] : *states.front()) {
    if (field == "step") continue;
    for (size_t q = 0; q < parameters_.size(); ++q) {
      auto tensor = states[q]->find(field);
      if (tensor == states[q]->end() || tensor->second.sizes() != parameters_[q].sizes()) {
        throw CheckpointError("checkpoint optimizer state '" + field + "' of '" + names[q] +
                              "' is missing or does not have the parameter's shape");
      }
    }
    torch::Tensor shard = torch::zeros({shard_size_}, sample.options().device(torch::kCPU));
    for (const Slice& s : slices_) {
      const torch::Tensor& whole = states[s.parameter]->at(field);
      // A meta tensor was not read (a sharded checkpoint resumed under ZeRO): only this replica's
      // range of it is, here.
      shard.narrow(0, s.shard_offset, s.length)
          .copy_(whole.is_meta()
                     ? (checkpoint.optimizer_range
                            ? checkpoint.optimizer_range(names[s.parameter], field,
                                                         s.parameter_offset, s.length)
                            : optimizer_state_value(checkpoint, names[s.parameter], field))
                     : whole.reshape({-1}).narrow(0, s.parameter_offset, s.length));
    }
    shard_state[field] = shard;
  }
  Checkpoint shard_form;
  shard_form.optimizer = name_;
  const auto step = states.front()->find("step");
  for (size_t i = 0; i < parts_.size(); ++i) {
    auto& fields = shard_form.optimizer_state["shard." + std::to_string(i)];
    for (const auto& [field, shard] : shard_state) {
      fields[field] = shard.narrow(0, slices_[i].shard_offset, slices_[i].length)
                          .to(params_in_file_ ? state_options_.device() : parts_[i].device(), false,
                              /*copy=*/true);
    }
    if (step != states.front()->end()) fields["step"] = step->second.clone();
  }
  // Into the state's own buffers where they are laid out already (place_state); the checkpoint
  // form's per-slice copies otherwise.
  if (state_file_) {  // restored in memory, then written into the file
    drop_file_state();
    place_state(state_options_);
  }
  if (!restore_in_place(shard_form)) restore_optimizer(shard_form, *inner_, part_names(parts_));
  if (state_file_) store_file_state();
}

bool ShardedOptimizer::restore_in_place(const Checkpoint& form) {
  torch::NoGradGuard no_grad;
  auto& states = inner_->state();
  for (size_t i = 0; i < parts_.size(); ++i) {
    const auto state = states.find(parts_[i].unsafeGetTensorImpl());
    const auto fields = form.optimizer_state.find("shard." + std::to_string(i));
    if (state == states.end() || fields == form.optimizer_state.end()) return false;
    auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(state->second.get());
    auto* adam = dynamic_cast<torch::optim::AdamParamState*>(state->second.get());
    auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(state->second.get());
    const std::set<std::string> expected =
        sgd ? std::set<std::string>{"momentum_buffer"}
            : std::set<std::string>{"step", "exp_avg", "exp_avg_sq"};
    std::set<std::string> given;
    for (const auto& [field, value] : fields->second) given.insert(field);
    if (given != expected || !(sgd || adam || adamw)) return false;
  }
  for (size_t i = 0; i < parts_.size(); ++i) {
    auto* state = states.at(parts_[i].unsafeGetTensorImpl()).get();
    const auto& fields = form.optimizer_state.at("shard." + std::to_string(i));
    if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(state)) {
      sgd->momentum_buffer().copy_(fields.at("momentum_buffer"));
      continue;
    }
    auto write = [&](auto* adam) {
      adam->step(fields.at("step").item<int64_t>());
      adam->exp_avg().copy_(fields.at("exp_avg"));
      adam->exp_avg_sq().copy_(fields.at("exp_avg_sq"));
    };
    if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(state)) {
      write(adam);
    } else {
      write(dynamic_cast<torch::optim::AdamWParamState*>(state));
    }
  }
  return true;
}

int64_t ShardedOptimizer::state_bytes() const {
  return optimizer_state_bytes(*inner_);
}

int64_t ShardedOptimizer::gradient_bytes() const {
  return (offload_ ? 0 : tensor_bytes(shard_grad_)) + train::gradient_bytes(parameters_);
}

int64_t ShardedOptimizer::host_bytes() const {
  if (!offload_) return 0;
  return tensor_bytes(shard_) + tensor_bytes(shard_grad_) + state_bytes() +
         (state_file_ ? state_file_->host_bytes() : 0);
}

int64_t ShardedOptimizer::file_bytes() const {
  return state_file_ ? state_file_->file_bytes() : 0;
}

ShardedOptimizer::Holdings ShardedOptimizer::holdings(
    const std::vector<torch::Tensor>& parameters) const {
  std::map<const void*, size_t> index;
  for (size_t q = 0; q < parameters_.size(); ++q) index[parameters_[q].unsafeGetTensorImpl()] = q;
  std::vector<size_t> mine;
  for (const torch::Tensor& p : unique_parameters(parameters)) {
    const auto found = index.find(p.unsafeGetTensorImpl());
    if (found != index.end()) mine.push_back(found->second);
  }
  Holdings h;
  // The reductions' buffers: on the host when offloaded without replicas (built where the shard
  // lives), else where the collectives run.
  const bool flat_on_host = offload_ && group() == nullptr;
  if (mine.size() == parameters_.size()) {
    h.parameters = parameter_bytes();
    h.gradients = gradient_bytes();
    h.optimizer_state = state_bytes();
    h.host = host_bytes() + (flat_on_host ? reduce_buffer_bytes_ : 0);
    h.reduce_buffers = flat_on_host ? 0 : reduce_buffer_bytes_;
    h.step_gradients = step_gradient_bytes_;
    h.file = file_bytes();
    return h;
  }
  // This replica's shard elements that belong to `mine`.
  std::set<size_t> wanted(mine.begin(), mine.end());
  int64_t elements = 0;
  std::vector<torch::Tensor> subset;
  for (size_t q : mine) {
    subset.push_back(parameters_[q]);
    h.parameters += stage_ == 3 ? static_cast<int64_t>(parameters_[q].storage().nbytes())
                                : tensor_bytes(parameters_[q]);
  }
  for (const Slice& s : slices_) {
    if (wanted.count(s.parameter)) elements += s.length;
  }
  const double share = shard_size_ > 0 ? static_cast<double>(elements) / shard_size_ : 0.0;
  const auto part = [&](int64_t bytes) {
    return static_cast<int64_t>(std::llround(share * static_cast<double>(bytes)));
  };
  if (stage_ == 3) h.parameters += part(tensor_bytes(gather_source()));
  h.gradients = train::gradient_bytes(subset) + (offload_ ? 0 : part(tensor_bytes(shard_grad_)));
  h.optimizer_state = part(state_bytes());
  h.host = part(host_bytes());
  h.file = part(file_bytes());
  // The buffers and the step's full gradients hold every parameter's elements once: `mine`'s
  // share of the elements.
  int64_t whole = 0;
  for (size_t q : mine) whole += parameters_[q].numel();
  const auto element_part = [&](int64_t bytes) {
    return total_ > 0 ? static_cast<int64_t>(std::llround(static_cast<double>(whole) / total_ *
                                                          static_cast<double>(bytes)))
                      : 0;
  };
  (flat_on_host ? h.host : h.reduce_buffers) += element_part(reduce_buffer_bytes_);
  h.step_gradients = element_part(step_gradient_bytes_);
  return h;
}

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> parameters;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) parameters.push_back(p);
  }
  return optimizer_state_bytes(optimizer, parameters);
}

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer,
                              const std::vector<torch::Tensor>& parameters) {
  // Counted where it lives: a copy (capture_optimizer's) would hold the state twice meanwhile.
  const auto& states = optimizer.state();
  int64_t total = 0;
  std::set<const void*> seen;
  for (const torch::Tensor& p : parameters) {
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    const auto found = states.find(p.unsafeGetTensorImpl());
    if (found == states.end()) continue;
    const torch::optim::OptimizerParamState* state = found->second.get();
    if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state)) {
      total += tensor_bytes(sgd->momentum_buffer());
    } else if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(state)) {
      total += tensor_bytes(adam->exp_avg()) + tensor_bytes(adam->exp_avg_sq()) +
               tensor_bytes(adam->max_exp_avg_sq());
    } else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(state)) {
      total += tensor_bytes(adamw->exp_avg()) + tensor_bytes(adamw->exp_avg_sq()) +
               tensor_bytes(adamw->max_exp_avg_sq());
    }
  }
  return total;
}

int64_t gradient_bytes(const std::vector<torch::Tensor>& parameters) {
  int64_t total = 0;
  for (const torch::Tensor& p : unique_parameters(parameters)) total += tensor_bytes(p.grad());
  return total;
}

}  // namespace pipetrain::train
