// Block-wise int8 quantization (train/block_quantize.h): what ZeRO++ sends in its quantized
// gathers and gradient all-to-alls.
#include "pipetrain/train/block_quantize.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/base/error.h"

namespace pipetrain::train {
namespace {

torch::Tensor round_trip(const torch::Tensor& values, int64_t block) {
  torch::Tensor packed = torch::empty({quantized_bytes(values.numel(), block)}, torch::kUInt8);
  quantize_blocks(values, packed, block);
  torch::Tensor back = torch::empty_like(values);
  dequantize_blocks(packed, back, block);
  return back;
}

TEST(BlockQuantize, EachBlockIsScaledByItsOwnLargestMagnitudeAndRoundsToTheNearestStep) {
  EXPECT_EQ(quantized_bytes(10, 4), 10 + 4 * 3);
  EXPECT_EQ(quantized_bytes(0, 4), 0);
  // Two blocks of 4 and a short one of 2: steps of 127/127 = 1, 2.54/127 = 0.02 and 1/127.
  const torch::Tensor values =
      torch::tensor({127.f, -3.4f, 0.6f, 2.6f, 2.54f, -0.05f, 0.f, 1.f, 0.f, -1.f});
  const torch::Tensor back = round_trip(values, 4);
  const torch::Tensor want = torch::tensor(
      {127.f, -3.f, 1.f, 3.f, 2.54f, -0.04f, 0.f, 1.f, 0.f, -1.f});  // -2.5 steps: to even
  EXPECT_TRUE(torch::allclose(back, want, 0, 1e-6)) << back;
  // A block of zeros stays zeros (its scale is 1, not 0 / 127).
  EXPECT_TRUE(torch::equal(round_trip(torch::zeros({5}), 4), torch::zeros({5})));
}

TEST(BlockQuantize, TheErrorIsAtMostHalfAStepOfItsBlockAndDequantizingIsDeterministic) {
  torch::manual_seed(3);
  const int64_t block = 64;
  // Blocks whose magnitudes differ by orders: each keeps its own precision.
  const torch::Tensor values =
      torch::randn({1000}) * torch::pow(10.0, torch::arange(1000) / block % 5 - 2);
  const torch::Tensor back = round_trip(values, block);
  for (int64_t first = 0; first < values.numel(); first += block) {
    const int64_t length = std::min(block, values.numel() - first);
    const torch::Tensor x = values.narrow(0, first, length);
    const double half_step = x.abs().max().item<double>() / 127 / 2;
    EXPECT_LE((back.narrow(0, first, length) - x).abs().max().item<double>(),
              half_step * (1 + 1e-5))
        << "block at " << first;
  }
  EXPECT_TRUE(torch::equal(back, round_trip(values, block)));
  // bf16 values go through float32 and come back in their dtype.
  const torch::Tensor narrow = values.to(torch::kBFloat16);
  const torch::Tensor narrow_back = round_trip(narrow, block);
  EXPECT_EQ(narrow_back.scalar_type(), torch::kBFloat16);
  for (int64_t first = 0; first < values.numel(); first += block) {
    const int64_t length = std::min(block, values.numel() - first);
    const torch::Tensor x = narrow.narrow(0, first, length).to(torch::kFloat);
    const double largest = x.abs().max().item<double>();  // half a step, and bf16's rounding
    EXPECT_LE(
        (narrow_back.narrow(0, first, length).to(torch::kFloat) - x).abs().max().item<double>(),
        largest / 254 + largest / 256)
        << "bf16 block at " << first;
  }
}

TEST(BlockQuantize, APackOfTheWrongSizeOrDtypeIsBadInput) {
  const torch::Tensor values = torch::ones({8});
  torch::Tensor short_pack = torch::empty({quantized_bytes(8) - 1}, torch::kUInt8);
  EXPECT_THROW(quantize_blocks(values, short_pack), BadInput);
  torch::Tensor floats = torch::empty({quantized_bytes(8)});
  EXPECT_THROW(quantize_blocks(values, floats), BadInput);
  torch::Tensor ints = torch::empty({8}, torch::kLong);
  torch::Tensor pack = torch::empty({quantized_bytes(8)}, torch::kUInt8);
  EXPECT_THROW(dequantize_blocks(pack, ints), BadInput);
}

}  // namespace
}  // namespace pipetrain::train
