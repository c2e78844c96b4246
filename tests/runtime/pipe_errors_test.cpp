// Failures in any layer on any stage reach the caller with context, quickly, and the next step
// works. Bad options fail at construction naming the value.
#include <atomic>
#include <future>

#include <gtest/gtest.h>

#include "pipetrain/base/error.h"
#include "pipetrain/runtime/interpreter.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/stage/skip.h"
#include "training_reference.h"

namespace pipetrain {
namespace {

std::atomic<bool> fail_forward{false};
std::atomic<bool> fail_backward{false};
std::atomic<bool> fail_recompute{false};

struct ThrowInBackward : torch::autograd::Function<ThrowInBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, torch::Tensor x) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    if (fail_backward) throw std::runtime_error("boom in backward");
    return {grads[0]};
  }
};

class FailingImpl : public torch::nn::Cloneable<FailingImpl> {
 public:
  void reset() override {}
  torch::Tensor forward(torch::Tensor x) {
    if (fail_forward) throw std::runtime_error("boom in forward");
    if (fail_recompute && is_recomputing()) throw std::runtime_error("boom in recompute");
    return ThrowInBackward::apply(x);
  }
};
TORCH_MODULE(Failing);

// Three stages of (Linear, Tanh); the failing layer sits at the end of stage `failing_stage`.
Pipe make_pipe(int failing_stage, const std::string& schedule, Checkpoint checkpoint) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  std::vector<int64_t> balance;
  for (int j = 0; j < 3; ++j) {
    model->push_back(torch::nn::Linear(4, 4));
    model->push_back(torch::nn::Tanh());
    if (j == failing_stage) model->push_back(Failing());
    balance.push_back(j == failing_stage ? 3 : 2);
  }
  return Pipe(model,
              PipeOptions().balance(balance).chunks(4).schedule(schedule).checkpoint(checkpoint));
}

