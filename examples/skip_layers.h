// StashSkip and AddSkip: a residual connection as two separate entries of a Sequential.
//
//   ... -> StashSkip("b1") -> conv -> bn -> relu -> conv -> bn -> AddSkip("b1") -> ...
//              |                                                   ^
//              +------------- stash("b1", x) ---- pop("b1") -------+   out = y + projection(x)
//
// Because the two ends are separate layers, the pipeline may cut the Sequential between them: the
// runtime carries the stashed tensor across the stage boundary (pipetrain/stage/skip.h), and the
// gradient flows back through it to the stashing stage. Run sequentially (`seq->forward(x)`) the
// pair is exactly `y + projection(x)`, using the calling thread's default skip context.
//
// These live in examples/ because the runtime does not ship skip layers of its own yet; they only
// use the public stash/pop API and may move to include/pipetrain/stage/ unchanged.
//
// Ownership: AddSkip owns its optional 1x1 projection convolution. Thread-safety: as any module;
// stash/pop act on thread-local state.
#pragma once

#include <string>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

namespace pipetrain::examples {

// Stashes its input under `name` and returns it unchanged.
class StashSkipImpl : public torch::nn::Cloneable<StashSkipImpl> {
 public:
  explicit StashSkipImpl(std::string name) : name_(std::move(name)) {}
  void reset() override {}
  torch::Tensor forward(torch::Tensor input);
  const std::string& name() const { return name_; }
  void pretty_print(std::ostream& stream) const override;

 private:
  std::string name_;
};
TORCH_MODULE(StashSkip);

struct AddSkipOptions {
  /* implicit */ AddSkipOptions(std::string name) : name_(std::move(name)) {}
  /// The skip to pop; must match an earlier StashSkip.
  TORCH_ARG(std::string, name);
  /// Input channels of the 1x1 projection applied to the popped tensor when the residual changes
  /// shape; 0 (default) means no projection (the shapes must then match).
  TORCH_ARG(int64_t, projection_in) = 0;
  /// Output channels of the projection. REQUIRES > 0 when projection_in > 0.
  TORCH_ARG(int64_t, projection_out) = 0;
  /// Stride of the projection (2 halves height and width, like a strided block). Default 1.
  TORCH_ARG(int64_t, projection_stride) = 1;
};

// Pops `name` and returns input + projection(popped) (projection = identity when absent).
class AddSkipImpl : public torch::nn::Cloneable<AddSkipImpl> {
 public:
  explicit AddSkipImpl(AddSkipOptions options);
  explicit AddSkipImpl(const std::string& name) : AddSkipImpl(AddSkipOptions(name)) {}
  void reset() override;
  torch::Tensor forward(torch::Tensor input);
  void pretty_print(std::ostream& stream) const override;

  AddSkipOptions options;
  torch::nn::Conv2d projection{nullptr};  // null without a projection
};
TORCH_MODULE(AddSkip);

}  // namespace pipetrain::examples
