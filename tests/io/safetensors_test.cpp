// Tests for the safetensors reader and writer (include/pipetrain/io/safetensors_format.h,
// safetensors.h): every malformed header is refused naming the file and the tensor, what is
// written reads back bit for bit, shards and the index agree.
#include "pipetrain/io/safetensors.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

namespace pipetrain::io {
namespace {

namespace fs = std::filesystem;

// A file of `header` (JSON text) and `data_bytes` zero bytes of data.
std::string file_of(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int b = 0; b < 8; ++b) out[static_cast<size_t>(b)] = static_cast<char>(n >> (8 * b));
  return out + header + std::string(data_bytes, '\0');
}

// The message of the SafetensorsError parsing `bytes` throws ("" when it parses).
std::string refusal(const std::string& bytes) {
  try {
    parse_safetensors_header(bytes.data(), bytes.size(), "f.safetensors");
  } catch (const SafetensorsError& error) {
    EXPECT_EQ(error.file(), "f.safetensors");
    return error.what();
  }
  return "";
}

TEST(SafetensorsHeader, AWellFormedFileGivesEachTensorItsAbsoluteSpan) {
  const std::string header =
      R"({"b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}})";
  const std::string bytes = file_of(header, 12);
  const SafetensorsHeader parsed = parse_safetensors_header(bytes.data(), bytes.size(), "f");
  ASSERT_EQ(parsed.entries.size(), 2u);
  EXPECT_EQ(parsed.data_offset, 8 + header.size());
  EXPECT_EQ(parsed.entries[0].name, "a");  // in the order of their data
  EXPECT_EQ(parsed.entries[0].offset, parsed.data_offset);
  EXPECT_EQ(parsed.entries[1].dtype, SafetensorsDtype::kBF16);
  EXPECT_EQ(parsed.entries[1].shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(parsed.entries[1].offset, parsed.data_offset + 8);
  EXPECT_EQ(parsed.metadata.at("format"), "pt");
}

TEST(SafetensorsHeader, EachMalformedFileIsRefusedNamingWhatIsWrong) {
  const auto tensor = [](const std::string& dtype, const std::string& shape,
                         const std::string& offsets) {
    return R"({"t":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" +
           offsets + "}}";
  };
  EXPECT_NE(refusal("abc").find("truncated: 3 bytes"), std::string::npos);
  std::string past = file_of("{}", 0);
  past[0] = 100;  // 100 bytes of header in a 10-byte file
  EXPECT_NE(refusal(past).find("header length 100 points past the end"), std::string::npos);
  EXPECT_NE(refusal(file_of("[1]", 0)).find("not a JSON object"), std::string::npos);
  EXPECT_NE(refusal(file_of("{oops", 0)).find("not JSON"), std::string::npos);
  EXPECT_NE(refusal(file_of(tensor("Q8", "[1]", "[0,1]"), 1)).find("unknown dtype 'Q8'"),
            std::string::npos);
  EXPECT_NE(refusal(file_of(tensor("F32", "[2]", "[0,4]"), 4)).find("needs 8 bytes"),
            std::string::npos);
  EXPECT_NE(refusal(file_of(tensor("F32", "[-1]", "[0,4]"), 4)).find("not a count"),
            std::string::npos);
  EXPECT_NE(refusal(file_of(tensor("F32", "[1]", "[4,0]"), 4)).find("not a range"),
            std::string::npos);
  EXPECT_NE(refusal(file_of(tensor("F32", "[1]", "[0,4]"), 2)).find("past the end of the data"),
            std::string::npos);
  EXPECT_NE(refusal(file_of(tensor("F32", "[1]", "[4,8]"), 8)).find("a hole of 4 bytes"),
            std::string::npos);
  EXPECT_NE(refusal(file_of(tensor("F32", "[1]", "[0,4]"), 6)).find("2 bytes follow the last"),
            std::string::npos);
  const std::string overlap = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  EXPECT_NE(refusal(file_of(overlap, 8)).find("overlap"), std::string::npos);
  const std::string huge = tensor("F32", "[4611686018427387904, 4611686018427387904]", "[0,4]");
  EXPECT_NE(refusal(file_of(huge, 4)).find("more elements than any file holds"), std::string::npos);
  EXPECT_NE(refusal(file_of(R"({"__metadata__":{"k":1}})", 0)).find("is not a string"),
            std::string::npos);
  // The tensor is named where there is one.
  EXPECT_NE(refusal(file_of(tensor("F32", "[2]", "[0,4]"), 4)).find("tensor 't'"),
            std::string::npos);
}

