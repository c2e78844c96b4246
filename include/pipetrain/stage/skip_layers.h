// Two small layers for skip connections in a torch::nn::Sequential, built on stage/skip.h:
// SkipStash("a") stashes its input under "a" and passes it on; SkipPopAdd("a") returns its input
// plus what was stashed under "a". Between them any number of layers and stage boundaries may
// sit: the pipeline runtime carries the stashed tensor to the stage that pops it, and its
// gradient back.
//
//   torch::nn::Sequential model(Linear(4, 8), SkipStash("a"), Linear(8, 8), Tanh(),
//                               SkipPopAdd("a"), Linear(8, 1));   // residual around 2 layers
//
// Thread-safety: as any module; stash/pop act on the calling thread's skip context.
#pragma once

#include <string>

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

namespace pipetrain {

class SkipStashImpl : public torch::nn::Cloneable<SkipStashImpl> {
 public:
  explicit SkipStashImpl(std::string name) : name_(std::move(name)) {}
  void reset() override {}
  torch::Tensor forward(torch::Tensor input);
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};
TORCH_MODULE(SkipStash);

class SkipPopAddImpl : public torch::nn::Cloneable<SkipPopAddImpl> {
 public:
  explicit SkipPopAddImpl(std::string name) : name_(std::move(name)) {}
  void reset() override {}
  torch::Tensor forward(torch::Tensor input);
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};
TORCH_MODULE(SkipPopAdd);

}  // namespace pipetrain
