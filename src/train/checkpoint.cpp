// Checkpoints by parameter name (pipetrain/train/checkpoint.h).
#include "pipetrain/train/checkpoint.h"

#include "pipetrain/base/message_of.h"

#include <set>
#include <unordered_map>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include "pipetrain/base/atomic_file.h"
#include "pipetrain/parallel/expert_parallel.h"
#include "pipetrain/runtime/tensor_io.h"
#include "pipetrain/train/optimizer.h"

namespace pipetrain::train {
namespace {

constexpr const char* kFormat = "pipetrain-checkpoint";
constexpr int64_t kVersion = 1;

torch::Tensor cpu_copy(const torch::Tensor& tensor) {
  return tensor.detach().to(torch::kCPU).clone().contiguous();
}

// LibTorch's optimizers key their per-parameter state by the parameter's TensorImpl.
void* state_key(const torch::Tensor& parameter) {
  return parameter.unsafeGetTensorImpl();
}

std::string join(const std::vector<std::string>& names, size_t limit = 10) {
  std::string out;
  for (size_t n = 0; n < names.size() && n < limit; ++n) out += (n ? ", " : "") + names[n];
  if (names.size() > limit) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

std::string shape(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

c10::Dict<std::string, at::Tensor> to_dict(const std::map<std::string, torch::Tensor>& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) dict.insert(name, tensor);
  return dict;
}

std::map<std::string, torch::Tensor> from_dict(const c10::IValue& value, const std::string& field,
                                               const std::string& source) {
  if (!value.isGenericDict()) {
    throw CheckpointError("checkpoint '" + source + "': field '" + field + "' is not a dict");
  }
  std::map<std::string, torch::Tensor> out;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) {
      throw CheckpointError("checkpoint '" + source + "': field '" + field +
                            "' must map names to tensors");
    }
    out.emplace(entry.key().toStringRef(), entry.value().toTensor());
  }
  return out;
}

const c10::IValue& field(const c10::impl::GenericDict& dict, const std::string& name,
                         const std::string& source) {
  auto found = dict.find(name);
  if (found == dict.end()) {
    throw CheckpointError("checkpoint '" + source + "' has no field '" + name +
                          "'; it was not written by this version of pipetrain");
  }
  return found->value();
}

std::string dtype_name(const torch::Tensor& t) {
  return std::string(c10::toString(t.scalar_type()));
}

// Whether copying `saved` into `target` rounds: the target's dtype does not hold every value of
// the saved one (float64 into float32, float32 into bfloat16). Widening (bfloat16 into float32,
// the master weights of a bf16 run into an fp32 one) is exact.
bool loses_precision(const torch::Tensor& saved, const torch::Tensor& target) {
  return c10::promoteTypes(saved.scalar_type(), target.scalar_type()) != target.scalar_type();
}

// Copies saved tensors into live ones by name; collects every problem before throwing.
void restore_named(const std::map<std::string, torch::Tensor>& saved, const NamedTensors& live,
                   const std::string& what, NameMatch match) {
  std::vector<std::string> missing, mismatched, unexpected, narrowed;
  for (const auto& item : live) {
    auto found = saved.find(item.key());
    if (found == saved.end()) {
      missing.push_back(item.key());
    } else if (found->second.sizes() != item.value().sizes()) {
      mismatched.push_back(item.key() + " (checkpoint " + shape(found->second) + ", model " +
                           shape(item.value()) + ")");
    } else if (loses_precision(found->second, item.value())) {
      narrowed.push_back(item.key() + " (checkpoint " + dtype_name(found->second) + ", model " +
                         dtype_name(item.value()) + ")");
    }
  }
  if (match == NameMatch::kExact) {
    for (const auto& [name, tensor] : saved) {
      if (!live.contains(name)) unexpected.push_back(name);
    }
  }
  if (!missing.empty() || !mismatched.empty() || !unexpected.empty()) {
    std::string message = "checkpoint does not fit the model's " + what + ":";
    if (!missing.empty()) message += " missing from the checkpoint: " + join(missing) + ";";
    if (!unexpected.empty()) message += " not in the model: " + join(unexpected) + ";";
    if (!mismatched.empty()) message += " shape mismatch: " + join(mismatched) + ";";
    message += " was it written for another model or other model options?";
    throw CheckpointError(message);
  }
  if (!narrowed.empty()) {
    throw CheckpointError("checkpoint's " + what +
                          " would lose precision in the model's dtype: " + join(narrowed) +
                          "; load it into a model of the checkpoint's dtype (a wider one "
                          "converts losslessly)");
  }
  torch::NoGradGuard no_grad;
  for (const auto& item : live) {
    torch::Tensor target = item.value();
    if (target.is_meta()) continue;  // another rank's entry (models/llama.h): checked, not held
    target.copy_(saved.at(item.key()));
  }
}

template <typename State>
std::map<std::string, torch::Tensor> adam_fields(const State& state, bool copy) {
  auto take = [copy](const torch::Tensor& t) { return copy ? cpu_copy(t) : t.detach(); };
  std::map<std::string, torch::Tensor> fields{{"step", torch::tensor(state.step(), torch::kInt64)},
                                              {"exp_avg", take(state.exp_avg())},
                                              {"exp_avg_sq", take(state.exp_avg_sq())}};
  if (state.max_exp_avg_sq().defined()) fields["max_exp_avg_sq"] = take(state.max_exp_avg_sq());
  return fields;
}

template <typename State>
std::unique_ptr<State> adam_state(const std::map<std::string, torch::Tensor>& fields,
                                  const torch::Tensor& parameter) {
  auto state = std::make_unique<State>();
  state->step(fields.at("step").item<int64_t>());
  state->exp_avg(fields.at("exp_avg").to(parameter.options()).clone());
  state->exp_avg_sq(fields.at("exp_avg_sq").to(parameter.options()).clone());
  auto max = fields.find("max_exp_avg_sq");
  if (max != fields.end()) state->max_exp_avg_sq(max->second.to(parameter.options()).clone());
  return state;
}

}  // namespace