TEST(SafetensorsHeader, SerializedHeadersPadToEightBytesAndParseBack) {
  const std::vector<SafetensorsLayoutEntry> layout = {{"w", SafetensorsDtype::kF32, {3, 2}},
                                                      {"b", SafetensorsDtype::kBF16, {3}}};
  const std::string header = serialize_safetensors_header(layout, {{"format", "pt"}});
  EXPECT_EQ(header.size() % 8, 0u);
  const std::string bytes = header + std::string(24 + 6, '\0');
  const SafetensorsHeader parsed = parse_safetensors_header(bytes.data(), bytes.size(), "f");
  ASSERT_EQ(parsed.entries.size(), 2u);
  EXPECT_EQ(parsed.find("b")->offset, header.size() + 24);
  EXPECT_THROW(serialize_safetensors_header(
                   {{"x", SafetensorsDtype::kF32, {1}}, {"x", SafetensorsDtype::kF32, {1}}}),
               BadInput);
  EXPECT_THROW(serialize_safetensors_header({{"__metadata__", SafetensorsDtype::kF32, {1}}}),
               BadInput);
}

std::string scratch(const std::string& name) {
  const fs::path dir = fs::path(PIPETRAIN_BINARY_DIR) / "test-scratch" / "io" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

TEST(SafetensorsCheckpoint, WhatIsWrittenReadsBackBitForBitInEveryDtypeAndShard) {
  const std::string dir = scratch("round-trip");
  torch::manual_seed(0);
  NamedTensorList tensors = {{"f32", torch::randn({5, 3})},
                             {"bf16", torch::randn({7}).to(torch::kBFloat16)},  // odd: alignment
                             {"f16", torch::randn({2, 2}).to(torch::kFloat16)},
                             {"i64", torch::arange(5)},
                             {"empty", torch::empty({0, 4})}};
  // 40 bytes per shard at most: several shards and an index.
  const std::vector<std::string> files =
      write_safetensors_checkpoint(dir, tensors, SafetensorsWriteOptions().max_shard_bytes(40));
  EXPECT_GT(files.size(), 2u);
  EXPECT_EQ(files.back(), kSafetensorsIndexFile);
  EXPECT_FALSE(fs::exists(dir + "/" + kSafetensorsFile));
  const SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(dir);
  EXPECT_EQ(checkpoint.names().size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    const torch::Tensor read = checkpoint.load(name, tensor.scalar_type());
    EXPECT_TRUE(torch::equal(read, tensor)) << name;
  }
  EXPECT_EQ(checkpoint.entry("bf16").dtype, SafetensorsDtype::kBF16);
  EXPECT_TRUE(torch::equal(checkpoint.load("bf16", torch::kFloat32),
                           tensors[1].second.to(torch::kFloat32)));
  // Writing the same directory again in one file replaces the shards and the index.
  write_safetensors_checkpoint(dir, tensors);
  EXPECT_TRUE(fs::exists(dir + "/" + kSafetensorsFile));
  EXPECT_FALSE(fs::exists(dir + "/" + kSafetensorsIndexFile));
  size_t shards = 0;
  for (const auto& item : fs::directory_iterator(dir)) {
    shards += item.path().filename().string().rfind("model-", 0) == 0;
  }
  EXPECT_EQ(shards, 0u);
  EXPECT_EQ(SafetensorsCheckpoint::open(dir).names().size(), tensors.size());
}

TEST(SafetensorsCheckpoint, AnIndexThatDisagreesWithItsShardsIsRefused) {
  const std::string dir = scratch("bad-index");
  // a and b in the first shard, c in the second.
  write_safetensors_checkpoint(
      dir, {{"a", torch::ones({4})}, {"b", torch::ones({4})}, {"c", torch::ones({4})}},
      SafetensorsWriteOptions().max_shard_bytes(32));
  const std::string index_path = dir + "/" + kSafetensorsIndexFile;
  nlohmann::json index = nlohmann::json::parse(std::ifstream(index_path));
  const nlohmann::json good = index;
  index["weight_map"]["d"] = index["weight_map"]["a"];  // a tensor the shard does not hold
  std::ofstream(index_path) << index.dump();
  try {
    SafetensorsCheckpoint::open(dir);
    FAIL() << "opened an index naming a tensor its shard does not hold";
  } catch (const SafetensorsError& error) {
    EXPECT_EQ(error.tensor(), "d");
  }
  index = good;
  // A tensor of an opened shard that the index does not list (a shard no entry names is not
  // opened at all: a stale one of an earlier save).
  index["weight_map"].erase("b");
  std::ofstream(index_path) << index.dump();
  try {
    SafetensorsCheckpoint::open(dir);
    FAIL() << "opened a shard holding a tensor the index does not list";
  } catch (const SafetensorsError& error) {
    EXPECT_EQ(error.tensor(), "b");
    EXPECT_NE(std::string(error.what()).find("not in the index"), std::string::npos);
  }
  index = good;
  index["weight_map"]["a"] = "../elsewhere.safetensors";
  std::ofstream(index_path) << index.dump();
  EXPECT_THROW(SafetensorsCheckpoint::open(dir), SafetensorsError);
  EXPECT_THROW(SafetensorsCheckpoint::open(scratch("empty")), FileError);
}

}  // namespace
}  // namespace pipetrain::io
