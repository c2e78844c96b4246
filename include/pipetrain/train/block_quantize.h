// Block-wise int8 quantization: what ZeRO++'s quantized weights (qwZ) and gradients (qgZ) send
// (train/sharded_optimizer.h).
//
// `elements` values in blocks of `block` (the last may be shorter), each block scaled by its own
// largest magnitude: scale = max |x| / 127 (1 for a block of zeros), code = round(x / scale)
// in [-127, 127], value = code * scale. Packed as one byte tensor: the int8 codes, then the
// float32 scales, so that one collective carries both:
//
//   [ code 0 .. code n-1 | scale 0 .. scale b-1 (4 bytes each, native order) ]
//
// An element's error is at most half a step, scale / 2 = max |x of its block| / 254. Quantizing
// is deterministic: every replica that dequantizes the same bytes gets the same values.
#pragma once

#include <cstdint>

#include <torch/types.h>

namespace pipetrain::train {

// DeepSpeed's qwZ quantizes by groups of parameters of about this size; 256 keeps the scales at
// 1/64 of the codes' bytes.
constexpr std::int64_t kQuantBlock = 256;

// Bytes of `elements` values packed: elements + 4 * ceil(elements / block).
std::int64_t quantized_bytes(std::int64_t elements, std::int64_t block = kQuantBlock);

// `values` (1-D, contiguous, floating) packed into `packed` (uint8, contiguous, exactly
// quantized_bytes(values.numel(), block) elements, on values' device). Throws BadInput for
// other shapes or dtypes.
void quantize_blocks(const torch::Tensor& values, const torch::Tensor& packed,
                     std::int64_t block = kQuantBlock);
// The inverse: `values` (1-D, contiguous, floating, its numel the count packed) receives the
// dequantized values in its dtype.
void dequantize_blocks(const torch::Tensor& packed, const torch::Tensor& values,
                       std::int64_t block = kQuantBlock);

}  // namespace pipetrain::train