void capture_model(Checkpoint& checkpoint, const NamedTensors& parameters,
                   const NamedTensors& buffers) {
  for (const auto& item : parameters) checkpoint.parameters[item.key()] = cpu_copy(item.value());
  for (const auto& item : buffers) checkpoint.buffers[item.key()] = cpu_copy(item.value());
}

void capture_model(Checkpoint& checkpoint, const torch::nn::Module& model) {
  capture_model(checkpoint, model.named_parameters(), model.named_buffers());
}

namespace {

void capture_optimizer_state(Checkpoint& checkpoint, const torch::optim::Optimizer& optimizer,
                             const NamedTensors& parameters, bool copy) {
  checkpoint.optimizer = optimizer_name(optimizer);
  if (checkpoint.optimizer.empty()) {
    throw CheckpointError(
        "checkpoint: cannot capture the state of this optimizer type; "
        "use sgd, adam or adamw (make_optimizer)");
  }
  const auto& states = optimizer.state();
  for (const auto& item : parameters) {
    auto found = states.find(state_key(item.value()));
    if (found == states.end()) continue;  // no step taken for it yet
    const torch::optim::OptimizerParamState* state = found->second.get();
    std::map<std::string, torch::Tensor> fields;
    if (checkpoint.optimizer == "sgd") {
      const auto& sgd = static_cast<const torch::optim::SGDParamState&>(*state);
      if (sgd.momentum_buffer().defined())
        fields["momentum_buffer"] =
            copy ? cpu_copy(sgd.momentum_buffer()) : sgd.momentum_buffer().detach();
    } else if (checkpoint.optimizer == "adam") {
      fields = adam_fields(static_cast<const torch::optim::AdamParamState&>(*state), copy);
    } else {
      fields = adam_fields(static_cast<const torch::optim::AdamWParamState&>(*state), copy);
    }
    if (!fields.empty()) checkpoint.optimizer_state[item.key()] = std::move(fields);
  }
}

}  // namespace

void capture_optimizer(Checkpoint& checkpoint, const torch::optim::Optimizer& optimizer,
                       const NamedTensors& parameters) {
  capture_optimizer_state(checkpoint, optimizer, parameters, /*copy=*/true);
}

void capture_optimizer_views(Checkpoint& checkpoint, const torch::optim::Optimizer& optimizer,
                             const NamedTensors& parameters) {
  capture_optimizer_state(checkpoint, optimizer, parameters, /*copy=*/false);
}

void capture_torch_rng(Checkpoint& checkpoint) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  checkpoint.torch_rng_state = generator.get_state();
}

