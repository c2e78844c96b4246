// The sharded checkpoint's index (io/shard_index.h): its checks, and the copy plan between a
// stored piece and a wanted region, against an element-by-element enumeration.
#include "pipetrain/io/shard_index.h"

#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace pipetrain::io {
namespace {

// The global flat index of element k of `region` (of a tensor of `shape`).
int64_t global_index(const std::vector<int64_t>& shape, const ShardRegion& region, int64_t k) {
  const int64_t flat = region.flat_begin + k;
  std::vector<int64_t> at(shape.size());
  int64_t rest = flat;
  for (size_t d = shape.size(); d-- > 0;) {
    at[d] = region.offsets[d] + rest % region.shape[d];
    rest /= region.shape[d];
  }
  int64_t g = 0;
  for (size_t d = 0; d < shape.size(); ++d) g = g * shape[d] + at[d];
  return g;
}

ShardIndex two_rank_index() {
  // A [4, 6] tensor cut into two boxes of rows (tp), each stored by two replicas (flat halves).
  ShardIndex index;
  index.files = {"rank-00000.safetensors", "rank-00001.safetensors"};
  ShardTensor t;
  t.dtype = SafetensorsDtype::kF32;
  t.shape = {4, 6};
  uint64_t at[2] = {16, 16};
  for (int box = 0; box < 2; ++box) {
    for (int half = 0; half < 2; ++half) {
      ShardPiece p;
      p.file = static_cast<size_t>(half);
      p.region = {{2 * box, 0}, {2, 6}, 6 * half, 6 * half + 6};
      p.begin = at[half];
      p.end = at[half] + 24;
      at[half] = p.end;
      t.pieces.push_back(p);
    }
  }
  index.tensors["param/w"] = t;
  index.state = {{"step", 3}};
  return index;
}

TEST(ShardIndex, RoundTripsThroughItsText) {
  const ShardIndex index = two_rank_index();
  const ShardIndex back = parse_shard_index(serialize_shard_index(index), "index.json");
  EXPECT_EQ(back.files, index.files);
  EXPECT_EQ(back.state["step"], 3);
  ASSERT_NE(back.find("param/w"), nullptr);
  EXPECT_EQ(back.find("param/w")->pieces.size(), 4u);
  EXPECT_EQ(back.find("param/w")->pieces[3].region.flat_end, 12);
  EXPECT_EQ(back.find("param/w")->bytes(), 96u);
}

TEST(ShardIndex, WritesCrc32cAndStillReadsTheFirstIndexesCrc32) {
  ShardIndex index = two_rank_index();
  index.tensors["param/w"].pieces[0].checksum = 12345;
  const std::string text = serialize_shard_index(index);
  EXPECT_NE(text.find("\"crc32c\""), std::string::npos);
  EXPECT_EQ(parse_shard_index(text, "index.json").find("param/w")->pieces[0].checksum, 12345u);
  nlohmann::json legacy = nlohmann::json::parse(text);
  for (auto& piece : legacy["tensors"]["param/w"]["pieces"]) {
    piece["crc32"] = piece["crc32c"];
    piece.erase("crc32c");
  }
  const ShardIndex back = parse_shard_index(legacy.dump(), "index.json");
  const ShardPiece& first = back.find("param/w")->pieces[0];
  EXPECT_EQ(first.checksum_kind, ShardChecksum::kCrc32);
  EXPECT_EQ(first.checksum, 12345u);
  EXPECT_NE(serialize_shard_index(back).find("\"crc32\""), std::string::npos);
}

// Each broken index is refused with a ShardIndexError naming the file and the tensor.
TEST(ShardIndex, RefusesPiecesThatDoNotTileTheTensor) {
  struct Case {
    const char* what;
    void (*breaks)(ShardTensor&);
    const char* message;
  };
  const std::vector<Case> cases = {
      {"a missing piece", [](ShardTensor& t) { t.pieces.pop_back(); }, "missing"},
      {"two pieces of the same elements",
       [](ShardTensor& t) {
         t.pieces[1].region.flat_begin = 3;
         t.pieces[1].begin += 0;
       },
       "piece"},
      {"a box outside",
       [](ShardTensor& t) {
         t.pieces[2].region.offsets = {3, 0};
       },
       "outside"},
      {"overlapping boxes",
       [](ShardTensor& t) {
         for (int i : {2, 3}) t.pieces[static_cast<size_t>(i)].region.offsets = {1, 0};
       },
       "overlap"},
      {"bytes that are not its elements", [](ShardTensor& t) { t.pieces[0].end -= 4; },
       "byte range"},
      {"a file it does not list", [](ShardTensor& t) { t.pieces[0].file = 7; }, "file 7"},
  };
  for (const Case& c : cases) {
    ShardIndex index = two_rank_index();
    c.breaks(index.tensors["param/w"]);
    try {
      parse_shard_index(serialize_shard_index(index), "ckpt/index.json");
      ADD_FAILURE() << c.what << " was accepted";
    } catch (const ShardIndexError& error) {
      EXPECT_EQ(error.file(), "ckpt/index.json") << c.what;
      EXPECT_EQ(error.tensor(), "param/w") << c.what;
      EXPECT_NE(std::string(error.what()).find(c.message), std::string::npos)
          << c.what << ": " << error.what();
    }
  }
}

TEST(ShardIndex, RefusesTextThatIsNotAnIndex) {
  for (const char* text : {"", "[]", "{\"format\": \"x\"}",
                           "{\"format\": \"pipetrain-sharded-checkpoint\", \"version\": 2}",
                           "{\"format\": \"pipetrain-sharded-checkpoint\", \"version\": 1, "
                           "\"files\": [\"../x\"], \"tensors\": {}}"}) {
    EXPECT_THROW(parse_shard_index(text, "index.json"), ShardIndexError) << text;
  }
}

// for_each_run's runs are exactly the common elements, each mapped to the right place, for
// random boxes and flat ranges of 1-D to 3-D tensors.
TEST(ShardIndex, RunsCopyExactlyTheCommonElements) {
  std::mt19937 random(7);
  auto draw_region = [&](const std::vector<int64_t>& shape) {
    ShardRegion r;
    for (int64_t n : shape) {
      const int64_t size = 1 + static_cast<int64_t>(random() % static_cast<uint32_t>(n));
      r.shape.push_back(size);
      r.offsets.push_back(static_cast<int64_t>(random() % static_cast<uint32_t>(n - size + 1)));
    }
    const int64_t numel = r.box_numel();
    r.flat_begin = static_cast<int64_t>(random() % static_cast<uint32_t>(numel));
    r.flat_end = r.flat_begin + 1 +
                 static_cast<int64_t>(random() % static_cast<uint32_t>(numel - r.flat_begin));
    return r;
  };
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int64_t> shape;
    const int rank = 1 + trial % 3;
    for (int d = 0; d < rank; ++d) shape.push_back(1 + static_cast<int64_t>(random() % 7));
    const ShardRegion piece = draw_region(shape), region = draw_region(shape);
    std::map<int64_t, int64_t> in_piece;  // global index -> piece element
    for (int64_t k = 0; k < piece.elements(); ++k) in_piece[global_index(shape, piece, k)] = k;
    std::map<int64_t, int64_t> expected;  // region element -> piece element
    for (int64_t k = 0; k < region.elements(); ++k) {
      const auto found = in_piece.find(global_index(shape, region, k));
      if (found != in_piece.end()) expected[k] = found->second;
    }
    std::map<int64_t, int64_t> got;
    const int64_t total =
        for_each_run(shape, piece, region, [&](int64_t from, int64_t to, int64_t count) {
          for (int64_t i = 0; i < count; ++i) {
            EXPECT_TRUE(got.emplace(to + i, from + i).second) << "element copied twice";
          }
        });
    ASSERT_EQ(got, expected) << "trial " << trial;
    EXPECT_EQ(total, static_cast<int64_t>(expected.size()));
  }
}

