// Tests for packing documents into rows (include/pipetrain/data/packing.h).
#include "pipetrain/data/packing.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "pipetrain/base/error.h"

namespace pipetrain::data::packing_test {
namespace {

PackingOptions options(Packing packing, int64_t t, bool shuffle = false) {
  PackingOptions o;
  o.packing = packing;
  o.seq_len = t;
  o.shuffle = shuffle;
  o.seed = 7;
  return o;
}

// The ids of a row as (document, offset) pairs, in order.
std::vector<std::pair<int64_t, int64_t>> ids_of(const Row& row) {
  std::vector<std::pair<int64_t, int64_t>> ids;
  for (const Piece& piece : row) {
    for (int64_t k = 0; k < piece.length; ++k) ids.emplace_back(piece.document, piece.offset + k);
  }
  return ids;
}

TEST(DocumentPacker, SplitCutsTheStreamOfDocumentsEveryTIdsAsATokenFileIs) {
  const std::vector<int64_t> lengths = {5, 0, 3, 9, 2};  // 19 ids, an empty document among them
  const DocumentPacker packer(lengths, options(Packing::kSplit, 4));
  ASSERT_EQ(packer.rows(), (19 - 1) / 4);
  std::vector<std::pair<int64_t, int64_t>> stream;
  for (size_t d = 0; d < lengths.size(); ++d) {
    for (int64_t k = 0; k < lengths[d]; ++k) stream.emplace_back(static_cast<int64_t>(d), k);
  }
  for (int64_t r = 0; r < packer.rows(); ++r) {
    const auto ids = ids_of(packer.row(0, r));
    ASSERT_EQ(ids.size(), 5u) << "row " << r;  // T + 1: the last is the next row's first
    EXPECT_TRUE(std::equal(ids.begin(), ids.end(), stream.begin() + r * 4)) << "row " << r;
    EXPECT_EQ(packer.row(0, r), packer.row(3, r)) << "without shuffle every epoch is the same";
  }
}

TEST(DocumentPacker, SplitWithShuffleOrdersTheDocumentsPerEpochBySeed) {
  std::vector<int64_t> lengths(40);
  std::iota(lengths.begin(), lengths.end(), int64_t{1});
  const DocumentPacker packer(lengths, options(Packing::kSplit, 16, /*shuffle=*/true));
  const DocumentPacker again(lengths, options(Packing::kSplit, 16, true));
  auto first_documents = [](const DocumentPacker& p, int64_t epoch) {
    std::vector<int64_t> order;
    for (int64_t r = 0; r < p.rows(); ++r) {
      for (const Piece& piece : p.row(epoch, r)) {
        if (order.empty() || order.back() != piece.document) order.push_back(piece.document);
      }
    }
    return order;
  };
  EXPECT_EQ(first_documents(packer, 0), first_documents(again, 0));
  EXPECT_NE(first_documents(packer, 0), first_documents(packer, 1));
  std::vector<int64_t> in_order(40);
  std::iota(in_order.begin(), in_order.end(), int64_t{0});
  EXPECT_NE(first_documents(packer, 0), in_order);
}

TEST(DocumentPacker, WholePlacesEveryDocumentWholeInOneRowByBestFit) {
  // T + 1 = 11 ids per row. 8 goes first into row 0; 6 opens row 1; 3 fits row 0 (room 3, the
  // least room that holds it); 4 fits row 1 (room 5); 5 opens row 2; 1 id has no target: left out.
  const DocumentPacker packer({8, 6, 3, 4, 5, 1}, options(Packing::kWhole, 10));
  ASSERT_EQ(packer.rows(), 3);
  EXPECT_EQ(packer.row(0, 0), (Row{{0, 0, 8}, {2, 0, 3}}));
  EXPECT_EQ(packer.row(0, 1), (Row{{1, 0, 6}, {3, 0, 4}}));
  EXPECT_EQ(packer.row(0, 2), (Row{{4, 0, 5}}));
  EXPECT_EQ(packer.split_documents(), 0);
}

TEST(DocumentPacker, ADocumentLongerThanARowIsCutIntoPiecesThatKeepEveryTarget) {
  // 25 ids at T = 10: pieces [0, 11), [10, 21), [20, 25): each id but the first is some piece's
  // target.
  const DocumentPacker packer({25, 3}, options(Packing::kNone, 10));
  EXPECT_EQ(packer.split_documents(), 1);
  ASSERT_EQ(packer.rows(), 4);
  EXPECT_EQ(packer.row(0, 0), (Row{{0, 0, 11}}));
  EXPECT_EQ(packer.row(0, 1), (Row{{0, 10, 11}}));
  EXPECT_EQ(packer.row(0, 2), (Row{{0, 20, 5}}));
  EXPECT_EQ(packer.row(0, 3), (Row{{1, 0, 3}}));
  const DocumentPacker whole({25, 3}, options(Packing::kWhole, 10));
  EXPECT_EQ(whole.split_documents(), 1);
  int64_t ids = 0;
  for (int64_t r = 0; r < whole.rows(); ++r) {
    EXPECT_LE(row_ids(whole.row(0, r)), 11);
    ids += row_ids(whole.row(0, r));
  }
  EXPECT_EQ(ids, 11 + 11 + 5 + 3);
}

TEST(DocumentPacker, WholeRowsHoldEachDocumentOnceAndFillBetterThanOnePerRow) {
  std::vector<int64_t> lengths;
  for (int d = 0; d < 300; ++d) lengths.push_back(2 + (d * 37) % 120);
  const DocumentPacker whole(lengths, options(Packing::kWhole, 128, /*shuffle=*/true));
  std::multiset<int64_t> seen;
  int64_t ids = 0;
  for (int64_t r = 0; r < whole.rows(); ++r) {
    const Row row = whole.row(2, r);
    EXPECT_LE(row_ids(row), 129);
    for (const Piece& piece : row) {
      seen.insert(piece.document);
      EXPECT_EQ(piece.offset, 0);
      EXPECT_EQ(piece.length, lengths[static_cast<size_t>(piece.document)]);
      ids += piece.length;
    }
  }
  EXPECT_EQ(seen.size(), lengths.size());
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), lengths.size());
  // Filled: more than 85% of the rows' room is used (one document per row would use about 47%).
  EXPECT_GT(static_cast<double>(ids) / static_cast<double>(whole.rows() * 129), 0.85);
}

