// Tests for blended mini-batches (include/pipetrain/train/blended_batches.h): the share each
// dataset gives, rows that are the datasets' own samples, a pure function of the step (resume),
// and a shuffle that takes each dataset's samples once per its epoch.
#include "pipetrain/train/blended_batches.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/base/error.h"

namespace pipetrain::train::blended_batches_test {
namespace {

// A token file of `count` uint16 ids: `first`, first + 1, ... (so a row names its dataset and its
// sample).
std::shared_ptr<const io::TokenFile> ids_from(const std::string& name, uint16_t first, int count) {
  const std::filesystem::path dir =
      std::filesystem::path(PIPETRAIN_BINARY_DIR) / "test-scratch" / "blend";
  std::filesystem::create_directories(dir);
  std::vector<uint16_t> ids;
  for (int i = 0; i < count; ++i) ids.push_back(static_cast<uint16_t>(first + i));
  const std::string path = (dir / name).string();
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(ids.data()),
             static_cast<std::streamsize>(ids.size() * sizeof(uint16_t)));
  return std::make_shared<const io::TokenFile>(path, 2);
}

// Three datasets weighted 5 : 3 : 2, samples of T = 4: dataset d's rows begin at 10000 * d.
std::vector<BlendPart> three_parts() {
  return {{5.0, ids_from("a.bin", 0, 41)},       // 10 samples
          {3.0, ids_from("b.bin", 10000, 29)},   // 7
          {2.0, ids_from("c.bin", 20000, 13)}};  // 3
}

TEST(BlendedTokenBatches, EachDatasetGivesItsWeightsShareWithinOneSample) {
  const BlendedTokenBatches blend(three_parts(), 4, 1);
  const double weights[3] = {0.5, 0.3, 0.2};
  std::vector<int64_t> counts(3, 0);
  for (int64_t g = 0; g < 1000; ++g) {
    const auto [d, count] = blend.source_of(g);
    ASSERT_LT(d, 3u);
    EXPECT_EQ(count, counts[d]) << "sample " << g;  // each dataset's samples in turn
    ++counts[d];
    for (size_t e = 0; e < 3; ++e) {
      EXPECT_LE(std::abs(static_cast<double>(counts[e]) - weights[e] * static_cast<double>(g + 1)),
                1.0 + 1e-9)
          << "dataset " << e << " after " << g + 1 << " samples";
    }
  }
  EXPECT_EQ(blend.per_epoch(), 20);  // 10 + 7 + 3 samples, batches of 1
}

TEST(BlendedTokenBatches, RowsAreTheDatasetsSamplesAndAStepIsAPureFunctionOfK) {
  const BlendedTokenBatches blend(three_parts(), 4, 6, /*shuffle=*/true, 7);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> steps;
  for (int64_t k = 0; k < 12; ++k) steps.push_back(blend.at(k));
  // A fresh source (a resumed run) asked for step 9 first, then an earlier one.
  const BlendedTokenBatches resumed(three_parts(), 4, 6, true, 7);
  for (int64_t k : {9, 3, 11}) {
    const auto [x, y] = resumed.at(k);
    EXPECT_TRUE(torch::equal(x, steps[static_cast<size_t>(k)].first)) << "step " << k;
    EXPECT_TRUE(torch::equal(y, steps[static_cast<size_t>(k)].second)) << "step " << k;
  }
  // Every row is T consecutive ids of one dataset at a sample boundary, its target shifted by one;
  // each dataset's samples come once per its epoch (here: dataset c's 3 samples in every 3 taken).
  std::map<int64_t, std::vector<int64_t>> taken;  // dataset -> first ids of its rows, in order
  for (const auto& [x, y] : steps) {
    for (int64_t n = 0; n < x.size(0); ++n) {
      const int64_t first = x[n][0].item<int64_t>();
      const int64_t d = first / 10000;
      EXPECT_EQ((first - d * 10000) % 4, 0) << "row of dataset " << d << " begins at " << first;
      EXPECT_TRUE(torch::equal(x[n], torch::arange(first, first + 4)));
      EXPECT_TRUE(torch::equal(y[n], torch::arange(first + 1, first + 5)));
      taken[d].push_back(first);
    }
  }
  const std::vector<int64_t>& c = taken[2];
  ASSERT_GE(c.size(), 6u);
  for (size_t epoch = 0; epoch + 3 <= c.size(); epoch += 3) {
    EXPECT_EQ(std::set<int64_t>(c.begin() + static_cast<std::ptrdiff_t>(epoch),
                                c.begin() + static_cast<std::ptrdiff_t>(epoch + 3))
                  .size(),
              3u)
        << "dataset 2's epoch " << epoch / 3;
  }
}

TEST(BlendedTokenBatches, ABadWeightOrADatasetShorterThanASampleIsNamed) {
  std::vector<BlendPart> parts = three_parts();
  parts[1].weight = 0;
  try {
    BlendedTokenBatches blend(parts, 4, 2);
    ADD_FAILURE() << "a weight of 0 was taken";
  } catch (const BadInput& error) {
    EXPECT_NE(std::string(error.what()).find("b.bin"), std::string::npos) << error.what();
  }
  EXPECT_THROW(BlendedTokenBatches(three_parts(), 40, 2), BadInput);  // c.bin has 13 ids
}

}  // namespace
}  // namespace pipetrain::train::blended_batches_test
