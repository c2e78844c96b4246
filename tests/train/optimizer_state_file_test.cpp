// OptimizerStateFile (train/optimizer_state_file.h) on its own: fields that read as zeros until
// written, a step's sub-groups and what they carry, reads of unaligned ranges, fills, and what
// it refuses. The sharded optimizer over it: rank helper scenario zero_offload.
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/temp_dir.h"
#include "pipetrain/base/error.h"
#include "pipetrain/train/optimizer_state_file.h"

namespace pipetrain::train::optimizer_state_file_test {
namespace {

NvmeOptions small(const std::string& dir) {
  return default_nvme_options().dir(dir).buffer_bytes(4096).buffer_count(6);
}

TEST(OptimizerStateFile, StepsBySubGroupsWithWhatTheLastStepWrote) {
  const std::string dir = testing::fresh_temp_dir("optimizer_state_file_step");
  const int64_t n = 2500;  // three sub-groups of 1024 floats, the last one short
  OptimizerStateFile file(small(dir), {"a", "b"}, n, torch::kFloat, "step");
  EXPECT_EQ(file.sub_group_elements(), 1024);
  EXPECT_FALSE(file.written(0));
  std::vector<std::pair<int64_t, int64_t>> seen;
  // First step: zeros in; each element gets its index (a) and twice it (b).
  file.step([&](int64_t first, int64_t length, const std::vector<torch::Tensor>& w) {
    seen.emplace_back(first, length);
    EXPECT_EQ(w[0].abs().sum().item<float>(), 0.0f);
    w[0].copy_(torch::arange(first, first + length, torch::kFloat));
    w[1].copy_(w[0] * 2);
  });
  const std::vector<std::pair<int64_t, int64_t>> groups = {{0, 1024}, {1024, 1024}, {2048, 452}};
  EXPECT_EQ(seen, groups);
  EXPECT_EQ(file.last_step().sub_groups, 3);
  EXPECT_EQ(file.last_step().bytes_read, 0);  // nothing was written before
  EXPECT_EQ(file.last_step().bytes_written, 2 * n * 4);
  EXPECT_TRUE(file.written(1));
  // Second step: what the first wrote comes back.
  file.step([&](int64_t first, int64_t length, const std::vector<torch::Tensor>& w) {
    EXPECT_TRUE(torch::equal(w[0], torch::arange(first, first + length, torch::kFloat)));
    EXPECT_TRUE(torch::equal(w[1], w[0] * 2));
    w[1].add_(1);
  });
  EXPECT_EQ(file.last_step().bytes_read, 2 * n * 4);
  torch::Tensor b = torch::empty({n});
  file.read(1, b);
  EXPECT_TRUE(torch::equal(b, torch::arange(n, torch::kFloat) * 2 + 1));
  // An unaligned range across buffers' bounds.
  torch::Tensor range = torch::empty({1500});
  file.read_range(0, 777, 1500, range.data_ptr());
  EXPECT_TRUE(torch::equal(range, torch::arange(777, 2277, torch::kFloat)));
  EXPECT_LE(file.peak_buffers_in_use(), 6);
}

TEST(OptimizerStateFile, FillAndWriteReplaceAFieldAndOthersStayZeros) {
  const std::string dir = testing::fresh_temp_dir("optimizer_state_file_fill");
  const int64_t n = 3000;
  OptimizerStateFile file(small(dir), {"state", "values"}, n, torch::kFloat, "fill");
  file.fill(1, [](int64_t first, int64_t length, const torch::Tensor& w) {
    w.copy_(torch::arange(first, first + length, torch::kFloat).neg());
  });
  EXPECT_FALSE(file.written(0));
  EXPECT_TRUE(file.written(1));
  torch::Tensor values = torch::empty({n}), state = torch::ones({n});
  file.read(1, values);
  file.read(0, state);
  EXPECT_TRUE(torch::equal(values, torch::arange(n, torch::kFloat).neg()));
  EXPECT_EQ(state.abs().sum().item<float>(), 0.0f);
  file.write(0, torch::full({n}, 3.0f));
  file.read(0, state);
  EXPECT_TRUE(torch::equal(state, torch::full({n}, 3.0f)));
  // The file was removed from the directory as soon as it was open.
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

// A gradient's ranges: unaligned and sharing blocks with their neighbours, copied, added onto
// zeros and added to; a field the step reads but does not write back.
TEST(OptimizerStateFile, UpdatesUnalignedRangesKeepingTheirNeighbours) {
  const std::string dir = testing::fresh_temp_dir("optimizer_state_file_ranges");
  const int64_t n = 3000;  // 4096-byte buffers: 1024 floats; ranges cut across them
  OptimizerStateFile file(small(dir), {"grads"}, n, torch::kFloat, "ranges");
  using Update = OptimizerStateFile::RangeUpdate;
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 777}, {777, 1500}, {2277, 723}};
  torch::Tensor expected = torch::zeros({n});
  for (const auto& [first, length] : ranges) {
    const torch::Tensor x = torch::randn({length});
    file.update_range(0, first, length, x, Update::kAddOntoZeros);
    expected.narrow(0, first, length).copy_(x);
  }
  for (const auto& [first, length] : ranges) {  // added to: each range's neighbours kept
    const torch::Tensor x = torch::randn({length});
    file.update_range(0, first, length, x, Update::kAdd);
    expected.narrow(0, first, length).add_(x);
  }
  // -0.0 copied stays -0.0; added onto zeros it is 0 + -0.0 = +0.0, as in memory.
  const torch::Tensor minus_zero = torch::full({3}, -0.0f);
  file.update_range(0, 10, 3, minus_zero, Update::kCopy);
  file.update_range(0, 20, 3, minus_zero, Update::kAddOntoZeros);
  expected.narrow(0, 10, 3).copy_(minus_zero);
  expected.narrow(0, 20, 3).zero_().add_(minus_zero);
  torch::Tensor back = torch::empty({n});
  file.read(0, back);
  EXPECT_TRUE(torch::equal(back, expected));
  EXPECT_TRUE(std::signbit(back[10].item<float>()));
  EXPECT_FALSE(std::signbit(back[20].item<float>()));
  // Read by the step, not written back: what a step does to it does not reach the file.
  file.read_only_in_step(0);
  file.step([&](int64_t first, int64_t length, const std::vector<torch::Tensor>& w) {
    EXPECT_TRUE(torch::equal(w[0], expected.narrow(0, first, length)));
    w[0].fill_(7);
  });
  EXPECT_EQ(file.last_step().bytes_written, 0);
  file.read(0, back);
  EXPECT_TRUE(torch::equal(back, expected));
}

TEST(OptimizerStateFile, RefusesWhatCannotWorkNamingTheSetting) {
  const std::string dir = testing::fresh_temp_dir("optimizer_state_file_refuses");
  auto message = [&](const NvmeOptions& options, size_t fields) {
    try {
      OptimizerStateFile(options, std::vector<std::string>(fields, "f"), 100, torch::kFloat, "x");
    } catch (const BadInput& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(small(dir).sub_group_size(2048), 2).find("--sub-group-size 2048"),
            std::string::npos);
  EXPECT_NE(message(small(dir).sub_group_size(100), 2).find("less than one 4096-byte block"),
            std::string::npos);
  EXPECT_NE(message(small(dir).buffer_count(1), 2).find("--offload-buffer-count 1"),
            std::string::npos);
  EXPECT_NE(message(small(dir + "/missing"), 2).find(dir + "/missing"), std::string::npos);
}

}  // namespace
}  // namespace pipetrain::train::optimizer_state_file_test
