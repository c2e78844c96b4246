// C10dTransport: tag encoding and metadata in-process; bundles between real processes over
// loopback Gloo (pipetrain_rank_helper as the ranks, tests/helpers/rank_helper.cpp).
#include "pipetrain/transport/c10d.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <future>
#include <set>
#include <thread>

#include "../helpers/multiprocess.h"

#include "pipetrain/base/error.h"
#include "pipetrain/runtime/launcher.h"

namespace pipetrain {
namespace {

using testing::run_ranks;

TEST(C10dTag, IsDistinctForEveryFieldCombination) {
  std::set<int> seen;
  int count = 0;
  for (Payload payload : {Payload::kActivation, Payload::kGradient}) {
    for (int src : {0, 1, 5, 127}) {
      for (int dst : {0, 1, 6, 127}) {
        for (int i : {0, 1, 2, 4095, 8191}) {
          for (MessagePart part :
               {MessagePart::kHeader, MessagePart::kMetadata, MessagePart::kData}) {
            const int tag = c10d_tag({src, dst, i, payload}, part);
            EXPECT_GE(tag, 0);
            EXPECT_LT(tag, kC10dControlTagBase);
            seen.insert(tag);
            ++count;
          }
        }
      }
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), count);
}

TEST(C10dTag, RejectsValuesOutsideItsFieldsNamingTheLimit) {
  try {
    c10d_tag({0, 1, kC10dMaxMicrobatches, Payload::kActivation}, MessagePart::kData);
    FAIL() << "expected an error";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("micro-batch 8192"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c10d_tag({kC10dMaxStages, 0, 0, Payload::kGradient}, MessagePart::kHeader),
               BadInput);
  EXPECT_THROW(c10d_tag({-1, 0, 0, Payload::kGradient}, MessagePart::kHeader), BadInput);
}

TEST(C10dMetadata, RoundTripsShapesDtypesUndefinedTensorsAndSkipNames) {
  Bundle bundle;
  bundle.tensors = {torch::zeros({2, 3}), torch::Tensor(), torch::zeros({}, torch::kLong),
                    torch::zeros({0, 5}, torch::kHalf), torch::zeros({1}, torch::kBool)};
  bundle.skip_names = {"a", "a_name_longer_than_eight_bytes"};
  const auto meta = encode_bundle_metadata(bundle);
  const Bundle back = decode_bundle_metadata(meta, torch::kCPU);
  ASSERT_EQ(back.tensors.size(), bundle.tensors.size());
  for (std::size_t t = 0; t < bundle.tensors.size(); ++t) {
    ASSERT_EQ(back.tensors[t].defined(), bundle.tensors[t].defined()) << t;
    if (!bundle.tensors[t].defined()) continue;
    EXPECT_EQ(back.tensors[t].sizes(), bundle.tensors[t].sizes()) << t;
    EXPECT_EQ(back.tensors[t].scalar_type(), bundle.tensors[t].scalar_type()) << t;
  }
  EXPECT_EQ(back.skip_names, bundle.skip_names);
}

TEST(C10dMetadata, RejectsTruncatedInput) {
  Bundle bundle{{torch::zeros({2, 3})}, {"skip"}};
  auto meta = encode_bundle_metadata(bundle);
  meta.pop_back();
  EXPECT_THROW(decode_bundle_metadata(meta, torch::kCPU), TransportFailure);
}

TEST(C10dBackend, NamesAndAvailabilityOnThisBuild) {
  EXPECT_EQ(parse_comm_backend("gloo"), CommBackend::kGloo);
  EXPECT_EQ(comm_backend_for_device(torch::kCPU), CommBackend::kGloo);
  EXPECT_TRUE(comm_backend_available(CommBackend::kGloo));
  EXPECT_FALSE(comm_backend_available(CommBackend::kMpi));
  EXPECT_THROW(parse_comm_backend("tcp"), BadInput);
}

// NCCL refuses two ranks on one GPU when its first communicator is made ("Duplicate GPU
// detected", seen on an H200 with NCCL 2.28.9, as a runtime failure of the first send): the
// rendezvous compares placements first. cuda:0 on two hosts, or two GPUs of one host, is fine.
TEST(C10dBackend, TwoRanksOnOneGpuAreNamedBeforeNcclSeesThem) {
  EXPECT_EQ(
      shared_gpu_conflict({gpu_placement("a", 0), gpu_placement("a", 1), gpu_placement("b", 0)}),
      "");
  EXPECT_EQ(shared_gpu_conflict({gpu_placement("a", 0)}), "");
  const std::string conflict = shared_gpu_conflict(
      {gpu_placement("a", 0), gpu_placement("a", 1), gpu_placement("b", 1), gpu_placement("a", 1)});
  EXPECT_NE(conflict.find("ranks 1 and 3 both use cuda:1 on host a"), std::string::npos)
      << conflict;
  EXPECT_NE(conflict.find("gloo"), std::string::npos) << conflict;
}

TEST(C10dBackend, NcclWithoutAGpuIsUnavailableAndSaysWhatIsMissing) {
  if (torch::cuda::device_count() > 0) GTEST_SKIP() << "this machine has a GPU: NCCL may work";
  EXPECT_FALSE(comm_backend_available(CommBackend::kNccl));
  const std::string reason = comm_backend_unavailable_reason(CommBackend::kNccl);
  // A CUDA build names the missing device, a CPU-only build the missing CUDA build.
  EXPECT_NE(reason.find("NCCL needs a CUDA"), std::string::npos) << reason;
}

namespace {
std::shared_ptr<C10dWorld> world_of_one() {
  RendezvousOptions options;
  options.master_addr = "127.0.0.1";
  options.master_port = find_free_port();
  options.world_size = 1;
  options.timeout = std::chrono::seconds(30);
  return C10dWorld::connect(options);
}
void handle_sigpipe(int) {}
}  // namespace

// An abort listener runs on the thread that saw the abort (the watchdog's, or abort()'s caller).
// A transport removes its listener and then frees what the listener touches: removing must wait
// for a call already under way. Before, it returned at once (ThreadSanitizer saw the transport's
// condition variable destroyed while the watchdog's listener still used it). A listener that
// removes itself does not wait for itself.
TEST(C10dWorld, RemovingAListenerWaitsForItsCallUnderWayAndOneMayRemoveItself) {
  const std::shared_ptr<C10dWorld> world = world_of_one();
  std::atomic<bool> finished{false}, removed_itself{false};
  std::promise<void> started;
  const int slow = world->add_abort_listener([&](const std::string&) {
    started.set_value();
    // A listener that takes a while is what is tested: removing it must wait for this call.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    finished = true;
  });
  std::atomic<int> self_id{-1};
  self_id = world->add_abort_listener([&](const std::string&) {
    world->remove_abort_listener(self_id);
    removed_itself = true;
  });
  std::thread aborter([&] { world->abort("a test abort"); });
  if (started.get_future().wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    aborter.join();
    FAIL() << "abort() did not call the listener within 30 s";
  }
  world->remove_abort_listener(slow);
  EXPECT_TRUE(finished);
  aborter.join();
  EXPECT_TRUE(removed_itself);
  ASSERT_TRUE(world->abort_reason().has_value());
  EXPECT_NE(world->abort_reason()->find("a test abort"), std::string::npos);
}

// Gloo writes with writev(): with SIGPIPE at its default, a write to a killed peer ended the
// rank without a word (a CI run saw a rank vanish so). After connect() the write fails with
// EPIPE and the process lives; a handler the program set is left as it was.
TEST(C10dWorld, ConnectingIgnoresADefaultSigpipeSoAWriteToAClosedPeerIsAnError) {
  struct sigaction saved {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &saved), 0);
  signal(SIGPIPE, SIG_DFL);
  {
    const auto world = world_of_one();
    struct sigaction now {};
    ASSERT_EQ(sigaction(SIGPIPE, nullptr, &now), 0);
    EXPECT_EQ(now.sa_handler, SIG_IGN);
    int ends[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, ends), 0);
    close(ends[1]);
    const char byte = 'x';
    EXPECT_EQ(write(ends[0], &byte, 1), -1);  // without SIG_IGN the test process dies here
    EXPECT_EQ(errno, EPIPE);
    close(ends[0]);
  }
  signal(SIGPIPE, handle_sigpipe);
  {
    const auto world = world_of_one();
    struct sigaction now {};
    ASSERT_EQ(sigaction(SIGPIPE, nullptr, &now), 0);
    EXPECT_EQ(now.sa_handler, &handle_sigpipe);
  }
  sigaction(SIGPIPE, &saved, nullptr);
}

// ---- real processes ---------------------------------------------------------------------------

TEST(C10dTransport, CarriesBundlesOfChangingShapesDtypesSkipsAndUndefinedGradients) {
  auto run = run_ranks(2, {"bundles"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  EXPECT_EQ(run.count("OK bundles"), 2) << run.output();
  EXPECT_TRUE(run.all_gone());
}

// Every round each rank sends 3 bundles; a bundle is "resized" when its data size differs from the
// previous round's on the same channel (none before round 0). Sizes from scenario_rounds:
// rows per round {4, 4, 6, 2, none, 4} (+ i for micro-batch i), 16 floats (64 bytes, the wire's
// alignment) per row, so a size changes exactly when the rows do.
TEST(C10dTransport, PostsReceivesAheadAndAgreesOnSizesAcrossChangingRounds) {
  auto run = run_ranks(2, {"rounds"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  EXPECT_EQ(run.count("OK rounds"), 2) << run.output();
  const std::vector<int> rows{4, 4, 6, 2, 0, 4};
  int changed_rounds = 0;
  int previous = 0;
  for (int r : rows) {
    if (r != previous) ++changed_rounds;
    previous = r;
  }
  const int bundles = 6 * 3;
  const std::string line = "STATS sent " + std::to_string(bundles) + " resized " +
                           std::to_string(3 * changed_rounds) + " received " +
                           std::to_string(bundles) + " expected " + std::to_string(bundles);
  EXPECT_EQ(run.count(line), 2) << line << "\n" << run.output();
  EXPECT_TRUE(run.all_gone());
}

// A message of 64 floats: 256 + 256 bytes. Three are held after their sends completed, one after
// release_sends(2), none after end_sends().
TEST(C10dTransport, KeepsCompletedSendsUntilReleasedAndTimesOutReleasingAnUnreceivedOne) {
  auto run = run_ranks(2, {"held_sends"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  EXPECT_EQ(run.count("OK held"), 2) << run.output();
  EXPECT_EQ(run.count("HELD 1536 512 0"), 1) << run.output();
}

// Over hosts of two ranks (rank 2 alone on the second), each member's traffic as a ring sends it:
// a reduce-scatter of 9 floats sends 2/3 of its 36 bytes to the next member, an all-gather of 3
// floats twice its 12; rank 0's next (rank 1) shares its host, rank 1's (2) and rank 2's (0) do
// not.
TEST(C10dGroup, ReduceScattersAndAllGathersFlatShardsOverThreeMembers) {
  // K = 1: the three ranks are one dp group.
  auto run = run_ranks(3, {"shards", "1"}, 0, 8000, std::chrono::seconds(10),
                       {{"PIPETRAIN_RANKS_PER_HOST", "2"}});
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  EXPECT_EQ(run.count("OK shards"), 3) << run.output();
  EXPECT_EQ(run.count("TRAFFIC 0 24 0 24 0"), 1) << run.output();
  EXPECT_EQ(run.count("TRAFFIC 1 0 24 0 24"), 1) << run.output();
  EXPECT_EQ(run.count("TRAFFIC 2 0 24 0 24"), 1) << run.output();
  // all_to_all of 9 floats: 12 bytes to each other member, by that member's host (ranks 0 and 1
  // share one), and the same under its label.
  EXPECT_EQ(run.count("ALLTOALL 0 12 12 12 12"), 1) << run.output();
  EXPECT_EQ(run.count("ALLTOALL 1 12 12 12 12"), 1) << run.output();
  EXPECT_EQ(run.count("ALLTOALL 2 0 24 0 24"), 1) << run.output();
}

// TORCH_DISTRIBUTED_DEBUG=DETAIL: every collective's fingerprint is compared over the group
// before it is posted, and a mismatch is an error on every member naming both collectives, where
// Gloo would abort the process ("Received data size doesn't match expected size") or hang.
TEST(C10dGroup, UnderDistributedDebugDetailAMismatchedCollectiveIsAnErrorNamingBoth) {
  auto run = run_ranks(3, {"checked_collectives", "1"}, 0, 8000, std::chrono::seconds(10),
                       {{"TORCH_DISTRIBUTED_DEBUG", "DETAIL"}});
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  EXPECT_EQ(run.count("OK checked_collectives"), 3) << run.output();
  EXPECT_EQ(run.count("mismatch: collective mismatch over group"), 2) << run.output();
  EXPECT_EQ(run.count("gather mismatch: collective mismatch over group"), 1) << run.output();
}

// A mirror group gives one process the shapes of a member of a real group whose every member
// holds the same tensors: the values are those of such a group.
TEST(C10dGroup, AMirrorGroupActsAsMembersHoldingWhatThisOneHolds) {
  const auto group = C10dGroup::mirror(3, 1);
  EXPECT_EQ(group->size(), 3);
  EXPECT_EQ(group->rank(), 1);
  const torch::Tensor shard = torch::tensor({1.f, 2.f});
  torch::Tensor flat = torch::zeros({6});
  group->all_gather(shard, flat);
  EXPECT_TRUE(torch::equal(flat, torch::tensor({1.f, 2.f, 1.f, 2.f, 1.f, 2.f})));
  torch::Tensor mine = torch::zeros({2});
  group->reduce_scatter_sum(torch::arange(6, torch::kFloat), mine);
  EXPECT_TRUE(torch::equal(mine, torch::tensor({6.f, 9.f})));  // 3 x elements 2 and 3
  std::vector<torch::Tensor> sums{torch::tensor({1.f, -2.f})};
  group->allreduce_sum(sums);
  EXPECT_TRUE(torch::equal(sums[0], torch::tensor({3.f, -6.f})));
  group->barrier();
  EXPECT_TRUE(group->gather_bytes({'a'}).empty());  // rank 1: only group rank 0 receives
  EXPECT_EQ(C10dGroup::mirror(2, 0)->gather_bytes({'a'}).size(), 2u);
  EXPECT_THROW(C10dGroup::mirror(2, 2), BadInput);
}

TEST(C10dTransport, ChainsActivationsThroughFourProcesses) {
  auto run = run_ranks(4, {"chain"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  EXPECT_EQ(run.count("OK chain"), 4) << run.output();
}

TEST(C10dTransport, CarriesInterleavedStagesBetweenTwoProcesses) {
  auto run = run_ranks(2, {"chain_interleaved"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  EXPECT_EQ(run.count("OK chain"), 2) << run.output();
}

TEST(C10dTransport, ReceiverWaitingOnAThrowingRankFailsNamingItWithinBound) {
  auto run = run_ranks(2, {"throw"});
  EXPECT_NE(run.result.exit_code, 0);
  // Both fail. Which exit the launcher sees first is a race: rank 0, told through the abort
  // channel, can be gone before rank 1 has torn down (1 run in 6 here); the reason is checked
  // below.
  EXPECT_NE(run.result.rank_exit_codes[1], 0) << run.output();
  EXPECT_NE(run.result.rank_exit_codes[0], 0) << run.output();
  EXPECT_TRUE(run.printed("injected failure in stage 1")) << run.output();
  // Rank 0 learns the reason through the abort channel, with what it was waiting for.
  EXPECT_TRUE(
      run.printed("[rank 0!] rank 0: error: rank 0, stage 0, micro-batch 0: receiving the "
                  "gradient of micro-batch 0 from stage 1 to stage 0 was aborted: rank 1: "
                  "injected failure"))
      << run.output();
  EXPECT_TRUE(run.printed("[rank 0] KIND peer failed")) << run.output();
  EXPECT_FALSE(run.printed("UNEXPECTED")) << run.output();
  EXPECT_LT(run.seconds, 30.0);
  EXPECT_TRUE(run.all_gone());
}

TEST(C10dTransport, ReceiverWaitingOnASigkilledRankExitsWithinTimeout) {
  auto run = run_ranks(2, {"sigkill"}, 0, /*timeout_ms=*/5000);
  EXPECT_EQ(run.result.first_failed_rank, 1) << run.output();
  EXPECT_EQ(run.result.rank_exit_codes[1], 128 + SIGKILL);
  EXPECT_NE(run.result.rank_exit_codes[0], 0) << run.output();
  // Either the closed connection or the abort channel; both name the peer and the message.
  EXPECT_TRUE(run.printed("gradient of micro-batch 0 from stage 1 to stage 0")) << run.output();
  EXPECT_LT(run.seconds, 20.0);
  EXPECT_TRUE(run.all_gone());
}

}  // namespace
}  // namespace pipetrain
