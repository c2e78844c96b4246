#include "pipetrain/examples/data_loader.h"

#include <algorithm>
#include <random>
#include <set>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace pipetrain::examples {
namespace {

// Inputs whose rows are their own index, so a batch says which samples it holds.
DataLoader indexed_loader(int64_t n, DataLoaderOptions options) {
  torch::Tensor index = torch::arange(n, torch::kInt64);
  return DataLoader(index.to(torch::kFloat32).unsqueeze(1), index, options);
}

std::vector<int64_t> ids(const Batch& batch) {
  torch::Tensor t = batch.targets.contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

TEST(DataLoader, EveryEpochVisitsEverySampleOnce) {
  DataLoader loader = indexed_loader(103, DataLoaderOptions(10).seed(5));
  EXPECT_EQ(loader.batches_per_epoch(), 11);
  std::multiset<int64_t> seen;
  for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    Batch batch = loader.next();
    EXPECT_EQ(batch.inputs.size(0), b == 10 ? 3 : 10);
    EXPECT_TRUE(batch.inputs.squeeze(1).to(torch::kInt64).equal(batch.targets));
    for (int64_t id : ids(batch)) seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 103u);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 103u);
  EXPECT_EQ(loader.position(), (LoaderPosition{1, 0}));
}

TEST(DataLoader, SameSeedGivesTheSameOrderAndAnotherSeedAnother) {
  DataLoader a = indexed_loader(1000, DataLoaderOptions(32).seed(1));
  DataLoader b = indexed_loader(1000, DataLoaderOptions(32).seed(1));
  DataLoader c = indexed_loader(1000, DataLoaderOptions(32).seed(2));
  EXPECT_EQ(a.order(0), b.order(0));
  EXPECT_EQ(a.order(3), b.order(3));
  EXPECT_NE(a.order(0), c.order(0));
  EXPECT_NE(a.order(0), a.order(1)) << "each epoch must be reshuffled";
}

TEST(DataLoader, OrderDoesNotDependOnTorchThreadsOrTheGlobalSeed) {
  DataLoader loader = indexed_loader(500, DataLoaderOptions(7).seed(9));
  std::vector<int64_t> before = ids(loader.batch(2, 3));
  int threads = at::get_num_threads();
  at::set_num_threads(1);
  torch::manual_seed(12345);
  std::vector<int64_t> after = ids(indexed_loader(500, DataLoaderOptions(7).seed(9)).batch(2, 3));
  at::set_num_threads(threads);
  EXPECT_EQ(before, after);
}

TEST(DataLoader, ResumingAtAPositionContinuesWithTheSameBatches) {
  DataLoader full = indexed_loader(50, DataLoaderOptions(8).seed(3));
  std::vector<std::vector<int64_t>> reference;
  for (int k = 0; k < 20; ++k) reference.push_back(ids(full.next()));  // crosses 2 epochs (7 each)

  DataLoader first = indexed_loader(50, DataLoaderOptions(8).seed(3));
  for (int k = 0; k < 9; ++k) first.next();
  LoaderPosition saved = first.position();
  EXPECT_EQ(saved, (LoaderPosition{1, 2}));

  DataLoader resumed = indexed_loader(50, DataLoaderOptions(8).seed(3));
  resumed.seek(saved);
  for (int k = 9; k < 20; ++k) EXPECT_EQ(ids(resumed.next()), reference[k]) << "batch " << k;
}

TEST(DataLoader, StateTextRestoresThePositionAndRejectsOtherSettings) {
  DataLoader first = indexed_loader(50, DataLoaderOptions(8).seed(3));
  for (int k = 0; k < 9; ++k) first.next();
  std::string state = first.state();
  DataLoader resumed = indexed_loader(50, DataLoaderOptions(8).seed(3));
  resumed.restore_state(state);
  EXPECT_EQ(resumed.position(), first.position());
  EXPECT_EQ(ids(resumed.next()), ids(first.next()));
  DataLoader other_seed = indexed_loader(50, DataLoaderOptions(8).seed(4));
  try {
    other_seed.restore_state(state);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("seed"), std::string::npos) << e.what();
  }
  EXPECT_THROW(resumed.restore_state("{not json"), c10::Error);
}

TEST(DataLoader, DropLastDropsTheShortBatch) {
  DataLoader loader = indexed_loader(103, DataLoaderOptions(10).drop_last(true));
  EXPECT_EQ(loader.batches_per_epoch(), 10);
  for (int k = 0; k < 10; ++k) EXPECT_EQ(loader.next().inputs.size(0), 10);
  EXPECT_EQ(loader.position(), (LoaderPosition{1, 0}));
}

TEST(DataLoader, WithoutShuffleReadsInStoredOrder) {
  DataLoader loader = indexed_loader(10, DataLoaderOptions(4).shuffle(false));
  EXPECT_EQ(ids(loader.batch(0, 1)), (std::vector<int64_t>{4, 5, 6, 7}));
}

TEST(DataLoader, SeekPastTheEpochIsAnErrorMentioningTheBatchCount) {
  DataLoader loader = indexed_loader(10, DataLoaderOptions(4));
  try {
    loader.seek({0, 9});
    FAIL() << "seek past the epoch did not throw";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 batches"), std::string::npos) << e.what();
  }
}

TEST(DataLoader, MismatchedInputAndTargetCountsAreAnError) {
  EXPECT_THROW(DataLoader(torch::zeros({4, 2}), torch::zeros({3}), DataLoaderOptions(2)),
               c10::Error);
}

TEST(UniformBelow, DrawsEveryValueOfASmallRangeAboutEquallyOften) {
  std::mt19937_64 engine(1);
  std::vector<int> counts(6);
  for (int n = 0; n < 60000; ++n) ++counts[uniform_below(engine, 6)];
  for (int count : counts) EXPECT_NEAR(count, 10000, 500);
}

}  // namespace
}  // namespace pipetrain::examples
