// TorchScript modules as pipeline layers: a module saved from Python with
// `torch.jit.save(torch.jit.script(nn.Sequential(...)), path)` becomes a torch::nn::Sequential
// whose layers are the module's children, in order, so the pipeline can cut it into stages.
//
//   Python                                   C++ (sequential_from_torchscript)
//   RecursiveScriptModule                    torch::nn::Sequential
//     (0): Linear    -- "0.weight"             "0": ScriptLayer(jit child "0")  -- "0.weight"
//     (1): ReLU                                "1": ScriptLayer(jit child "1")
//     (2): Block                               "2": ScriptLayer(jit child "2")
//            (attn): MultiheadAttention              "attn": ScriptLayer (holder, no own forward)
//                    -- "2.attn.in_proj_weight"              -- "2.attn.in_proj_weight"
//
// Sharing, not copying: every parameter and buffer of a ScriptLayer IS the jit module's tensor
// (the same TensorImpl), so an optimizer stepping the Sequential's parameters changes what the jit
// module computes with, and `.to(device)` (which swaps data in place) moves both. The Sequential's
// named_parameters()/named_buffers() names equal the TorchScript module's, so a state saved by
// name loads in Python with `model.load_state_dict`.
//
// Modes: train()/eval() on a ScriptLayer (or on the Sequential holding it) also switches the jit
// module's `training` flag, which its dropout and batch-norm read.
//
// Cloning: ScriptLayer::clone() deep-copies the jit module (new tensors, same values; leaf
// parameters keep requires_grad) and wraps the copy, so the clone trains independently. Note that
// torch::nn::Sequential::clone() renames its layers "0", "1", ... (a LibTorch limitation); names
// are unchanged for modules whose children are already named that way, as in nn.Sequential.
//
// Thread-safety: distinct ScriptLayers may run forward on different threads at once (the pipeline
// runs one stage per thread). One ScriptLayer must not run forward on two threads at once while
// its parameters change.
#pragma once

#include <string>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/script.h>

namespace pipetrain {

// One jit module as a torch::nn::Module. Registers the jit module's own parameters and buffers
// (shared tensors), and one ScriptLayer child per jit submodule, recursively, so that names nest
// as in the jit module. forward(x) calls the jit module's forward method.
class ScriptLayerImpl : public torch::nn::Cloneable<ScriptLayerImpl> {
 public:
  // `name` is used in error messages only (e.g. the child name "3").
  explicit ScriptLayerImpl(torch::jit::Module module, std::string name = "");

  // REQUIRES: the jit module has a forward method taking one tensor and returning one tensor.
  // Throws pipetrain::BadInput naming the layer otherwise.
  torch::Tensor forward(torch::Tensor input);

  // Switches this module, its ScriptLayer children and the jit module (recursively).
  void train(bool on = true) override;

  // Re-registers the current jit module's tensors (used by Cloneable; the tensors stay shared).
  void reset() override;

  // Deep copy: a new jit module with copied tensors, moved to `device` when given.
  std::shared_ptr<torch::nn::Module> clone(
      const torch::optional<torch::Device>& device = torch::nullopt) const override;

  void pretty_print(std::ostream& stream) const override;

  const torch::jit::Module& jit_module() const { return module_; }
  const std::string& layer_name() const { return name_; }

 private:
  torch::jit::Module module_;
  std::string name_;
};
TORCH_MODULE(ScriptLayer);

// The layers of `module`: one ScriptLayer per child (named_children(), in order), registered under
// the child's name. The Sequential starts in the jit module's train/eval mode.
// REQUIRES: `module` has at least one child, and no parameters or buffers of its own (they would
// not be trained: only the children run). Throws pipetrain::BadInput saying which otherwise.
torch::nn::Sequential sequential_from_torchscript(const torch::jit::Module& module);

// torch::jit::load(path) followed by sequential_from_torchscript. Throws pipetrain::FileError
// naming `path` when the file is missing or unreadable, pipetrain::BadInput naming it when it is
// not a TorchScript archive or its module cannot be a Sequential.
torch::nn::Sequential load_torchscript_sequential(const std::string& path);

}  // namespace pipetrain
