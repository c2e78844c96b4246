// Auxiliary losses a layer adds from inside the pipeline (a mixture of experts' load-balancing
// term): the layer attaches its term to its output, and the backward gives the term the gradient
// it would have if weight x coefficient x term had been added to the step's loss, with no tensor
// sent to the last stage for it (Megatron's MoEAuxLossAutoScaler).
//
//   y = attach_auxiliary_loss(y, term, coefficient)   forward: y unchanged
//   backward:  dL/dy passes through; dL/dterm = coefficient x auxiliary_loss_weight()
//
// The weight is the current micro-batch's share of the step's loss (its counted targets over the
// batch's), set by the runtime around each micro-batch's forward and recompute
// (AuxiliaryLossScope); 1 outside any (one micro-batch, the whole batch). So a pipeline of M
// micro-batches and one process at the same M micro-batches add the same terms. fp16's loss scale
// is not applied to it (the trainer refuses the two together).
//
// Thread-safety: the weight is per thread (each pipeline rank's thread sets its own).
#pragma once

#include <torch/types.h>

namespace pipetrain {

class AuxiliaryLossScope {
 public:
  explicit AuxiliaryLossScope(double weight);
  ~AuxiliaryLossScope();
  AuxiliaryLossScope(const AuxiliaryLossScope&) = delete;
  AuxiliaryLossScope& operator=(const AuxiliaryLossScope&) = delete;

 private:
  double previous_;
};

// The calling thread's current weight (1 outside any scope).
double auxiliary_loss_weight();

// `y` itself, with `term` (a scalar that requires grad) attached as above. Where `term` does not
// require grad (no grad mode, inference), `y` unchanged.
torch::Tensor attach_auxiliary_loss(const torch::Tensor& y, const torch::Tensor& term,
                                    double coefficient);

}  // namespace pipetrain