// Runs one step; fails the test when it takes more than 5 s; returns the error message.
std::string step_error(Pipe& pipe) {
  torch::Tensor x = torch::randn({8, 4});
  torch::Tensor y = torch::randn({8, 4});
  auto started = std::chrono::steady_clock::now();
  auto result = std::async(std::launch::async, [&]() -> std::string {
    try {
      pipe->train_step(x, y, testing::mse);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  });
  if (result.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    ADD_FAILURE() << "the step hung";
    std::abort();  // a hung worker cannot be joined; stop the binary loudly
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_LT(seconds, 1.0) << "the error took " << seconds << " s to reach the caller";
  return result.get();
}

struct FailCase {
  int stage;
  std::atomic<bool>* flag;
  std::string what;
  std::string schedule;
  Checkpoint checkpoint;
};

class PipeErrors : public ::testing::TestWithParam<FailCase> {};

TEST_P(PipeErrors, ErrorNamesStageMicroBatchRankAndCauseAndTheNextStepWorks) {
  const FailCase& c = GetParam();
  Pipe pipe = make_pipe(c.stage, c.schedule, c.checkpoint);
  c.flag->store(true);
  std::string message = step_error(pipe);
  c.flag->store(false);
  ASSERT_FALSE(message.empty()) << "no error surfaced";
  EXPECT_NE(message.find("stage " + std::to_string(c.stage)), std::string::npos) << message;
  EXPECT_NE(message.find("micro-batch "), std::string::npos) << message;
  EXPECT_NE(message.find("rank " + std::to_string(c.stage)), std::string::npos) << message;
  EXPECT_NE(message.find(c.what), std::string::npos) << message;
  EXPECT_EQ(message.find("another rank failed"), std::string::npos) << message;
  EXPECT_EQ(step_error(pipe), "") << "the step after the failure failed";
}

INSTANTIATE_TEST_SUITE_P(
    EveryPlace, PipeErrors,
    ::testing::Values(
        FailCase{0, &fail_forward, "boom in forward", "1f1b", Checkpoint::kNever},
        FailCase{1, &fail_forward, "boom in forward", "gpipe", Checkpoint::kAlways},
        FailCase{2, &fail_forward, "boom in forward", "zb-h1", Checkpoint::kNever},
        FailCase{0, &fail_backward, "boom in backward", "gpipe", Checkpoint::kNever},
        FailCase{1, &fail_backward, "boom in backward", "zb-h1", Checkpoint::kNever},
        FailCase{2, &fail_backward, "boom in backward", "1f1b", Checkpoint::kExceptLast},
        FailCase{1, &fail_recompute, "boom in recompute", "1f1b", Checkpoint::kAlways}));

TEST(PipeErrors, ErrorIsAStepErrorCarryingTheStage) {
  Pipe pipe = make_pipe(2, "1f1b", Checkpoint::kNever);
  fail_forward = true;
  try {
    pipe->train_step(torch::randn({4, 4}), torch::randn({4, 4}), testing::mse);
    ADD_FAILURE() << "no error";
  } catch (const StepError& e) {
    EXPECT_EQ(e.stage, 2);
    EXPECT_EQ(e.rank, 2);
    EXPECT_FALSE(e.cancelled);
  }
  fail_forward = false;
}

TEST(PipeErrors, ALossThatThrowsIsReportedOnTheLastStage) {
  Pipe pipe = make_pipe(-1, "gpipe", Checkpoint::kNever);
  try {
    pipe->train_step(torch::randn({4, 4}), torch::randn({4, 4}),
                     [](const torch::Tensor&, const torch::Tensor&) -> torch::Tensor {
                       throw std::runtime_error("bad loss");
                     });
    ADD_FAILURE() << "no error";
  } catch (const StepError& e) {
    EXPECT_EQ(e.stage, 2);
    EXPECT_NE(std::string(e.what()).find("bad loss"), std::string::npos);
  }
}

std::string construction_error(const PipeOptions& options, int layers = 4) {
  torch::nn::Sequential model;
  for (int l = 0; l < layers; ++l) model->push_back(torch::nn::Linear(2, 2));
  try {
    Pipe pipe(model, options);
  } catch (const BadInput& e) {
    return e.what();
  }
  return "";
}

TEST(PipeOptionsCheck, BadOptionsFailAtConstructionNamingTheValue) {
  EXPECT_NE(construction_error(PipeOptions().balance({1, 2})).find("sums to 3"), std::string::npos);
  EXPECT_NE(construction_error(PipeOptions().stages(5)).find("more stages (5) than layers (4)"),
            std::string::npos);
  EXPECT_NE(construction_error(PipeOptions().stages(2).devices({torch::kCPU}))
                .find("devices lists 1 devices but the Pipe has 2 ranks"),
            std::string::npos);
  EXPECT_NE(construction_error(PipeOptions().chunks(0)).find("chunks must be at least 1 (got 0)"),
            std::string::npos);
  EXPECT_NE(construction_error(PipeOptions().virtual_stages(0)).find("virtual_stages"),
            std::string::npos);
  std::string unknown = construction_error(PipeOptions().stages(2).schedule("zigzag"));
  EXPECT_NE(unknown.find("zigzag"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("1f1b"), std::string::npos) << unknown;  // lists the valid ones
  EXPECT_NE(
      construction_error(PipeOptions().stages(3).virtual_stages(2).schedule("interleaved-1f1b"))
          .find("divisible by 2"),
      std::string::npos);
  EXPECT_NE(construction_error(PipeOptions().schedule("custom")).find("custom_schedule"),
            std::string::npos);
  EXPECT_EQ(construction_error(PipeOptions().stages(4).chunks(3)), "");
}

// Pipe and DistributedPipe lay out their stages with stage_balance(): a balance that sums to the
// layer count with an empty or negative stage is an error naming it, in both.
TEST(PipeOptionsCheck, ABalanceWithAnEmptyOrNegativeStageIsAnErrorInBothRuntimes) {
  for (const std::vector<int64_t>& balance :
       {std::vector<int64_t>{0, 4}, std::vector<int64_t>{-1, 5}, std::vector<int64_t>{3, 0, 1}}) {
    std::string message;
    try {
      stage_balance(PipeOptions().balance(balance), 4);
    } catch (const BadInput& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("every stage needs at least one"), std::string::npos) << message;
    EXPECT_NE(construction_error(PipeOptions().balance(balance)).find("at least one"),
              std::string::npos);
  }
  EXPECT_EQ(stage_balance(PipeOptions().stages(3), 7), (std::vector<int64_t>{3, 2, 2}));
}

}  // namespace
}  // namespace pipetrain
