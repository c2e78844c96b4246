// ScriptLayer and the TorchScript -> Sequential conversion (include/pipetrain/stage/torchscript.h).
#include "pipetrain/stage/torchscript.h"

#include <fstream>
#include <utility>

#include <c10/util/Exception.h>
#include <torch/nn/modules/container/sequential.h>

#include "pipetrain/base/check.h"

namespace pipetrain {
namespace {

std::string type_name(const torch::jit::Module& module) {
  const auto& name = module.type()->name();
  return name ? name->qualifiedName() : std::string("<unnamed>");
}

std::string describe(const std::string& layer_name, const torch::jit::Module& module) {
  return "layer '" + (layer_name.empty() ? std::string("<root>") : layer_name) + "' (" +
         type_name(module) + ")";
}

// The jit deep copy gives parameters that are copies of the originals; make each one a leaf that
// requires grad exactly like its original, and store it back into the copy's slot.
void restore_leaf_parameters(const torch::jit::Module& original, torch::jit::Module& copy) {
  torch::NoGradGuard no_grad;
  for (const auto& parameter : original.named_parameters(/*recurse=*/false)) {
    torch::Tensor fresh = copy.attr(parameter.name).toTensor().detach().clone();
    fresh.set_requires_grad(parameter.value.requires_grad());
    copy.register_parameter(parameter.name, fresh, /*is_buffer=*/false);
  }
  for (const auto& buffer : original.named_buffers(/*recurse=*/false)) {
    copy.register_buffer(buffer.name, copy.attr(buffer.name).toTensor().detach().clone());
  }
  for (const auto& child : original.named_children()) {
    torch::jit::Module child_copy = copy.attr(child.name).toModule();
    restore_leaf_parameters(child.value, child_copy);
  }
}

}  // namespace

ScriptLayerImpl::ScriptLayerImpl(torch::jit::Module module, std::string name)
    : module_(std::move(module)), name_(std::move(name)) {
  reset();
}

void ScriptLayerImpl::reset() {
  // register_parameter stores the given tensor itself (no copy), which is what makes the sharing
  // work. Pass the tensor's own requires_grad so frozen jit parameters stay frozen.
  for (const auto& parameter : module_.named_parameters(/*recurse=*/false)) {
    register_parameter(parameter.name, parameter.value, parameter.value.requires_grad());
  }
  for (const auto& buffer : module_.named_buffers(/*recurse=*/false)) {
    register_buffer(buffer.name, buffer.value);
  }
  for (const auto& child : module_.named_children()) {
    std::string child_name = name_.empty() ? child.name : name_ + "." + child.name;
    register_module(child.name, ScriptLayer(child.value, std::move(child_name)));
  }
  // Mirror the jit module's mode; Module::train (not ours) so the jit module is left as it is.
  torch::nn::Module::train(module_.is_training());
}

torch::Tensor ScriptLayerImpl::forward(torch::Tensor input) {
  PIPETRAIN_CHECK_INPUT(
      module_.find_method("forward").has_value(), describe(name_, module_),
      " has no forward method; only modules with forward(Tensor) -> Tensor can be layers");
  torch::jit::IValue output = module_.forward({std::move(input)});
  PIPETRAIN_CHECK_INPUT(
      output.isTensor(), describe(name_, module_), " returned ", output.tagKind(),
      " but a pipeline layer must return one Tensor; wrap the layer so it returns a Tensor");
  return output.toTensor();
}

void ScriptLayerImpl::train(bool on) {
  module_.train(on);  // recursive over the jit submodules
  torch::nn::Module::train(on);
}

std::shared_ptr<torch::nn::Module> ScriptLayerImpl::clone(
    const torch::optional<torch::Device>& device) const {
  torch::jit::Module copy = module_.deepcopy();
  restore_leaf_parameters(module_, copy);
  auto layer = std::make_shared<ScriptLayerImpl>(std::move(copy), name_);
  if (device) layer->to(*device);
  layer->train(is_training());
  return layer;
}

void ScriptLayerImpl::pretty_print(std::ostream& stream) const {
  stream << "pipetrain::ScriptLayer(" << type_name(module_) << ")";
}

torch::nn::Sequential sequential_from_torchscript(const torch::jit::Module& module) {
  std::string own;
  for (const auto& parameter : module.named_parameters(/*recurse=*/false)) {
    own += (own.empty() ? "" : ", ") + parameter.name;
  }
  for (const auto& buffer : module.named_buffers(/*recurse=*/false)) {
    own += (own.empty() ? "" : ", ") + buffer.name;
  }
  PIPETRAIN_CHECK_INPUT(
      own.empty(), "TorchScript module ", type_name(module),
      " has parameters or buffers of its own (", own,
      "); pipetrain runs only its children, in order, so these would never be used or "
      "trained. Move them into a child module");
  torch::nn::Sequential sequential;
  for (const auto& child : module.named_children()) {
    sequential->push_back(std::string(child.name), ScriptLayer(child.value, child.name));
  }
  PIPETRAIN_CHECK_INPUT(
      sequential->size() > 0, "TorchScript module ", type_name(module),
      " has no child modules; pipetrain needs its layers as children, e.g. a scripted "
      "nn.Sequential");
  sequential->train(module.is_training());
  return sequential;
}

torch::nn::Sequential load_torchscript_sequential(const std::string& path) {
  PIPETRAIN_CHECK(std::ifstream(path).good(), FileError, "cannot open TorchScript model '", path,
                  "': no such file or not readable; save one from Python with "
                  "torch.jit.save(torch.jit.script(model), path)");
  torch::jit::Module module;
  try {
    module = torch::jit::load(path);
  } catch (const c10::Error& error) {
    throw BadInput(
        c10::str("'", path, "' is not a TorchScript archive (", error.msg(),
                 "); save one from Python with torch.jit.save(torch.jit.script(model), path)"));
  }
  try {
    return sequential_from_torchscript(module);
  } catch (const BadInput& error) {
    throw BadInput(c10::str("TorchScript model '", path, "': ", error.message()));
  } catch (const c10::Error& error) {
    throw BadInput(c10::str("TorchScript model '", path, "': ", error.msg()));
  }
}

}  // namespace pipetrain
