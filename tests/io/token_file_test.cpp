// Tests for token files (include/pipetrain/io/token_file.h) and their mini-batches
// (include/pipetrain/train/token_batches.h).
#include "pipetrain/io/token_file.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/train/token_batches.h"

namespace pipetrain::io {
namespace {

template <typename Id>
std::string write_ids(const std::string& name, const std::vector<Id>& ids) {
  const std::filesystem::path dir =
      std::filesystem::path(PIPETRAIN_BINARY_DIR) / "test-scratch" / "io";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(ids.data()),
             static_cast<std::streamsize>(ids.size() * sizeof(Id)));
  return path;
}

TEST(TokenFile, ReadsLittleEndianIdsOfTwoAndFourBytes) {
  const TokenFile two(write_ids<uint16_t>("two.bin", {1, 65535, 7}), 2);
  EXPECT_EQ(two.tokens(), 3);
  EXPECT_TRUE(torch::equal(two.read(0, 3), torch::tensor({1, 65535, 7}, torch::kInt64)));
  EXPECT_EQ(two.max_id(), 65535);
  const TokenFile four(write_ids<uint32_t>("four.bin", {128255, 0}), 4);
  EXPECT_EQ(four.at(0), 128255);
  EXPECT_THROW(four.read(1, 2), BadInput);
}

TEST(TokenFile, BadFilesAndIdsAreNamed) {
  const std::string odd = write_ids<uint8_t>("odd.bin", {1, 2, 3});
  try {
    TokenFile file(odd, 2);
    FAIL() << "read a file of 3 bytes as uint16 ids";
  } catch (const BadInput& error) {
    EXPECT_NE(std::string(error.what()).find("not a multiple of 2"), std::string::npos);
  }
  EXPECT_THROW(TokenFile(write_ids<uint16_t>("one.bin", {5}), 2), BadInput);
  EXPECT_THROW(TokenFile(odd, 3), BadInput);
  EXPECT_THROW(TokenFile("/nonexistent/ids.bin", 2), FileError);
  const TokenFile file(write_ids<uint16_t>("vocab.bin", {1, 2, 99, 3}), 2);
  file.check_vocabulary(100);
  try {
    file.check_vocabulary(99);
    FAIL() << "id 99 passed a vocabulary of 99";
  } catch (const BadInput& error) {
    EXPECT_NE(std::string(error.what()).find("id 99 at offset 2 (byte 4)"), std::string::npos)
        << error.what();
  }
}

TEST(TokenBatches, SamplesAreConsecutiveWindowsWithTheTargetOneIdAhead) {
  std::vector<uint16_t> ids(25);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>(i);
  auto file = std::make_shared<const TokenFile>(write_ids("seq.bin", ids), 2);
  // 24 / 4 = 6 samples of 4 (+1) ids; batches of 4: 2 per epoch, the second wraps.
  const train::TokenBatches batches(file, 4, 4);
  EXPECT_EQ(batches.samples(), 6);
  EXPECT_EQ(batches.per_epoch(), 2);
  auto [x0, y0] = batches.at(0);
  EXPECT_TRUE(torch::equal(x0[1], torch::tensor({4, 5, 6, 7}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(y0[1], torch::tensor({5, 6, 7, 8}, torch::kInt64)));
  auto [x1, y1] = batches.at(1);  // samples 4, 5, then 0, 1 again
  EXPECT_EQ(x1[2][0].item<int64_t>(), 0);
  EXPECT_TRUE(torch::equal(batches.at(2).first, x0));  // epoch 2 starts over, in order
  EXPECT_THROW(train::TokenBatches(file, 30, 1), BadInput);
}

TEST(TokenBatches, ShuffledEpochsArePermutationsThatDependOnlyOnTheSeed) {
  std::vector<uint16_t> ids(81);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>(i);
  auto file = std::make_shared<const TokenFile>(write_ids("shuffle.bin", ids), 2);
  const train::TokenBatches a(file, 2, 8, /*shuffle=*/true, 7);
  const train::TokenBatches b(file, 2, 8, /*shuffle=*/true, 7);
  const train::TokenBatches other(file, 2, 8, /*shuffle=*/true, 8);
  std::set<int64_t> firsts;
  for (int64_t k = 0; k < a.per_epoch(); ++k) {
    const torch::Tensor x = a.at(k).first;
    EXPECT_TRUE(torch::equal(x, b.at(k).first));
    for (int64_t n = 0; n < x.size(0); ++n) firsts.insert(x[n][0].item<int64_t>());
  }
  EXPECT_EQ(firsts.size(), 40u);  // every sample of the epoch once
  EXPECT_FALSE(torch::equal(a.at(0).first, other.at(0).first));
  EXPECT_FALSE(torch::equal(a.at(0).first, a.at(a.per_epoch()).first));  // a new order
}

TEST(TokenBatches, EvaluationScoresEverySampleOnceInOrder) {
  std::vector<uint16_t> ids(41, 3);
  auto file = std::make_shared<const TokenFile>(write_ids("eval.bin", ids), 2);
  int64_t calls = 0;
  // Logits that put all mass on id 3: the loss is 0, the perplexity 1.
  const train::TokenEvaluation e = train::evaluate_tokens(
      [&](const torch::Tensor& x) {
        ++calls;
        torch::Tensor logits = torch::full({x.size(0), x.size(1), 5}, -1e4);
        logits.select(2, 3).fill_(0);
        return logits;
      },
      *file, 4, 3);
  EXPECT_EQ(e.samples, 10);
  EXPECT_EQ(e.tokens, 40);
  EXPECT_EQ(calls, 4);  // 3 + 3 + 3 + 1
  EXPECT_NEAR(e.loss, 0.0, 1e-6);
  EXPECT_NEAR(e.perplexity, 1.0, 1e-6);
}

}  // namespace
}  // namespace pipetrain::io
