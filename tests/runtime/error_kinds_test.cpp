// One real library call per pipetrain::Error kind, in-process: the kind a caller catches, the site
// it names and the text it keeps (include/pipetrain/base/error.h; the class-level checks are in
// tests/base/error_test.cpp; a hung rank's Timeout between processes is checked by
// Distributed.AHungRankMakesTheOthersExitAfterTheTimeout).
#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <string>
#include <thread>

#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/runtime/interpreter.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/runtime/tensor_io.h"
#include "pipetrain/schedule/text_format.h"
#include "pipetrain/transport/c10d.h"
#include "pipetrain/transport/local.h"
#include "training_reference.h"

namespace pipetrain {
namespace {

torch::nn::Sequential four_layers() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(4, 4), torch::nn::Tanh(), torch::nn::Linear(4, 4),
                               torch::nn::Tanh());
}

// Throws from its forward, or sleeps there: a stage slower than the pipe's timeout is what the
// sleep makes (no other thread or process is waited for).
class MisbehavingImpl : public torch::nn::Cloneable<MisbehavingImpl> {
 public:
  explicit MisbehavingImpl(std::chrono::milliseconds sleep = std::chrono::milliseconds(0))
      : sleep_(sleep) {}
  void reset() override {}
  torch::Tensor forward(torch::Tensor x) {
    if (sleep_.count() == 0) throw std::runtime_error("boom");
    std::this_thread::sleep_for(sleep_);
    return x;
  }

 private:
  std::chrono::milliseconds sleep_;
};
TORCH_MODULE(Misbehaving);

TEST(ErrorKinds, APipeWithAnInvalidBalanceThrowsBadInputNamingIt) {
  try {
    Pipe pipe(four_layers(), PipeOptions().balance({3, 2}));
    FAIL() << "no error";
  } catch (const BadInput& error) {
    EXPECT_EQ(error.kind(), ErrorKind::BadInput);
    EXPECT_EQ(error.exit_code(), 2);
    EXPECT_NE(error.message().find("balance {3,2} sums to 5"), std::string::npos) << error.what();
  }
}

TEST(ErrorKinds, ATimeoutOutsideAMillisecondTo1e7SecondsIsBadInputNamingIt) {
  // Infinity and 1e300 s once wrapped to a negative wait; 1e-9 s rounded to none.
  for (double seconds : {std::numeric_limits<double>::infinity(), 1e300, 1.5e7, 1e-9, 0.0, -1.0,
                         std::numeric_limits<double>::quiet_NaN()}) {
    try {
      Pipe pipe(four_layers(), PipeOptions().balance({2, 2}).timeout_seconds(seconds));
      ADD_FAILURE() << seconds << " s: no error";
    } catch (const BadInput& error) {
      EXPECT_NE(error.message().find("timeout_seconds must be from 0.001 to 1e+07 seconds"),
                std::string::npos)
          << error.what();
    }
  }
  EXPECT_EQ(timeout_of(PipeOptions().timeout_seconds(0.0015)), std::chrono::milliseconds(2));
  EXPECT_EQ(timeout_of(PipeOptions().timeout_seconds(1e7)), std::chrono::seconds(10000000));
  Pipe pipe(four_layers(), PipeOptions().balance({2, 2}).timeout_seconds(1e7));
  EXPECT_EQ(pipe->forward(torch::ones({2, 4})).size(0), 2);
}

TEST(ErrorKinds, ACustomScheduleThatBreaksADependencyThrowsScheduleInvalid) {
  // Rank 1 runs the backward of micro-batch 1 before its forward.
  const schedule::Schedule broken = schedule::parse_schedule("0F0,0F1,0B0,0B1\n1F0,1B1,1F1,1B0\n");
  try {
    Pipe pipe(four_layers(),
              PipeOptions().stages(2).chunks(2).schedule("custom").custom_schedule(broken));
    FAIL() << "no error";
  } catch (const ScheduleInvalid& error) {
    EXPECT_EQ(error.exit_code(), 2);
    EXPECT_NE(error.message().find("is not runnable"), std::string::npos) << error.what();
  }
}

TEST(ErrorKinds, AMissingTensorFileThrowsFileErrorNamingThePath) {
  const std::string path = ::testing::TempDir() + "pipetrain_error_kinds_absent.pt";
  try {
    load_tensor(path);
    FAIL() << "no error";
  } catch (const FileError& error) {
    EXPECT_EQ(error.kind(), ErrorKind::File);
    EXPECT_NE(error.message().find(path), std::string::npos) << error.what();
  }
}

