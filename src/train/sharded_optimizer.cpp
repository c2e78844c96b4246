// ZeRO stage 1 and 2 (pipetrain/train/sharded_optimizer.h). [n] cite the header's steps.
#include "pipetrain/train/sharded_optimizer.h"

#include <algorithm>
#include <map>
#include <set>

#include <torch/torch.h>

#include "pipetrain/base/check.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain::train {
namespace {

// The name the inner optimizer's one parameter, the shard, goes by in a checkpoint form.
const char* const kShard = "shard";

int64_t bytes_of(const torch::Tensor& tensor) {
  return tensor.defined() ? tensor.numel() * static_cast<int64_t>(tensor.element_size()) : 0;
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(Distributed& distributed, std::vector<torch::Tensor> parameters,
                                   const std::vector<torch::Tensor>& counted,
                                   const std::string& optimizer, const OptimizerOptions& options,
                                   int stage)
    : distributed_(distributed),
      parameters_(unique_parameters(parameters)),
      replicas_(distributed.layout().replicas),
      replica_(distributed.replica()),
      name_(optimizer),
      stage_(stage) {
  PIPETRAIN_CHECK_INPUT(stage == 1 || stage == 2, "ZeRO stage must be 1 or 2 (got ", stage, ")");
  PIPETRAIN_CHECK_INPUT(!parameters_.empty(), "ZeRO: rank ", distributed.rank(),
                        " has no parameters to shard");
  const torch::ScalarType dtype = parameters_.front().scalar_type();
  for (const torch::Tensor& p : parameters_) {
    PIPETRAIN_CHECK_INPUT(p.scalar_type() == dtype && p.is_floating_point() && p.device().is_cpu(),
                          "ZeRO shards parameters of one floating dtype on the CPU; rank ",
                          distributed.rank(), " holds ", p.scalar_type(), " on ", p.device(),
                          " beside ", dtype);
    offsets_.push_back(total_);
    total_ += p.numel();
  }
  shard_size_ = (total_ + replicas_ - 1) / replicas_;
  shard_begin_ = replica_ * shard_size_;
  const int64_t padded = shard_size_ * replicas_;

  torch::NoGradGuard no_grad;
  const auto options_of = torch::TensorOptions().dtype(dtype);
  torch::Tensor mask = torch::zeros({padded}, options_of.dtype(torch::kDouble));
  std::set<const void*> counts;
  for (const torch::Tensor& c : counted) counts.insert(c.unsafeGetTensorImpl());
  for (size_t q = 0; q < parameters_.size(); ++q) {
    const torch::Tensor& p = parameters_[q];
    if (counts.count(p.unsafeGetTensorImpl())) mask.narrow(0, offsets_[q], p.numel()).fill_(1);
  }
  shard_ = torch::zeros({shard_size_}, options_of);
  load_shard();
  shard_grad_ = torch::zeros({shard_size_}, options_of);
  counted_mask_ = mask.narrow(0, shard_begin_, shard_size_).clone();
  inner_ = make_optimizer(name_, {shard_}, options);
}

ShardedOptimizer::~ShardedOptimizer() = default;

C10dGroup* ShardedOptimizer::group() const {
  return distributed_.data_parallel_group().get();
}

void ShardedOptimizer::zero_grad() {
  for (torch::Tensor& p : parameters_) p.mutable_grad() = torch::Tensor();
  shard_grad_.zero_();
}

torch::Tensor ShardedOptimizer::flat_gradients() const {
  std::vector<torch::Tensor> pieces;
  for (const torch::Tensor& p : parameters_) {
    const torch::Tensor& grad = p.grad();
    pieces.push_back(grad.defined() ? grad.detach().reshape({-1}).to(shard_.scalar_type())
                                    : torch::zeros({p.numel()}, shard_.options()));
  }
  const int64_t padding = shard_size_ * replicas_ - total_;
  if (padding > 0) pieces.push_back(torch::zeros({padding}, shard_.options()));
  return torch::cat(pieces);
}

void ShardedOptimizer::reduce_gradients() {  // [1]
  torch::NoGradGuard no_grad;
  const torch::Tensor flat = flat_gradients();
  if (C10dGroup* dp = group()) {
    dp->reduce_scatter_sum(flat, shard_grad_);
  } else {
    shard_grad_.copy_(flat.narrow(0, shard_begin_, shard_size_));
  }
  if (stage_ == 2) {
    for (torch::Tensor& p : parameters_) p.mutable_grad() = torch::Tensor();
  }
}

double ShardedOptimizer::local_grad_norm_squared() const {  // [2]
  return (shard_grad_.to(torch::kDouble).square() * counted_mask_).sum().item<double>();
}

void ShardedOptimizer::scale_gradients(double factor) {
  torch::NoGradGuard no_grad;
  shard_grad_.mul_(factor);
}

void ShardedOptimizer::load_shard() {
  torch::NoGradGuard no_grad;
  const int64_t end = shard_begin_ + shard_size_;
  for (size_t q = 0; q < parameters_.size(); ++q) {
    const int64_t from = std::max(offsets_[q], shard_begin_);
    const int64_t to = std::min(offsets_[q] + parameters_[q].numel(), end);
    if (from >= to) continue;
    shard_.narrow(0, from - shard_begin_, to - from)
        .copy_(parameters_[q].detach().reshape({-1}).narrow(0, from - offsets_[q], to - from));
  }
}

void ShardedOptimizer::step() {  // [3]
  // The parameters are the truth (a restore may have written them since the last step).
  load_shard();
  torch::NoGradGuard no_grad;
  shard_.mutable_grad() = shard_grad_;
  inner_->step();
  torch::Tensor flat = torch::empty({shard_size_ * replicas_}, shard_.options());
  if (C10dGroup* dp = group()) {
    dp->all_gather(shard_, flat);
  } else {
    flat.copy_(shard_);
  }
  for (size_t q = 0; q < parameters_.size(); ++q) {
    torch::Tensor& p = parameters_[q];
    p.copy_(flat.narrow(0, offsets_[q], p.numel()).view(p.sizes()));
  }
}

void ShardedOptimizer::set_learning_rate(double lr) {
  train::set_learning_rate(*inner_, lr);
}

double ShardedOptimizer::learning_rate() const {
  return train::learning_rate(*inner_);
}

void ShardedOptimizer::capture(Checkpoint& part, const NamedTensors& named) {
  Checkpoint shard_form;
  NamedTensors shard_name;
  shard_name.insert(kShard, shard_);
  capture_optimizer(shard_form, *inner_, shard_name);
  if (replica_ == 0) part.optimizer = shard_form.optimizer;
  auto fields = shard_form.optimizer_state.find(kShard);
  if (fields == shard_form.optimizer_state.end()) return;  // no step yet, on every replica alike
  std::map<std::string, torch::Tensor> whole;              // field -> the padded flat state
  for (const auto& [field, tensor] : fields->second) {
    if (field == "step") continue;
    torch::Tensor flat = torch::empty({shard_size_ * replicas_}, tensor.options());
    if (C10dGroup* dp = group()) {
      dp->all_gather(tensor.contiguous(), flat);
    } else {
      flat.copy_(tensor);
    }
    whole[field] = flat;
  }
  if (replica_ != 0) return;
  std::map<const void*, size_t> index;
  for (size_t q = 0; q < parameters_.size(); ++q) index[parameters_[q].unsafeGetTensorImpl()] = q;
  for (const auto& item : named) {
    auto found = index.find(item.value().unsafeGetTensorImpl());
    if (found == index.end()) continue;
    const torch::Tensor& p = parameters_[found->second];
    auto& state = part.optimizer_state[item.key()];
    for (const auto& [field, flat] : whole) {
      state[field] = flat.narrow(0, offsets_[found->second], p.numel()).view(p.sizes()).clone();
    }
    auto step = fields->second.find("step");
    if (step != fields->second.end()) state["step"] = step->second.clone();
  }
}

void ShardedOptimizer::restore(const Checkpoint& checkpoint, const NamedTensors& named) {
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
                            std::to_string(distributed_.rank()) + " but not for '" + names[q] +
                            "'");
    }
  }
  std::map<std::string, torch::Tensor> shard_state;
  for (const auto& [field, first] : *states.front()) {
    if (field == "step") {
      shard_state[field] = first.clone();
      continue;
    }
    torch::Tensor flat = torch::zeros({shard_size_ * replicas_}, first.options());
    for (size_t q = 0; q < parameters_.size(); ++q) {
      auto tensor = states[q]->find(field);
      if (tensor == states[q]->end() || tensor->second.sizes() != parameters_[q].sizes()) {
        throw CheckpointError("checkpoint optimizer state '" + field + "' of '" + names[q] +
                              "' is missing or does not have the parameter's shape");
      }
      flat.narrow(0, offsets_[q], parameters_[q].numel()).copy_(tensor->second.reshape({-1}));
    }
    shard_state[field] = flat.narrow(0, shard_begin_, shard_size_).clone();
  }
  Checkpoint shard_form;
  shard_form.optimizer = name_;
  shard_form.optimizer_state[kShard] = std::move(shard_state);
  NamedTensors shard_name;
  shard_name.insert(kShard, shard_);
  restore_optimizer(shard_form, *inner_, shard_name);
}

int64_t ShardedOptimizer::state_bytes() const {
  return optimizer_state_bytes(*inner_);
}

int64_t ShardedOptimizer::gradient_bytes() const {
  return bytes_of(shard_grad_) + train::gradient_bytes(parameters_);
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
  NamedTensors named;
  for (const auto& p : parameters) named.insert("p" + std::to_string(named.size()), p);
  Checkpoint form;
  capture_optimizer(form, optimizer, named);
  int64_t total = 0;
  for (const auto& [name, fields] : form.optimizer_state) {
    for (const auto& [field, tensor] : fields) total += bytes_of(tensor);
  }
  return total;
}

int64_t gradient_bytes(const std::vector<torch::Tensor>& parameters) {
  int64_t total = 0;
  for (const torch::Tensor& p : unique_parameters(parameters)) total += bytes_of(p.grad());
  return total;
}

}  // namespace pipetrain::train
