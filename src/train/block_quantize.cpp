// Block-wise int8 quantization (pipetrain/train/block_quantize.h).
#include "pipetrain/train/block_quantize.h"

#include <torch/torch.h>

#include "pipetrain/base/check.h"

namespace pipetrain::train {

std::int64_t quantized_bytes(std::int64_t elements, std::int64_t block) {
  PIPETRAIN_CHECK_INPUT(elements >= 0 && block > 0, "quantized_bytes: ", elements,
                        " elements in blocks of ", block);
  return elements + 4 * ((elements + block - 1) / block);
}

namespace {

void check_packed(const torch::Tensor& values, const torch::Tensor& packed, std::int64_t block,
                  const char* what) {
  PIPETRAIN_CHECK_INPUT(
      values.dim() == 1 && values.is_contiguous() && values.is_floating_point() &&
          packed.dim() == 1 && packed.is_contiguous() && packed.scalar_type() == torch::kUInt8 &&
          packed.numel() == quantized_bytes(values.numel(), block) &&
          packed.device() == values.device(),
      what, ": 1-D contiguous floating values (", values.sizes(), " ", values.scalar_type(),
      ") and ", quantized_bytes(values.numel(), block), " packed bytes on their device (got ",
      packed.sizes(), " ", packed.scalar_type(), ")");
}

}  // namespace

void quantize_blocks(const torch::Tensor& values, const torch::Tensor& packed, std::int64_t block) {
  check_packed(values, packed, block, "quantize_blocks");
  torch::NoGradGuard no_grad;
  const std::int64_t n = values.numel();
  if (n == 0) return;
  const std::int64_t blocks = (n + block - 1) / block;
  torch::Tensor x = values.to(torch::kFloat);
  if (blocks * block != n) x = torch::constant_pad_nd(x, {0, blocks * block - n});
  x = x.view({blocks, block});
  torch::Tensor scale = x.abs().amax(1).div_(127.0);
  scale.masked_fill_(scale == 0, 1.0);
  const torch::Tensor codes =
      x.div(scale.unsqueeze(1)).round_().clamp_(-127, 127).to(torch::kChar).view({-1});
  packed.narrow(0, 0, n).copy_(codes.narrow(0, 0, n).view(torch::kUInt8));
  packed.narrow(0, n, 4 * blocks).copy_(scale.view(torch::kUInt8));
}

void dequantize_blocks(const torch::Tensor& packed, const torch::Tensor& values,
                       std::int64_t block) {
  check_packed(values, packed, block, "dequantize_blocks");
  torch::NoGradGuard no_grad;
  const std::int64_t n = values.numel();
  if (n == 0) return;
  const std::int64_t blocks = (n + block - 1) / block;
  // The scales start at byte n, which need not be aligned for float32: copied out first.
  const torch::Tensor scale = packed.narrow(0, n, 4 * blocks).clone().view(torch::kFloat);
  torch::Tensor codes = packed.narrow(0, 0, n).view(torch::kChar).to(torch::kFloat);
  if (blocks * block != n) codes = torch::constant_pad_nd(codes, {0, blocks * block - n});
  const torch::Tensor x = codes.view({blocks, block}).mul_(scale.unsqueeze(1)).view({-1});
  values.copy_(x.narrow(0, 0, n));
}

}  // namespace pipetrain::train
