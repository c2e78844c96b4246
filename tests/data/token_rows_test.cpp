// Tests for documents with loss masks and the tensors of packed rows
// (include/pipetrain/data/document_dataset.h, token_rows.h).
#include "pipetrain/data/token_rows.h"

#include <filesystem>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <gtest/gtest.h>

#include "pipetrain/base/error.h"
#include "pipetrain/io/indexed_dataset.h"

namespace pipetrain::data::token_rows_test {
namespace {

std::string scratch(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::path(PIPETRAIN_BINARY_DIR) / "test-scratch" / "token_rows";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

// Document A = 1 2 3 4 5, B = 6 7 8; B's mask 1 0 1.
const std::string& two_documents() {
  static const std::string prefix = [] {
    const std::string p = scratch("two");
    io::write_indexed_dataset(p, {{1, 2, 3, 4, 5}, {6, 7, 8}});
    io::write_indexed_dataset(p + "_loss_mask", {{1, 1, 1, 1, 1}, {1, 0, 1}},
                              io::IndexedDtype::kUint8);
    return p;
  }();
  return prefix;
}

std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const BadInput& e) {
    return e.what();
  }
  return "";
}

TEST(TokenRows, TargetsCountOnlyWithinADocumentAndSegmentsFollowTheDocuments) {
  const DocumentDataset dataset(two_documents());
  TokenRowOptions options;
  options.seq_len = 3;
  // Split rows of T + 1 = 4 ids: 1 2 3 4 | 4 5 6 7.
  const DocumentPacker packer(dataset.lengths(), {Packing::kSplit, 3});
  ASSERT_EQ(packer.rows(), 2);
  const Batch batch =
      make_token_batch({{&dataset, packer.row(0, 0)}, {&dataset, packer.row(0, 1)}}, options);
  EXPECT_TRUE(torch::equal(batch.inputs[0], torch::tensor({1, 2, 3, 4, 5, 6}).view({2, 3})));
  EXPECT_TRUE(torch::equal(batch.targets, torch::tensor({2, 3, 4, 5, -100, 7}).view({2, 3})));
  EXPECT_TRUE(torch::equal(batch.weights, torch::tensor({3.0, 2.0}, torch::kFloat64)));
  EXPECT_EQ(batch.layout->segments(0), (std::vector<int64_t>{3}));
  EXPECT_EQ(batch.layout->segments(1), (std::vector<int64_t>{2, 1}));
  EXPECT_TRUE(torch::equal(batch.layout->positions(torch::kCPU),
                           torch::tensor({0, 1, 2, 0, 1, 0}).view({2, 3})));
}

TEST(TokenRows, TheLossMaskDropsUnlearnedTargetsAndPaddingCountsNothing) {
  const DocumentDataset dataset(two_documents(), two_documents() + "_loss_mask");
  EXPECT_TRUE(dataset.has_loss_mask());
  TokenRowOptions options;
  options.seq_len = 8;
  options.fixed_width = false;
  options.pad_multiple = 4;
  options.pad_id = 0;
  // One document per row: 1 2 3 4 5 (4 inputs), 6 7 8 (2 inputs; target 7 masked out).
  const Batch batch = make_token_batch({{&dataset, {{0, 0, 5}}}, {&dataset, {{1, 0, 3}}}}, options);
  EXPECT_EQ(batch.inputs[0].sizes(), (torch::IntArrayRef{2, 4}));  // longest 4, a multiple of 4
  EXPECT_TRUE(torch::equal(batch.inputs[0], torch::tensor({1, 2, 3, 4, 6, 7, 0, 0}).view({2, 4})));
  EXPECT_TRUE(
      torch::equal(batch.targets, torch::tensor({2, 3, 4, 5, -100, 8, -100, -100}).view({2, 4})));
  EXPECT_TRUE(torch::equal(batch.weights, torch::tensor({4.0, 1.0}, torch::kFloat64)));
  EXPECT_EQ(batch.layout->used(1), 2);
  EXPECT_EQ(batch_tokens(batch).tokens, 6);
  EXPECT_EQ(batch_tokens(batch).counted_targets, 5);
  check_batch(batch);
}

TEST(DocumentDataset, AMaskOfAnotherShapeAndAnIdOutsideTheVocabularyAreNamed) {
  const std::string other = scratch("other_mask");
  io::write_indexed_dataset(other, {{1, 1, 1, 1, 1}, {1, 1}}, io::IndexedDtype::kUint8);
  std::string message = error_of([&] { DocumentDataset(two_documents(), other); });
  EXPECT_NE(message.find("document 1 has 2 values but its tokens"), std::string::npos) << message;
  const std::string fewer = scratch("fewer_mask");
  io::write_indexed_dataset(fewer, {{1, 1, 1, 1, 1}}, io::IndexedDtype::kUint8);
  message = error_of([&] { DocumentDataset(two_documents(), fewer); });
  EXPECT_NE(message.find("holds 1 documents but its dataset"), std::string::npos) << message;
  const DocumentDataset dataset(two_documents());
  message = error_of([&] { dataset.check_vocabulary(7); });
  EXPECT_NE(message.find("document 1 has id 7 at offset 1, outside the model's vocabulary of 7"),
            std::string::npos)
      << message;
  EXPECT_EQ(error_of([&] { dataset.check_vocabulary(9); }), "");
  const std::string empty = scratch("empty");
  io::write_indexed_dataset(empty, {});
  message = error_of([&] { DocumentDataset{empty}; });
  EXPECT_NE(message.find("holds no document"), std::string::npos) << message;
}

// Regression: a token dataset (uint16 ids) given as the loss mask trained, every token whose id
// is not 0 learned, without a word.
TEST(DocumentDataset, ATokenDatasetGivenAsTheLossMaskIsRefusedNamingItsDtypeAndFirstValue) {
  const std::string message = error_of([&] { DocumentDataset(two_documents(), two_documents()); });
  EXPECT_NE(message.find("loss mask '" + two_documents() + "' (" + two_documents() +
                         ".idx) holds uint16 values, but a loss mask is uint8"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("its first value other than 0 or 1 is 2 at position 1 of document 0"),
            std::string::npos)
      << message;
  // A mask of 0 and 1 in another dtype is refused too, saying what to write.
  const std::string wide = scratch("wide_mask");
  io::write_indexed_dataset(wide, {{1, 1, 1, 1, 1}, {1, 0, 1}}, io::IndexedDtype::kUint16);
  const std::string wide_message = error_of([&] { DocumentDataset(two_documents(), wide); });
  EXPECT_NE(wide_message.find("holds uint16 values"), std::string::npos) << wide_message;
  EXPECT_NE(wide_message.find("its values are all 0 or 1: write it as uint8"), std::string::npos)
      << wide_message;
}

TEST(DocumentDataset, AMaskValueOtherThanZeroOrOneIsRefusedNamingItsDocumentAndPosition) {
  const std::string bad = scratch("bad_mask");
  io::write_indexed_dataset(bad, {{1, 1, 1, 1, 1}, {1, 0, 2}}, io::IndexedDtype::kUint8);
  const std::string message = error_of([&] { DocumentDataset(two_documents(), bad); });
  EXPECT_NE(message.find("loss mask '" + bad + "' (" + bad +
                         ".bin) holds 2 at position 2 of document 1, but a loss mask is uint8 "
                         "holding 0 (not learned) or 1 (learned) per token"),
            std::string::npos)
      << message;
  EXPECT_EQ(error_of([&] { DocumentDataset(two_documents(), two_documents() + "_loss_mask"); }),
            "");
}

}  // namespace
}  // namespace pipetrain::data::token_rows_test