void merge_checkpoint(Checkpoint& into, const Checkpoint& part) {
  auto merge_tensors = [](std::map<std::string, torch::Tensor>& to,
                          const std::map<std::string, torch::Tensor>& from, const char* what) {
    for (const auto& [name, tensor] : from) {
      auto [it, inserted] = to.emplace(name, tensor);
      if (!inserted && !it->second.equal(tensor)) {
        throw CheckpointError(std::string("merging checkpoint parts: ") + what + " '" + name +
                              "' differs between two parts (tied weights out of sync?)");
      }
    }
  };
  merge_tensors(into.parameters, part.parameters, "parameter");
  merge_tensors(into.buffers, part.buffers, "buffer");
  if (into.optimizer.empty()) into.optimizer = part.optimizer;
  if (!part.optimizer.empty() && part.optimizer != into.optimizer) {
    throw CheckpointError("merging checkpoint parts: optimizer '" + part.optimizer +
                          "' differs from '" + into.optimizer + "'");
  }
  for (const auto& [name, fields] : part.optimizer_state)
    into.optimizer_state.emplace(name, fields);
  if (!into.torch_rng_state.defined()) into.torch_rng_state = part.torch_rng_state;
  for (const auto& [j, state] : part.stage_rng_states) into.stage_rng_states.emplace(j, state);
  if (into.loader_state.empty()) into.loader_state = part.loader_state;
  if (into.metadata.empty()) into.metadata = part.metadata;
  into.step = std::max(into.step, part.step);
  if (std::make_pair(part.epoch, part.batch) > std::make_pair(into.epoch, into.batch)) {
    into.epoch = part.epoch;
    into.batch = part.batch;
  }
}

std::string serialize_checkpoint(const Checkpoint& c) {
  c10::impl::GenericDict root(c10::StringType::get(), c10::AnyType::get());
  root.insert("format", std::string(kFormat));
  root.insert("version", kVersion);
  root.insert("parameters", to_dict(c.parameters));
  root.insert("buffers", to_dict(c.buffers));
  root.insert("optimizer", c.optimizer);
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [name, fields] : c.optimizer_state) state.insert(name, to_dict(fields));
  root.insert("optimizer_state", state);
  root.insert("step", c.step);
  root.insert("epoch", c.epoch);
  root.insert("batch", c.batch);
  root.insert("torch_rng_state",
              c.torch_rng_state.defined() ? c.torch_rng_state : torch::empty({0}, torch::kUInt8));
  root.insert("loader_state", c.loader_state);
  root.insert("metadata", c.metadata.dump());
  std::map<std::string, torch::Tensor> stage_rng;
  for (const auto& [j, state] : c.stage_rng_states) stage_rng[std::to_string(j)] = state;
  root.insert("stage_rng_states", to_dict(stage_rng));
  std::vector<char> bytes = torch::pickle_save(root);
  return std::string(bytes.begin(), bytes.end());
}