TEST(ErrorKinds, CorruptBundleMetadataFromTheWireIsATransportFailure) {
  auto metadata = encode_bundle_metadata(Bundle{{torch::zeros({2, 3})}, {"skip"}});
  metadata.pop_back();
  try {
    decode_bundle_metadata(metadata, torch::kCPU);
    FAIL() << "no error";
  } catch (const TransportFailure& error) {
    EXPECT_EQ(error.exit_code(), 1);
    EXPECT_NE(error.message().find("truncated bundle metadata"), std::string::npos) << error.what();
  }
}

TEST(ErrorKinds, AReceiveThatNobodySendsIsATimeoutNamingStageAndMicrobatch) {
  LocalTransport transport({torch::kCPU, torch::kCPU}, std::chrono::milliseconds(20));
  try {
    transport.recv({0, 1, 3, Payload::kActivation});
    FAIL() << "no error";
  } catch (const Timeout& error) {
    EXPECT_EQ(error.site().stage, 1);
    EXPECT_EQ(error.site().microbatch, 3);
    EXPECT_EQ(std::string(error.what()).rfind("stage 1, micro-batch 3: timed out after 20 ms", 0),
              0u)
        << error.what();
  }
}

TEST(ErrorKinds, AReceiveAfterAnAbortIsPeerFailedWithTheReason) {
  LocalTransport transport({torch::kCPU, torch::kCPU});
  transport.abort("rank 0 failed: boom");
  try {
    transport.recv({0, 1, 0, Payload::kActivation});
    FAIL() << "no error";
  } catch (const PeerFailed& error) {
    EXPECT_NE(error.message().find("rank 0 failed: boom"), std::string::npos) << error.what();
  }
}

TEST(ErrorKinds, AFailingForwardInAPipeNamesRankStageActionAndMicrobatch) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(4, 4), torch::nn::Linear(4, 4), Misbehaving());
  Pipe pipe(model, PipeOptions().balance({1, 2}).chunks(2).schedule("gpipe"));
  try {
    pipe->train_step(torch::randn({4, 4}), torch::randn({4, 4}), testing::mse);
    FAIL() << "no error";
  } catch (const StepError& error) {
    EXPECT_EQ(error.kind(), ErrorKind::Runtime);
    EXPECT_EQ(error.exit_code(), 1);
    EXPECT_FALSE(error.cancelled);
    EXPECT_EQ(error.site().rank, 1);
    EXPECT_EQ(error.site().stage, 1);
    EXPECT_EQ(error.site().action, "1F0");
    EXPECT_EQ(error.site().microbatch, 0);
    EXPECT_EQ(std::string(error.what()).rfind("rank 1, stage 1, action 1F0, micro-batch 0: ", 0),
              0u)
        << error.what();
    EXPECT_NE(error.message().find("boom"), std::string::npos) << error.what();
    EXPECT_EQ(error.message().find("rank 1, stage 1"), std::string::npos) << error.message();
  }
}

TEST(ErrorKinds, AStageSlowerThanTheTimeoutMakesThePipeThrowATimeoutFromTheWaitingRank) {
  torch::manual_seed(0);
  torch::nn::Sequential model(Misbehaving(std::chrono::milliseconds(600)), torch::nn::Linear(4, 4));
  Pipe pipe(model, PipeOptions().balance({1, 1}).chunks(1).timeout_seconds(0.1));
  try {
    pipe->train_step(torch::randn({2, 4}), torch::randn({2, 4}), testing::mse);
    FAIL() << "no error";
  } catch (const StepError& error) {
    // Rank 1 waited for the activation; rank 0, still sleeping, is told to stop (cancelled) and
    // loses to the first real error.
    EXPECT_EQ(error.kind(), ErrorKind::Timeout) << error.what();
    EXPECT_FALSE(error.cancelled);
    EXPECT_EQ(error.site().rank, 1);
    EXPECT_EQ(error.site().stage, 1);
    EXPECT_EQ(error.site().microbatch, 0);
    EXPECT_NE(error.message().find("timed out after 100 ms"), std::string::npos) << error.what();
    // The transport's own site (stage 1, micro-batch 0) is the StepError's: not repeated.
    EXPECT_EQ(error.message().find("stage 1, micro-batch 0:"), std::string::npos)
        << error.message();
  }
}

}  // namespace
}  // namespace pipetrain
