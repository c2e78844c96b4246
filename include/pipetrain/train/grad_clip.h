// Gradient clipping by the global L2 norm, split so that a multi-process runtime can sum the
// squared norm across ranks before scaling:
//
//   local  = local_grad_norm_squared(my_parameters)       // each rank, its stages only
//   total  = sqrt(all_reduce_sum(local))                   // the runtime's collective
//   if (total > max_norm) scale_gradients(my_parameters, max_norm / (total + 1e-6))
//
// In one process, clip_grad_norm does all three. Parameters without a gradient are skipped; a
// tensor listed twice (tied weights) counts once.
//
// Thread-safety: none; call while no backward is writing the gradients.
#pragma once

#include <vector>

#include <torch/types.h>

namespace pipetrain::train {

// Sum over the distinct parameters of the squared L2 norm of their .grad(), in double.
double local_grad_norm_squared(const std::vector<torch::Tensor>& parameters);

// Multiplies every distinct parameter's .grad() by `factor`, in place.
void scale_gradients(const std::vector<torch::Tensor>& parameters, double factor);

// The factor clip_grad_norm applies: max_norm / (total_norm + 1e-6) when total_norm > max_norm,
// else 1. REQUIRES max_norm > 0.
double clip_factor(double total_norm, double max_norm);

// Clips the gradients so their global norm is at most max_norm; returns the norm before
// clipping (non-finite when a gradient is; then nothing is scaled). REQUIRES max_norm > 0.
double clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm);

}  // namespace pipetrain::train