Checkpoint deserialize_checkpoint(const std::string& bytes, const std::string& source) {
  c10::IValue value;
  try {
    value = load_pickle(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const std::exception& e) {
    // One line: c10's message without its frame list (a TorchScript archive is refused here by
    // the unpickler, whose message would otherwise carry every C++ frame).
    const std::string message = message_of(e);
    throw CheckpointError("'" + source +
                          "' is not a pipetrain checkpoint (unreadable torch pickle): " +
                          message.substr(0, std::min(message.find('\n'), std::size_t{300})));
  }
  if (!value.isGenericDict()) {
    throw CheckpointError("'" + source + "' is not a pipetrain checkpoint (not a dict)");
  }
  const c10::impl::GenericDict root = value.toGenericDict();
  const c10::IValue format = field(root, "format", source);
  if (!format.isString() || format.toStringRef() != kFormat) {
    throw CheckpointError("'" + source + "' is not a pipetrain checkpoint (format field)");
  }
  int64_t version = field(root, "version", source).toInt();
  if (version != kVersion) {
    throw CheckpointError("checkpoint '" + source + "' has version " + std::to_string(version) +
                          "; this pipetrain reads version " + std::to_string(kVersion));
  }
  Checkpoint c;
  c.parameters = from_dict(field(root, "parameters", source), "parameters", source);
  c.buffers = from_dict(field(root, "buffers", source), "buffers", source);
  c.optimizer = field(root, "optimizer", source).toStringRef();
  for (const auto& entry : field(root, "optimizer_state", source).toGenericDict()) {
    c.optimizer_state[entry.key().toStringRef()] =
        from_dict(entry.value(), "optimizer_state/" + entry.key().toStringRef(), source);
  }
  c.step = field(root, "step", source).toInt();
  c.epoch = field(root, "epoch", source).toInt();
  c.batch = field(root, "batch", source).toInt();
  torch::Tensor rng = field(root, "torch_rng_state", source).toTensor();
  if (rng.numel() > 0) c.torch_rng_state = rng;
  c.loader_state = field(root, "loader_state", source).toStringRef();
  if (root.contains("stage_rng_states")) {
    for (const auto& [j, state] :
         from_dict(root.at("stage_rng_states"), "stage_rng_states", source)) {
      try {
        c.stage_rng_states[std::stoi(j)] = state;
      } catch (const std::exception&) {
        throw CheckpointError("checkpoint '" + source + "': stage_rng_states has key '" + j +
                              "', not a stage index");
      }
    }
  }
  try {
    c.metadata = nlohmann::json::parse(field(root, "metadata", source).toStringRef());
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("checkpoint '" + source + "': metadata is not JSON: " + e.what());
  }
  return c;
}

void save_checkpoint(const std::string& path, const Checkpoint& checkpoint) {
  write_file_atomically(path, serialize_checkpoint(checkpoint));
}

size_t save_parameters(const std::string& path, const Checkpoint& checkpoint,
                       const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& item : model.named_parameters()) {
    const auto found = checkpoint.parameters.find(item.key());
    if (found == checkpoint.parameters.end()) {
      throw CheckpointError("the checkpoint has no parameter '" + item.key() +
                            "' of the model; nothing written to " + path);
    }
    named.emplace_back(item.key(), found->second);
  }
  std::set<std::string> held;
  for (const auto& item : named) held.insert(item.first);
  for (const auto& [name, tensor] : checkpoint.parameters) {
    if (!held.count(name) && parallel::is_expert_parameter(name)) named.emplace_back(name, tensor);
  }
  save_named_tensors(path, named);
  return named.size();
}

Checkpoint load_checkpoint(const std::string& path) {
  return deserialize_checkpoint(read_file(path), path);
}

void restore_model(const Checkpoint& checkpoint, const NamedTensors& parameters,
                   const NamedTensors& buffers, NameMatch match) {
  restore_named(checkpoint.parameters, parameters, "parameters", match);
  restore_named(checkpoint.buffers, buffers, "buffers", match);
}

void restore_model(const Checkpoint& checkpoint, torch::nn::Module& model, NameMatch match) {
  restore_model(checkpoint, model.named_parameters(), model.named_buffers(), match);
}

void keep_tensor_parallel_slice(Checkpoint& checkpoint, const TensorParallelSlice& slice) {
  if (slice.size <= 1) return;
  for (auto& [name, tensor] : checkpoint.parameters) {
    const std::optional<parallel::TensorSplit> split = slice.split(name);
    if (!split) continue;
    const int64_t dim = split->dim;
    const int parts = split->parts(slice.size);
    const torch::Tensor whole = tensor;
    if (dim >= whole.dim() || parts < 1 || whole.size(dim) % parts != 0) {
      throw CheckpointError("parameter '" + name + "' of shape " + shape(whole) +
                            " cannot be cut into " + std::to_string(parts) +
                            " tensor-parallel slices along dimension " + std::to_string(dim));
    }
    const int64_t length = whole.size(dim) / parts;
    auto cut = [&](const torch::Tensor& t) {
      return t.narrow(dim, split->part_of(slice.rank) * length, length).clone();
    };
    tensor = cut(whole);
    auto state = checkpoint.optimizer_state.find(name);
    if (state == checkpoint.optimizer_state.end()) continue;
    for (auto& [field, value] : state->second) {
      if (value.sizes() == whole.sizes()) value = cut(value);
    }
  }
}

