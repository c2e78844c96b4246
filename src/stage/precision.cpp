// Mixed precision of a stage (pipetrain/stage/precision.h).
#include "pipetrain/stage/precision.h"

#include <ATen/autocast_mode.h>

#include "pipetrain/base/check.h"

namespace pipetrain {

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::kFloat32;
  if (name == "bf16") return Precision::kBFloat16;
  if (name == "fp16") return Precision::kFloat16;
  throw BadInput("unknown precision '" + name + "'; valid: fp32, bf16, fp16");
}

const char* to_string(Precision precision) {
  switch (precision) {
    case Precision::kBFloat16:
      return "bf16";
    case Precision::kFloat16:
      return "fp16";
    default:
      return "fp32";
  }
}

torch::ScalarType compute_dtype(Precision precision) {
  switch (precision) {
    case Precision::kBFloat16:
      return torch::kBFloat16;
    case Precision::kFloat16:
      return torch::kHalf;
    default:
      return torch::kFloat;
  }
}

void check_precision_usable(Precision precision, const torch::Device& device) {
  PIPETRAIN_CHECK_INPUT(precision != Precision::kFloat16 || device.is_cuda(),
                        "precision fp16 needs CUDA stages (float16 trains with dynamic loss "
                        "scaling on the GPU) but a stage is on ",
                        device, "; use bf16 on the CPU");
}

AutocastGuard::AutocastGuard(Precision precision, const torch::Device& device) {
  if (precision == Precision::kFloat32) return;
  active_ = true;
  device_type_ = device.type();
  was_enabled_ = at::autocast::is_autocast_enabled(device_type_);
  was_dtype_ = at::autocast::get_autocast_dtype(device_type_);
  was_cache_enabled_ = at::autocast::is_autocast_cache_enabled();
  at::autocast::set_autocast_enabled(device_type_, true);
  at::autocast::set_autocast_dtype(device_type_, compute_dtype(precision));
  at::autocast::set_autocast_cache_enabled(false);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_cache_enabled(was_cache_enabled_);
  at::autocast::set_autocast_dtype(device_type_, was_dtype_);
  at::autocast::set_autocast_enabled(device_type_, was_enabled_);
}

std::vector<torch::Tensor> cast_floating(const std::vector<torch::Tensor>& tensors,
                                         torch::ScalarType dtype) {
  std::vector<torch::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) {
    out.push_back(t.defined() && t.is_floating_point() && t.scalar_type() != dtype ? t.to(dtype)
                                                                                   : t);
  }
  return out;
}

}  // namespace pipetrain
