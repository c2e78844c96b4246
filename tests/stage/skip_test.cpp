#include "pipetrain/stage/skip.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/base/error.h"

namespace pipetrain {
namespace {

TEST(Skip, PopReturnsWhatWasStashedInTheSameContext) {
  SkipContext context;
  SkipContextGuard guard(&context);
  torch::Tensor t = torch::ones({2});
  stash("a", t);
  EXPECT_EQ(context.pending.size(), 1u);
  EXPECT_TRUE(pop("a").equal(t));
  EXPECT_TRUE(context.pending.empty());
}

TEST(Skip, PopOfAMissingNameNamesWhatIsAvailable) {
  SkipContext context;
  SkipContextGuard guard(&context);
  stash("present", torch::zeros({1}));
  try {
    pop("absent");
    FAIL() << "pop of a missing skip did not throw";
  } catch (const BadInput& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("'absent'"), std::string::npos) << message;
    EXPECT_NE(message.find("present"), std::string::npos) << message;
  }
}

TEST(Skip, GuardRestoresThePreviousContextAndRecomputeFlag) {
  SkipContext outer;
  SkipContextGuard outer_guard(&outer);
  EXPECT_FALSE(is_recomputing());
  {
    SkipContext inner;
    inner.recomputing = true;
    SkipContextGuard inner_guard(&inner);
    EXPECT_TRUE(is_recomputing());
    stash("x", torch::zeros({1}));
  }
  EXPECT_FALSE(is_recomputing());
  EXPECT_TRUE(outer.pending.empty());
}

}  // namespace
}  // namespace pipetrain
