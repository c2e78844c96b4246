// autocast_linear: torch::linear that, under autocast, keeps its float32 parameters for the
// backward and casts them again there, instead of keeping their casts.
//
// Under autocast (bf16 or fp16), torch::linear casts its float32 weight to the compute dtype
// and the product saves that cast for the backward: every micro-batch between its forward and its
// backward holds a copy of the weights it went through, half their float32 bytes (1.3 GB for
// half of a Qwen2-1.5B at one micro-batch in flight). autocast_linear saves the parameter itself
// (already held, or gathered again by ZeRO-3 for the backward, as in float32) and the input's
// cast, and casts the weight again in the backward:
//
//   forward    y = linear(cast(x), cast(w), cast(b))            saves cast(x) and w
//   backward   dx = dy . cast(w), dw = dy^T . cast(x), db = sum(dy)   (only those asked for)
//
// The same operations as autograd's own formulas for linear under autocast (matrix products of
// the same operands in the same layouts, the bias's gradient summed the same way, each gradient
// cast back to its input's dtype), so the bits are torch's. Outside autocast, without grad mode,
// for a weight that is not float32 or an input that is not contiguous (torch then takes other
// routes), it is torch::linear.
//
// Thread-safety: as torch::linear.
#pragma once

#include <torch/types.h>

namespace pipetrain {

// REQUIRES x [..., in] (2 or more dimensions), weight [out, in], bias undefined or [out].
torch::Tensor autocast_linear(const torch::Tensor& x, const torch::Tensor& weight,
                              const torch::Tensor& bias = {});

}  // namespace pipetrain
