// tensor_bytes: the bytes of a tensor's elements (numel × element size), 0 for an undefined
// tensor -- what the memory accounting of the profiler, ZeRO and the memory report counts.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace pipetrain {

inline std::int64_t tensor_bytes(const at::Tensor& tensor) {
  return tensor.defined() ? static_cast<std::int64_t>(tensor.numel()) *
                                static_cast<std::int64_t>(tensor.element_size())
                          : 0;
}

}  // namespace pipetrain