Checkpoint load_for_resume(const std::string& path, torch::nn::Module& model,
                           const std::string& optimizer, const TensorParallelSlice& slice) {
  Checkpoint checkpoint = load_checkpoint(path);  // FileError names the path
  keep_tensor_parallel_slice(checkpoint, slice);
  try {
    restore_model(checkpoint, model, NameMatch::kExact);
  } catch (const CheckpointError& error) {
    throw CheckpointError(path + ": " + error.what());
  }
  if (checkpoint.optimizer != optimizer) {
    throw CheckpointError(path + " was written with --optimizer " + checkpoint.optimizer +
                          " but this run uses --optimizer " + optimizer +
                          "; resume with the same optimizer");
  }
  return checkpoint;
}

void restore_optimizer(const Checkpoint& checkpoint, torch::optim::Optimizer& optimizer,
                       const NamedTensors& parameters) {
  const std::string name = optimizer_name(optimizer);
  if (checkpoint.optimizer_state.empty()) return;  // no step was taken before the save
  if (name != checkpoint.optimizer) {
    throw CheckpointError("checkpoint holds '" + checkpoint.optimizer +
                          "' optimizer state but this run uses '" + name +
                          "'; resume with --optimizer " + checkpoint.optimizer);
  }
  std::set<const void*> owned;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& parameter : group.params()) owned.insert(parameter.unsafeGetTensorImpl());
  }
  auto& states = optimizer.state();
  for (const auto& item : parameters) {
    const torch::Tensor& parameter = item.value();
    if (!owned.count(parameter.unsafeGetTensorImpl())) continue;
    auto found = checkpoint.optimizer_state.find(item.key());
    if (found == checkpoint.optimizer_state.end()) continue;
    std::map<std::string, torch::Tensor> fields = found->second;
    for (auto& [field_name, tensor] : fields) {
      if (tensor.is_meta()) tensor = optimizer_state_value(checkpoint, item.key(), field_name);
    }
    for (const auto& [field_name, tensor] : fields) {
      if (field_name != "step" && tensor.sizes() != parameter.sizes()) {
        throw CheckpointError("checkpoint optimizer state '" + field_name + "' of '" + item.key() +
                              "' has shape " + shape(tensor) + " but the parameter has " +
                              shape(parameter));
      }
      if (field_name != "step" && loses_precision(tensor, parameter)) {
        throw CheckpointError("checkpoint optimizer state '" + field_name + "' of '" + item.key() +
                              "' is " + dtype_name(tensor) + " and would lose precision in the " +
                              "parameter's " + dtype_name(parameter) +
                              "; load it into a model of the checkpoint's dtype");
      }
    }
    try {
      if (name == "sgd") {
        auto state = std::make_unique<torch::optim::SGDParamState>();
        auto buffer = fields.find("momentum_buffer");
        if (buffer != fields.end()) {
          state->momentum_buffer(buffer->second.to(parameter.options()).clone());
        }
        states[state_key(parameter)] = std::move(state);
      } else if (name == "adam") {
        states[state_key(parameter)] = adam_state<torch::optim::AdamParamState>(fields, parameter);
      } else {
        states[state_key(parameter)] = adam_state<torch::optim::AdamWParamState>(fields, parameter);
      }
    } catch (const std::out_of_range&) {
      throw CheckpointError("checkpoint optimizer state of '" + item.key() +
                            "' lacks a field that '" + name + "' needs");
    }
  }
}

torch::Tensor optimizer_state_value(const Checkpoint& checkpoint, const std::string& parameter,
                                    const std::string& field) {
  const auto fields = checkpoint.optimizer_state.find(parameter);
  const auto found = fields == checkpoint.optimizer_state.end() ? decltype(fields->second.end()){}
                                                                : fields->second.find(field);
  if (fields == checkpoint.optimizer_state.end() || found == fields->second.end()) {
    throw CheckpointError("checkpoint holds no optimizer state '" + field + "' of '" + parameter +
                          "'");
  }
  const torch::Tensor& tensor = found->second;
  if (!tensor.is_meta()) return tensor;
  if (!checkpoint.optimizer_range) {
    throw CheckpointError("checkpoint optimizer state '" + field + "' of '" + parameter +
                          "' was not read and the checkpoint gives no way to read it");
  }
  return checkpoint.optimizer_range(parameter, field, 0, tensor.numel()).view(tensor.sizes());
}

void restore_torch_rng(const Checkpoint& checkpoint) {
  if (!checkpoint.torch_rng_state.defined()) {
    throw CheckpointError("checkpoint holds no torch generator state to restore");
  }
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(checkpoint.torch_rng_state);
}

}  // namespace pipetrain::train
