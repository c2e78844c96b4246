// Mixed precision of a stage: which dtype its layers compute in and what crosses its boundary.
//
//   fp32  everything in float32 (the default)
//   bf16  layers run under autocast (bfloat16 where autocast casts, float32 where it keeps it);
//         the floating tensors a stage hands to the next one are cast to bfloat16 on the way
//         out, so activations and the gradients sent back cross in half the bytes; the loss is
//         computed in float32 from float32 outputs; parameters (the optimizer's master weights)
//         and their gradients stay float32
//   fp16  the same with float16 on CUDA stages; it needs dynamic loss scaling (CUDA only)
//
// Thread-safety: autocast state is per thread: an AutocastGuard affects the thread that made it.
#pragma once

#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/types.h>

namespace pipetrain {

enum class Precision { kFloat32, kBFloat16, kFloat16 };

// "fp32", "bf16", "fp16". Throws pipetrain::BadInput naming the valid ones.
Precision parse_precision(const std::string& name);
const char* to_string(Precision precision);
// The dtype layers compute in and tensors cross stage boundaries in: float32, bfloat16, float16.
torch::ScalarType compute_dtype(Precision precision);
// Throws BadInput when `precision` cannot run on `device` (fp16 on a CPU stage: bf16 is the CPU's
// reduced precision, and fp16 needs the loss scaling that runs with CUDA).
void check_precision_usable(Precision precision, const torch::Device& device);

// RAII: autocast for `device`'s type at `precision` on this thread (nothing for fp32), its weight
// cache off (a cached cast of a weight must not outlive an optimizer step); the previous state is
// restored on destruction.
class AutocastGuard {
 public:
  AutocastGuard(Precision precision, const torch::Device& device);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_type_ = c10::DeviceType::CPU;
  bool was_enabled_ = false;
  c10::ScalarType was_dtype_ = c10::ScalarType::Float;
  bool was_cache_enabled_ = true;
};

// `tensors` with every floating one cast to `dtype` (differentiable: gradients flow back in the
// source dtype); undefined and integer tensors unchanged.
std::vector<torch::Tensor> cast_floating(const std::vector<torch::Tensor>& tensors,
                                         torch::ScalarType dtype);

}  // namespace pipetrain