TEST(ShardIndex, Crc32IsZlibs) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32_update(0, check.data(), check.size()), 0xCBF43926u);
  // In two parts, and over a length that is not a multiple of 8.
  const std::string text = "pipetrain writes every rank's part of a checkpoint";
  const uint32_t whole = crc32_update(0, text.data(), text.size());
  EXPECT_EQ(crc32_update(crc32_update(0, text.data(), 13), text.data() + 13, text.size() - 13),
            whole);
}

// Bit by bit, as the polynomial defines it: what both of crc32c_update's paths must equal.
uint32_t crc32c_bitwise(const unsigned char* p, size_t n) {
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82F63B78u ^ (c >> 1) : c >> 1;
  }
  return ~c;
}

TEST(ShardIndex, Crc32cIsCastagnolisOnBothPaths) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32c_update(0, check.data(), check.size()), 0xE3069283u);
  EXPECT_EQ(detail::crc32c_by_tables(0, check.data(), check.size()), 0xE3069283u);
  std::mt19937 random(7);
  std::vector<unsigned char> bytes(1031);
  for (unsigned char& b : bytes) b = static_cast<unsigned char>(random());
  for (size_t n : {0, 1, 7, 8, 9, 64, 1000, 1031}) {
    const uint32_t want = crc32c_bitwise(bytes.data(), n);
    EXPECT_EQ(crc32c_update(0, bytes.data(), n), want) << n << " bytes";
    EXPECT_EQ(detail::crc32c_by_tables(0, bytes.data(), n), want) << n << " bytes";
    // Unaligned start, in two parts.
    if (n > 3) {
      EXPECT_EQ(crc32c_update(crc32c_update(0, bytes.data(), 3), bytes.data() + 3, n - 3), want);
    }
  }
  EXPECT_EQ(shard_checksum(ShardChecksum::kCrc32c, check.data(), 9), 0xE3069283u);
  EXPECT_EQ(shard_checksum(ShardChecksum::kCrc32, check.data(), 9), 0xCBF43926u);
}

}  // namespace
}  // namespace pipetrain::io
