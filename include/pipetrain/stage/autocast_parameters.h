// Parameters that reach the computation only through autocast's casts.
//
// Under bf16 (or fp16) a stage runs its layers under autocast and keeps float32 parameters
// (stage/precision.h). A matmul or convolution reads its weight as the autocast dtype: it sees
// round(w), never w. For a parameter that only such ops read, any float32 value that rounds to
// the same round(w) computes the same forward and the same gradients, so ZeRO-3 may all-gather it
// in the autocast dtype (half the bytes) and widen it on arrival, and the step stays exact
// (train/sharded_optimizer.h). A norm's weight, an embedding table or a bias added outside a
// linear is read as float32 and does not qualify.
//
//   torch::nn::Linear, Conv1d/2d/3d     weight and bias (linear, conv: autocast's lower-precision
//                                       list on CPU and CUDA)
//   a module deriving AutocastCastParameters   what its autocast_cast_parameters() names: its own
//                                       parameters or its descendants' (a Llama attention names
//                                       its projections' weights, the way its forward uses them)
//   anything else                       nothing (the safe answer for a module we cannot read)
//
// A parameter qualifies when, for every module that registers it, that module or an ancestor of
// it names it: a weight tied between a head (which names it) and an embedding (which reads it in
// float32) does not.
#pragma once

#include <set>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

namespace pipetrain {

// Mix-in for a module whose forward reads some of its own parameters only through ops autocast
// casts to its lower precision (at::linear, at::matmul, convolutions; a custom autograd function
// whose backward casts them as autocast would).
class AutocastCastParameters {
 public:
  virtual ~AutocastCastParameters() = default;
  // Parameters of this module or its descendants that its forward reads only through such ops.
  virtual std::vector<torch::Tensor> autocast_cast_parameters() const = 0;
};

// The parameters of `root` and its descendants that qualify (above), each once.
std::vector<torch::Tensor> autocast_cast_parameters(const torch::nn::Module& root);

// The float32 ones of autocast_cast_parameters(root), by TensorImpl: those a narrower dtype can
// stand in for (autocast casts float32 only; a double stays double, a half is what it is).
std::set<const void*> narrowable_parameters(const torch::nn::Module& root);

}  // namespace pipetrain
