// Tests for mini-batches of packed documents (include/pipetrain/train/document_batches.h) and the
// blend walk under them (include/pipetrain/data/blend.h): each dataset's share, rows that are the
// datasets' own, a pure function of the step (resume), the counted targets, and the errors.
#include "pipetrain/train/document_batches.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/io/indexed_dataset.h"

namespace pipetrain::train::document_batches_test {
namespace {

std::string scratch(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::path(PIPETRAIN_BINARY_DIR) / "test-scratch" / "document_batches";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

// A dataset of documents of `lengths` whose ids are first, first + 1, ... in order (so a row
// names its dataset and where it came from).
std::shared_ptr<const data::DocumentDataset> documents(const std::string& name, int64_t first,
                                                       const std::vector<int64_t>& lengths,
                                                       const std::vector<int64_t>& mask = {}) {
  std::vector<std::vector<int64_t>> docs, masks;
  int64_t id = first;
  for (int64_t length : lengths) {
    docs.emplace_back();
    masks.emplace_back();
    for (int64_t k = 0; k < length; ++k) {
      docs.back().push_back(id++);
      masks.back().push_back(mask.empty() ? 1 : mask[static_cast<size_t>(masks.back().size())]);
    }
  }
  const std::string prefix = scratch(name);
  io::write_indexed_dataset(prefix, docs, io::IndexedDtype::kInt32);
  if (mask.empty()) return std::make_shared<const data::DocumentDataset>(prefix);
  io::write_indexed_dataset(prefix + "_mask", masks, io::IndexedDtype::kUint8);
  return std::make_shared<const data::DocumentDataset>(prefix, prefix + "_mask");
}

// Three datasets weighted 5 : 3 : 2, rows of T = 4 (split): dataset d's ids begin at 10000 * d.
std::vector<DocumentSource> three_sources() {
  return {{5.0, documents("a", 0, {20, 21})},     // 41 ids: 10 rows
          {3.0, documents("b", 10000, {29})},     // 7
          {2.0, documents("c", 20000, {6, 7})}};  // 13 ids: 3
}

TEST(BlendWalk, EachDatasetGivesItsWeightsShareWithinOneSample) {
  const data::BlendWalk walk({5, 3, 2});
  std::vector<int64_t> counts(3, 0);
  for (int64_t g = 0; g < 1000; ++g) {
    const auto [d, count] = walk.source_of(g);
    ASSERT_LT(d, 3u);
    EXPECT_EQ(count, counts[d]) << "sample " << g;  // each dataset's samples in turn
    ++counts[d];
    for (size_t e = 0; e < 3; ++e) {
      EXPECT_LE(
          std::abs(static_cast<double>(counts[e]) - walk.weights()[e] * static_cast<double>(g + 1)),
          1.0 + 1e-9)
          << "dataset " << e << " after " << g + 1 << " samples";
    }
  }
  EXPECT_EQ(walk.source_of(3), data::BlendWalk({5, 3, 2}).source_of(3));  // walked again
  EXPECT_THROW(data::BlendWalk({1, 0}), BadInput);
}

TEST(DocumentBatches, ABlendsRowsAreTheDatasetsRowsAndAStepIsAPureFunctionOfK) {
  const DocumentBatches blend(three_sources(), DocumentBatchOptions(4, 6).shuffle(true).seed(7));
  EXPECT_EQ(blend.per_epoch(), 4);  // 10 + 7 + 3 rows, batches of 6
  std::vector<data::Batch> steps;
  for (int64_t k = 0; k < 12; ++k) steps.push_back(blend.batch(k));
  // A fresh source (a resumed run) asked for step 9 first, then an earlier one.
  const DocumentBatches resumed(three_sources(), DocumentBatchOptions(4, 6).shuffle(true).seed(7));
  for (int64_t k : {9, 3, 11}) {
    const data::Batch again = resumed.batch(k);
    EXPECT_TRUE(torch::equal(again.inputs[0], steps[static_cast<size_t>(k)].inputs[0])) << k;
    EXPECT_TRUE(torch::equal(again.targets, steps[static_cast<size_t>(k)].targets)) << k;
  }
  std::map<int64_t, int64_t> rows_of;  // dataset -> rows taken
  for (const data::Batch& batch : steps) {
    EXPECT_EQ(batch.inputs[0].sizes(), (torch::IntArrayRef{6, 4}));
    for (int64_t n = 0; n < 6; ++n) {
      const int64_t first = batch.inputs[0][n][0].item<int64_t>();
      ++rows_of[first / 10000];
      // A counted target is the next id of its document; one not counted is followed by the
      // first id of a document (the next segment).
      const std::set<int64_t> starts = {0, 20, 10000, 20000, 20006};
      int64_t counted = 0;
      for (int64_t t = 0; t < 4; ++t) {
        const int64_t target = batch.targets[n][t].item<int64_t>();
        if (target != -100) {
          EXPECT_EQ(target, batch.inputs[0][n][t].item<int64_t>() + 1);
          ++counted;
        } else if (t + 1 < 4) {
          EXPECT_TRUE(starts.count(batch.inputs[0][n][t + 1].item<int64_t>())) << "row " << n;
        }
      }
      EXPECT_DOUBLE_EQ(batch.weights[n].item<double>(), static_cast<double>(counted));
    }
  }
  EXPECT_NEAR(static_cast<double>(rows_of[0]) / 72.0, 0.5, 1.0 / 72 + 1e-9);
  EXPECT_NEAR(static_cast<double>(rows_of[2]) / 72.0, 0.2, 1.0 / 72 + 1e-9);
}

TEST(DocumentBatches, PackNoneGivesOneDocumentARowPaddedToTheBatchsLongest) {
  const DocumentBatches batches({{1.0, documents("none", 0, {3, 9, 5, 2})}},
                                DocumentBatchOptions(16, 2).packing(data::Packing::kNone));
  const data::Batch first = batches.batch(0);  // 3 and 9 ids: 2 and 8 inputs
  EXPECT_EQ(first.inputs[0].sizes(), (torch::IntArrayRef{2, 8}));
  EXPECT_EQ(first.layout->used(0), 2);
  const data::Batch second = batches.batch(1);  // 5 and 2 ids
  EXPECT_EQ(second.inputs[0].sizes(), (torch::IntArrayRef{2, 4}));
  EXPECT_DOUBLE_EQ(second.total_weight(), 5.0);
}

TEST(DocumentBatches, AMiniBatchWithoutACountedTargetIsNamedWithItsStep) {
  // Every document is all prompt (mask 0): a batch of one has nothing to learn.
  const auto dataset = documents("prompt", 0, {4, 4}, {0, 0, 0, 0});
  const DocumentBatches batches({{1.0, dataset}},
                                DocumentBatchOptions(8, 1).packing(data::Packing::kNone));
  try {
    batches.batch(1);
    FAIL() << "a batch of masked targets was taken";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("step 1: its mini-batch of 1 rows has no counted target"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("document 1 ids 0..3"), std::string::npos) << e.what();
  }
}

TEST(DocumentBatches, ABadWeightOrADatasetWithoutARowIsNamed) {
  std::vector<DocumentSource> sources = three_sources();
  sources[1].weight = 0;
  try {
    DocumentBatches blend(sources, DocumentBatchOptions(4, 2));
    ADD_FAILURE() << "a weight of 0 was taken";
  } catch (const BadInput& error) {
    EXPECT_NE(std::string(error.what()).find("/b'"), std::string::npos) << error.what();
  }
  try {
    DocumentBatches blend(three_sources(), DocumentBatchOptions(40, 2));
    ADD_FAILURE() << "b holds 29 ids, fewer than a row of 41";
  } catch (const BadInput& error) {
    EXPECT_NE(std::string(error.what()).find("/b': the documents hold 29 ids"), std::string::npos)
        << error.what();
  }
}

TEST(EvaluateDocuments, TheLossIsTheMeanOverEveryRowsCountedTargets) {
  const DocumentBatches batches({{1.0, documents("eval", 0, {5, 3, 4})}},
                                DocumentBatchOptions(8, 2).packing(data::Packing::kNone));
  // Uniform logits over 16 ids: every counted target costs log(16).
  int calls = 0;
  const DocumentEvaluation e = evaluate_documents(
      [&](const data::Batch& batch) {
        ++calls;
        return torch::zeros({batch.rows(), batch.inputs[0].size(1), 16});
      },
      batches, 2);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(e.rows, 3);
  EXPECT_EQ(e.counted_targets, 4 + 2 + 3);
  EXPECT_NEAR(e.loss, std::log(16.0), 1e-6);
  EXPECT_NEAR(e.perplexity, 16.0, 1e-4);
}

}  // namespace
}  // namespace pipetrain::train::document_batches_test
