// Two layers for skip connections in a torch::nn::Sequential, built on stage/skip.h:
// SkipStash("a") stashes its input under "a" and passes it on; SkipPopAdd("a") returns its input
// plus what was stashed under "a", passed through an optional projection module when the
// residual changes shape (ResNet's strided 1x1 convolution shortcut).
//
//   ... -> SkipStash("b1") -> conv -> bn -> relu -> conv -> bn -> SkipPopAdd("b1") -> ...
//              |                                                      ^
//              +-------------- stash("b1", x) ------ pop("b1") -------+   y + projection(x)
//
// Because the two ends are separate layers, any number of layers and stage boundaries may sit
// between them: the pipeline runtime carries the stashed tensor to the stage that pops it, and
// its gradient back. Run sequentially (`model->forward(x)`) the pair is exactly
// `y + projection(x)`, on the calling thread's default skip context.
//
// Example:
//   torch::nn::Sequential model(Linear(4, 8), SkipStash("a"), Linear(8, 8), Tanh(),
//                               SkipPopAdd("a"), Linear(8, 1));   // residual around 2 layers
//   SkipPopAdd down(SkipPopAddOptions("b").projection(            // 32 -> 64 channels, stride 2
//       torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 1).stride(2))));
//
// Ownership: SkipPopAdd owns a clone of options.projection(), registered as its child
// "projection" (parameters "projection.weight", ...); the module in the options is a prototype
// only, as torch::nn::TransformerEncoder treats its layer. Thread-safety: as any module;
// stash/pop act on the calling thread's skip context.
#pragma once

#include <ostream>
#include <string>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

namespace pipetrain {

// Stashes its input under `name` and returns it unchanged.
class SkipStashImpl : public torch::nn::Cloneable<SkipStashImpl> {
 public:
  explicit SkipStashImpl(std::string name) : name_(std::move(name)) {}
  void reset() override {}
  torch::Tensor forward(torch::Tensor input);
  const std::string& name() const { return name_; }
  void pretty_print(std::ostream& stream) const override;

 private:
  std::string name_;
};
TORCH_MODULE(SkipStash);

struct SkipPopAddOptions {
  /* implicit */ SkipPopAddOptions(std::string name) : name_(std::move(name)) {}
  /// The skip to pop; must match an earlier SkipStash.
  TORCH_ARG(std::string, name);
  /// Applied to the popped tensor before the addition, so that a residual that changes channels
  /// or resolution matches the main path (e.g. a strided 1x1 Conv2d). Must take and return one
  /// tensor and be Cloneable. Default: none (the shapes must then match).
  TORCH_ARG(torch::nn::AnyModule, projection);

 public:  // TORCH_ARG leaves the section private
  /// Shorthand for projection(torch::nn::AnyModule(module)), e.g. projection(Conv2d(...)).
  template <typename ModuleType>
  SkipPopAddOptions& projection(const torch::nn::ModuleHolder<ModuleType>& module) {
    projection_ = torch::nn::AnyModule(module);
    return *this;
  }
};

// Pops `name` and returns input + projection(popped) (projection = identity when absent).
class SkipPopAddImpl : public torch::nn::Cloneable<SkipPopAddImpl> {
 public:
  explicit SkipPopAddImpl(SkipPopAddOptions options);
  explicit SkipPopAddImpl(const std::string& name) : SkipPopAddImpl(SkipPopAddOptions(name)) {}
  void reset() override;
  torch::Tensor forward(torch::Tensor input);
  const std::string& name() const { return options.name(); }
  void pretty_print(std::ostream& stream) const override;

  SkipPopAddOptions options;
  torch::nn::AnyModule projection;  // empty without a projection
};
TORCH_MODULE(SkipPopAdd);

}  // namespace pipetrain
