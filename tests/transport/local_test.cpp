#include "pipetrain/transport/local.h"

#include <future>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/wait_until.h"
#include "pipetrain/base/error.h"

namespace pipetrain {
namespace {

std::vector<torch::Device> cpus(int n) {
  return std::vector<torch::Device>(n, torch::kCPU);
}

TEST(LocalTransport, ReceiveGetsWhatWasSentUnderTheSameEnvelopeDetached) {
  LocalTransport transport(cpus(2));
  torch::Tensor x = torch::ones({2}, torch::requires_grad()) * 3;
  transport.send({0, 1, 4, Payload::kActivation}, Bundle{{x}, {}});
  EXPECT_EQ(transport.pending(), 1u);
  Bundle got = transport.recv({0, 1, 4, Payload::kActivation});
  EXPECT_TRUE(torch::equal(got.tensors[0], x));
  EXPECT_FALSE(got.tensors[0].requires_grad());
  EXPECT_EQ(transport.pending(), 0u);
}

TEST(LocalTransport, AbortWakesABlockedReceiverWithTheReason) {
  LocalTransport transport(cpus(2));
  auto receiver = std::async(std::launch::async, [&] {
    try {
      transport.recv({0, 1, 0, Payload::kActivation});
    } catch (const PeerFailed& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  });
  // Aborted before it blocks, a receive fails at once: the abort must come once it waits.
  EXPECT_TRUE(testing::wait_until([&] { return transport.waiting_receivers() == 1; },
                                  std::chrono::seconds(30)))
      << "the receiver did not block within 30 s";
  transport.abort("stage 3 exploded");
  ASSERT_EQ(receiver.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_NE(receiver.get().find("stage 3 exploded"), std::string::npos);
  transport.reset();
  transport.send({1, 0, 0, Payload::kGradient}, Bundle{{torch::zeros({1})}, {}});
  EXPECT_NO_THROW(transport.recv({1, 0, 0, Payload::kGradient}));
}

TEST(LocalTransport, ReceiveTimesOutNamingTheMissingMessage) {
  LocalTransport transport(cpus(3), std::chrono::milliseconds(50));
  try {
    transport.recv({1, 2, 5, Payload::kActivation});
    FAIL() << "no timeout";
  } catch (const Timeout& e) {
    EXPECT_EQ(e.site().stage, 2);
    EXPECT_EQ(e.site().microbatch, 5);
    std::string message = e.what();
    EXPECT_NE(message.find("micro-batch 5 from stage 1 to stage 2"), std::string::npos) << message;
  }
}

TEST(LocalTransport, ResetDropsUndeliveredMessagesAndDoubleSendIsAnError) {
  LocalTransport transport(cpus(2));
  transport.send({0, 1, 0, Payload::kActivation}, Bundle{{torch::zeros({1})}, {}});
  EXPECT_THROW(transport.send({0, 1, 0, Payload::kActivation}, Bundle{{torch::zeros({1})}, {}}),
               ScheduleInvalid);
  transport.reset();
  EXPECT_EQ(transport.pending(), 0u);
}

}  // namespace
}  // namespace pipetrain
