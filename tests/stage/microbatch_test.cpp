#include "pipetrain/stage/microbatch.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/stage/layer_call.h"

namespace pipetrain {
namespace {

TEST(Microbatch, UnevenRowsGiveTheFirstMicroBatchesOneRowMore) {
  EXPECT_EQ(microbatch_sizes(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(microbatch_sizes(8, 4), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(microbatch_sizes(7, 1), (std::vector<int64_t>{7}));
}

TEST(Microbatch, FewerRowsThanChunksGiveOneMicroBatchPerRow) {
  EXPECT_EQ(microbatch_sizes(3, 4), (std::vector<int64_t>{1, 1, 1}));
}

TEST(Microbatch, BadCountsAreErrors) {
  EXPECT_THROW(microbatch_sizes(0, 4), BadInput);
  EXPECT_THROW(microbatch_sizes(4, 0), BadInput);
}

TEST(Microbatch, TupleSplitsAtTheSameRowsAndJoinsBack) {
  torch::Tensor a = torch::arange(10).reshape({5, 2});
  torch::Tensor b = torch::arange(5);
  auto parts = split_microbatches({a, b}, microbatch_sizes(5, 2));
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0][0].size(0), 3);
  EXPECT_EQ(parts[1][1].size(0), 2);
  EXPECT_EQ(parts[1][1][0].item<int64_t>(), 3);
  auto joined = join_microbatches(parts);
  EXPECT_TRUE(torch::equal(joined[0], a));
  EXPECT_TRUE(torch::equal(joined[1], b));
}

TEST(Microbatch, TensorsWithDifferentRowCountsAreAnError) {
  EXPECT_THROW(split_microbatches({torch::zeros({4, 2}), torch::zeros({3})}, {2, 2}), BadInput);
  EXPECT_THROW(split_microbatches({torch::tensor(1.0)}, {1}), BadInput);
}

struct PairOut : torch::nn::Module {
  std::tuple<torch::Tensor, torch::Tensor> forward(torch::Tensor x) { return {x, x + 1}; }
};
struct TwoIn : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x, torch::Tensor y) { return x * y; }
};
struct IntOut : torch::nn::Module {
  int forward(torch::Tensor) { return 3; }
};

TEST(LayerCall, TuplesFlowBetweenLayersAndNonTensorsAreNamedErrors) {
  torch::nn::AnyModule pair(std::make_shared<PairOut>());
  torch::nn::AnyModule two(std::make_shared<TwoIn>());
  torch::nn::AnyModule bad(std::make_shared<IntOut>());
  auto mid = call_layer(pair, "pair", {torch::ones({2})});
  ASSERT_EQ(mid.size(), 2u);
  auto out = call_layer(two, "two", mid);
  EXPECT_TRUE(torch::equal(out[0], torch::full({2}, 2.0)));
  try {
    call_layer(bad, "bad", {torch::ones({2})});
    FAIL() << "an int result did not throw";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("'bad'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pipetrain
