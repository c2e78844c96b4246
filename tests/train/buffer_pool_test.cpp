// Tests for BufferPool (include/pipetrain/train/buffer_pool.h): what it keeps between uses.
#include "pipetrain/train/buffer_pool.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace pipetrain::train {
namespace {

// Of a size it keeps as many spares as were in use at once, and gives them out again; a size of
// kLargestSpareBytes or more (a vocabulary table's gathered values) it never keeps. The large
// buffer's pages are never touched here: it costs no memory.
TEST(BufferPool, KeepsSparesOfASizeAsBusyAsItWasButNoneOfTheLargest) {
  BufferPool pool;
  const auto floats = torch::TensorOptions().dtype(torch::kFloat);
  const int64_t small = (int64_t{2} << 20) / 4;  // 2 MiB: from pages of its own
  torch::Tensor a = pool.take(small, floats);
  torch::Tensor b = pool.take(small, floats);
  const void* a_data = a.data_ptr();
  pool.give(a);
  pool.give(b);
  EXPECT_EQ(pool.spare_bytes(), 2 * (int64_t{2} << 20));
  torch::Tensor again = pool.take(small, floats);
  EXPECT_TRUE(again.data_ptr() == a_data || again.data_ptr() == b.data_ptr());
  EXPECT_EQ(pool.spare_bytes(), int64_t{2} << 20);
  pool.give(again);

  const int64_t before = pool.spare_bytes();
  torch::Tensor large = pool.take(BufferPool::kLargestSpareBytes / 4, floats);
  EXPECT_EQ(large.nbytes(), static_cast<size_t>(BufferPool::kLargestSpareBytes));
  pool.give(large);
  EXPECT_EQ(pool.spare_bytes(), before);
  // Just below it: kept.
  torch::Tensor below = pool.take(BufferPool::kLargestSpareBytes / 4 - 1024, floats);
  pool.give(below);
  EXPECT_EQ(pool.spare_bytes(), before + BufferPool::kLargestSpareBytes - 4096);
}

}  // namespace
}  // namespace pipetrain::train