TEST(DocumentPacker, GroupByLengthPutsLongestFirstWithinEachWindow) {
  std::vector<int64_t> lengths;
  for (int d = 0; d < 20; ++d) lengths.push_back(2 + (d * 7) % 13);
  PackingOptions o = options(Packing::kNone, 32, /*shuffle=*/true);
  o.group_by_length = true;
  o.group_window = 5;
  const DocumentPacker packer(lengths, o);
  std::set<int64_t> documents;
  for (int64_t first = 0; first < 20; first += 5) {
    for (int64_t r = first; r + 1 < first + 5; ++r) {
      EXPECT_GE(packer.row(1, r).front().length, packer.row(1, r + 1).front().length);
    }
  }
  for (int64_t r = 0; r < 20; ++r) documents.insert(packer.row(1, r).front().document);
  EXPECT_EQ(documents.size(), 20u);
}

TEST(DocumentPacker, BadOptionsAndDataWithoutARowAreNamed) {
  EXPECT_THROW(DocumentPacker({4}, options(Packing::kSplit, 0)), BadInput);
  try {
    DocumentPacker({2, 1}, options(Packing::kSplit, 4));
    FAIL() << "3 ids make no row of 4 + 1";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("3 ids, fewer than one row of --seq-len 4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(DocumentPacker({1, 0, 1}, options(Packing::kNone, 4)), BadInput);
  PackingOptions grouped = options(Packing::kWhole, 4);
  grouped.group_by_length = true;
  EXPECT_THROW(DocumentPacker({5}, grouped), BadInput);
  EXPECT_EQ(parse_packing("whole"), Packing::kWhole);
  EXPECT_THROW(parse_packing("tight"), BadInput);
}

}  // namespace
}  // namespace pipetrain::data::packing_test
