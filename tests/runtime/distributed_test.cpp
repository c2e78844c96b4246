// Distributed: environment errors, the K x R layout in-process; rendezvous, data-parallel and tie
// gradients, loss broadcast, parameter gathering and failures between real processes.
#include "pipetrain/runtime/distributed.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

#include "../helpers/multiprocess.h"
#include "pipetrain/base/error.h"
#include "pipetrain/runtime/launcher.h"
#include "pipetrain/schedule/generators.h"

namespace pipetrain {
namespace {

using testing::run_ranks;

// Sets or clears the torchrun variables for one test and restores them afterwards.
class ScopedEnvironment {
 public:
  explicit ScopedEnvironment(std::vector<std::pair<std::string, const char*>> values) {
    for (const auto& [name, value] : values) {
      const char* old = std::getenv(name.c_str());
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      if (value) {
        setenv(name.c_str(), value, 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }
  ~ScopedEnvironment() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const BadInput& e) {
    return e.what();
  }
  return "";
}

TEST(DistributedEnvironment, NamesEveryMissingVariable) {
  ScopedEnvironment env({{"MASTER_ADDR", nullptr},
                         {"MASTER_PORT", nullptr},
                         {"RANK", "0"},
                         {"WORLD_SIZE", nullptr},
                         {"LOCAL_RANK", nullptr}});
  const std::string message = error_of([] { DistributedEnvironment::from_environment(); });
  EXPECT_NE(message.find("MASTER_ADDR is not set"), std::string::npos) << message;
  EXPECT_NE(message.find("MASTER_PORT is not set"), std::string::npos) << message;
  EXPECT_NE(message.find("WORLD_SIZE is not set"), std::string::npos) << message;
  EXPECT_EQ(message.find("RANK is not set"), std::string::npos) << message;
}

TEST(DistributedEnvironment, RejectsMalformedAndOutOfRangeValues) {
  ScopedEnvironment env({{"MASTER_ADDR", "127.0.0.1"},
                         {"MASTER_PORT", "70000"},
                         {"RANK", "3"},
                         {"WORLD_SIZE", "2"},
                         {"LOCAL_RANK", "x"},
                         {"TORCHELASTIC_RESTART_COUNT", "-1"}});
  const std::string message = error_of([] { DistributedEnvironment::from_environment(); });
  EXPECT_NE(message.find("MASTER_PORT=70000"), std::string::npos) << message;
  EXPECT_NE(message.find("RANK=3 is outside"), std::string::npos) << message;
  EXPECT_NE(message.find("LOCAL_RANK='x'"), std::string::npos) << message;
  EXPECT_NE(message.find("TORCHELASTIC_RESTART_COUNT='-1' is not a non-negative integer"),
            std::string::npos)
      << message;
}

TEST(DistributedEnvironment, ReadsAValidEnvironment) {
  ScopedEnvironment env({{"MASTER_ADDR", "10.0.0.1"},
                         {"MASTER_PORT", "29500"},
                         {"RANK", "1"},
                         {"WORLD_SIZE", "4"},
                         {"LOCAL_RANK", "1"},
                         {"TORCHELASTIC_RESTART_COUNT", "2"}});
  const auto parsed = DistributedEnvironment::from_environment();
  EXPECT_EQ(parsed.master_addr, "10.0.0.1");
  EXPECT_EQ(parsed.master_port, 29500);
  EXPECT_EQ(parsed.rank, 1);
  EXPECT_EQ(parsed.world_size, 4);
  EXPECT_EQ(parsed.local_rank, 1);
  EXPECT_EQ(parsed.restart_count, 2);
}

// PIPETRAIN_STORE_SOCKET (launch_local's socket for rank 0's store) is taken only by rank 0, and
// only where it names a socket listening on MASTER_PORT; anything else leaves the store to bind.
TEST(DistributedEnvironment, TakesAnInheritedStoreSocketOnlyWhereItListensOnMasterPort) {
  const int listening = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listening, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  ASSERT_EQ(bind(listening, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listening, 16), 0);
  socklen_t length = sizeof(address);
  getsockname(listening, reinterpret_cast<sockaddr*>(&address), &length);
  const std::string port = std::to_string(ntohs(address.sin_port));
  const std::string other_port = std::to_string(ntohs(address.sin_port) == 29500 ? 29501 : 29500);
  const std::string fd = std::to_string(listening);
  const int unbound = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const std::string unbound_fd = std::to_string(unbound);
  auto taken = [&](const std::string& rank, const std::string& master_port,
                   const std::string& socket_fd) {
    ScopedEnvironment env({{"MASTER_ADDR", "127.0.0.1"},
                           {"MASTER_PORT", master_port.c_str()},
                           {"RANK", rank.c_str()},
                           {"WORLD_SIZE", "2"},
                           {kStoreSocketVariable, socket_fd.c_str()}});
    return DistributedEnvironment::from_environment().store_socket;
  };
  EXPECT_EQ(taken("0", port, fd), listening);
  EXPECT_EQ(taken("1", port, fd), -1) << "not rank 0";
  EXPECT_EQ(taken("0", other_port, fd), -1) << "listening on another port";
  EXPECT_EQ(taken("0", port, unbound_fd), -1) << "not listening";
  EXPECT_EQ(taken("0", port, "x"), -1);
  EXPECT_EQ(taken("0", port, "987654"), -1) << "no such descriptor";
  close(unbound);
  close(listening);
}

TEST(ParallelLayout, PlacesStagesMajorWithinEachReplica) {
  const auto layout = ParallelLayout::for_world(8, 4);
  EXPECT_EQ(layout.replicas, 2);
  EXPECT_EQ(layout.rank_of(1, 2), 6);
  EXPECT_EQ(layout.replica_of(6), 1);
  EXPECT_EQ(layout.pipeline_rank_of(6), 2);
  EXPECT_EQ(layout.data_parallel_ranks(1), (std::vector<int>{1, 5}));
  EXPECT_EQ(layout.pipeline_world_ranks(1), (std::vector<int>{4, 5, 6, 7}));
}

TEST(ParallelLayout, RejectsAWorldThatIsNotAMultipleOfThePipeline) {
  const std::string message = error_of([] { ParallelLayout::for_world(6, 4); });
  EXPECT_NE(message.find("WORLD_SIZE=6 is not a multiple of the 4 pipeline ranks"),
            std::string::npos)
      << message;
}

// Tensor parallelism: Megatron's order, the same ranks as parallel::Mesh gives.
TEST(ParallelLayout, TensorParallelRanksAreAdjacentWithinEachPipelineRank) {
  const auto layout = ParallelLayout::for_world(8, 2, 2);
  EXPECT_EQ(layout.replicas, 2);
  EXPECT_EQ(layout.world_size(), 8);
  EXPECT_EQ(layout.rank_of(1, 0, 1), 5);
  EXPECT_EQ(layout.replica_of(5), 1);
  EXPECT_EQ(layout.pipeline_rank_of(5), 0);
  EXPECT_EQ(layout.tp_rank_of(5), 1);
  EXPECT_EQ(layout.tensor_parallel_ranks(1, 0), (std::vector<int>{4, 5}));
  EXPECT_EQ(layout.pipeline_world_ranks(0, 1), (std::vector<int>{1, 3}));
  EXPECT_EQ(layout.data_parallel_ranks(1, 0), (std::vector<int>{2, 6}));
  const std::string message = error_of([] { ParallelLayout::for_world(6, 2, 2); });
  EXPECT_NE(message.find("WORLD_SIZE=6 is not a multiple of 2 pipeline ranks x 2 tensor-parallel"),
            std::string::npos)
      << message;
}

// ---- real processes ---------------------------------------------------------------------------

TEST(Distributed, SumsGradientsOverTheReplicasOfEachStage) {
  auto run = run_ranks(4, {"dp", "2"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  EXPECT_EQ(run.count("OK dp"), 4) << run.output();
}

TEST(Distributed, SumsATiedWeightsGradientOverItsHolders) {
  auto run = run_ranks(2, {"tie", "2"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  EXPECT_EQ(run.count("OK tie"), 2) << run.output();
}

TEST(Distributed, BroadcastsTheSumOfReplicaLossesToEveryRank) {
  auto run = run_ranks(4, {"loss", "2"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  EXPECT_EQ(run.count("OK loss 0.75"), 4) << run.output();  // 0.25 * 1 + 0.25 * 2
}

TEST(DistributedPipe, ForwardGivesEachReplicasLastStageTheSequentialOutputOfItsRows) {
  auto run = run_ranks(4, {"forward", "2"});  // 2 pipeline ranks x 2 replicas
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  EXPECT_EQ(run.count("OK forward"), 4) << run.output();
}

TEST(DistributedPipe, TakesPipesDevicesAndThreadsPerRank) {
  auto run = run_ranks(2, {"pipe_options", "2"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  EXPECT_EQ(run.count("OK pipe_options"), 2) << run.output();
}

TEST(DistributedPipe, TimeoutSecondsBoundsAReceiveBelowTheJobsTimeout) {
  // The job's timeout is 8 s; the pipe's 1 s fails rank 0's wait for the late rank's gradient.
  auto run = run_ranks(2, {"pipe_timeout", "2"}, 0, /*timeout_ms=*/8000);
  EXPECT_NE(run.result.exit_code, 0) << run.output();
  EXPECT_FALSE(run.printed("not expected")) << run.output();
  // How long rank 0 waited, as its error says: the run's own length holds the late rank's 4 s
  // sleep and the start of the processes (over 8 s together under ThreadSanitizer).
  const std::string output = run.output();
  std::smatch waited;
  ASSERT_TRUE(std::regex_search(output, waited,
                                std::regex(R"(from rank 1 after ([0-9.]+) s \(timeout 1 s\))")))
      << output;
  EXPECT_LT(std::stod(waited[1].str()), 8.0) << output;
}

TEST(Distributed, BroadcastsTextFromEveryRootToEveryRank) {
  auto run = run_ranks(3, {"broadcast_text"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  EXPECT_EQ(run.count("OK broadcast_text"), 3) << run.output();
}

TEST(Distributed, GathersEveryStagesParametersOnRankZero) {
  auto run = run_ranks(3, {"gather"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  EXPECT_EQ(run.count("OK gather"), 3) << run.output();
}

TEST(DistributedPipe, ReportsTheSameStageAccountingAsThePipeForTheSameStep) {
  auto run = run_ranks(2, {"accounting", "2"}, 0, 20000);
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  for (const char* schedule : {"gpipe", "1f1b"}) {
    for (const char* checkpoint : {"never", "except_last"}) {
      for (int j : {0, 1}) {
        const std::string line = std::string("OK accounting ") + schedule + " " + checkpoint +
                                 " stage " + std::to_string(j) + " ";
        EXPECT_EQ(run.count(line), 1) << line << "\n" << run.output();
      }
    }
  }
}

TEST(Distributed, ReportsMissingRanksWhenWorldSizeIsLargerThanTheRanksStarted) {
  auto run = run_ranks(2, {"rendezvous"}, /*world_size=*/3, /*timeout_ms=*/2000);
  EXPECT_NE(run.result.exit_code, 0);
  EXPECT_NE(run.result.rank_exit_codes[0], 0);
  EXPECT_NE(run.result.rank_exit_codes[1], 0);
  EXPECT_TRUE(run.printed("WORLD_SIZE=3 but only 2 ranks arrived; missing ranks: 2"))
      << run.output();
  EXPECT_LT(run.seconds, 15.0);
  EXPECT_TRUE(run.all_gone());
}

// Processes started by hand, without a launcher: (RANK, WORLD_SIZE) each, on one MASTER_PORT.
// Returns each one's exit code and output, in the order given. Give the rendezvous 10 s or more:
// three processes loading LibTorch at once on 2 cores took over 3 s to reach the store. With
// `linger`, those that pass the rendezvous stay until the first process has ended (bash's
// `wait -n`, then a file they wait for: PIPETRAIN_TEST_LINGER_UNTIL in rank_helper.cpp).
std::vector<std::pair<int, std::string>> start_by_hand(
    const std::vector<std::pair<int, int>>& ranks, int timeout_ms, bool linger = false) {
  char pattern[] = "/tmp/pipetrain_by_hand_XXXXXX";
  const std::string dir = ::mkdtemp(pattern) ? pattern : "/tmp";
  std::string script =
      "export MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(find_free_port()) +
      " PIPETRAIN_TEST_TIMEOUT_MS=" + std::to_string(timeout_ms) + "; ";
  if (linger) script += "export PIPETRAIN_TEST_LINGER_UNTIL=" + dir + "/released; ";
  for (size_t p = 0; p < ranks.size(); ++p) {
    const std::string n = std::to_string(p);
    script += "(RANK=" + std::to_string(ranks[p].first) +
              " LOCAL_RANK=0 WORLD_SIZE=" + std::to_string(ranks[p].second) +
              " timeout -s KILL 30 " PIPETRAIN_RANK_HELPER " rendezvous >" + dir + "/out" + n +
              " 2>&1; echo $? >" + dir + "/code" + n + ") & ";
  }
  if (linger) script += "wait -n; : >" + dir + "/released; ";
  script += "wait";
  EXPECT_EQ(std::system(("bash -c '" + script + "'").c_str()), 0) << script;
  std::vector<std::pair<int, std::string>> results;
  for (size_t p = 0; p < ranks.size(); ++p) {
    auto read = [&](const std::string& name) {
      std::ifstream in(dir + "/" + name + std::to_string(p));
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    const std::string code = read("code");
    results.emplace_back(code.empty() ? -1 : std::stoi(code), read("out"));
  }
  std::filesystem::remove_all(dir);
  return results;
}

// Bad input that only the rendezvous can see exits 2, as a bad environment does (docs/ERRORS.md).
TEST(Distributed, ARankStartedTwiceExitsTwoNamingBothProcesses) {
  // Rank 0 and the winner stay after the rendezvous until the loser has ended: the store must
  // outlive the loser's connection attempts (a refused connect backs off for seconds).
  const auto runs = start_by_hand({{0, 2}, {1, 2}, {1, 2}}, /*timeout_ms=*/20000, /*linger=*/true);
  // Whichever of the two RANK=1 processes claims the rank second is refused.
  const int loser = runs[1].first == 2 ? 1 : 2;
  EXPECT_EQ(runs[loser].first, 2) << runs[1].second << runs[2].second;
  EXPECT_NE(runs[loser].second.find("RANK=1 was started twice ("), std::string::npos)
      << runs[loser].second;
  EXPECT_EQ(runs[3 - loser].first, 0) << runs[3 - loser].second;
  EXPECT_EQ(runs[0].first, 0) << runs[0].second;
}

TEST(Distributed, RanksDisagreeingOnWorldSizeExitTwoNamingBothSizes) {
  const auto runs = start_by_hand({{0, 2}, {1, 3}}, /*timeout_ms=*/10000);
  // The second to register is refused at once; the first then misses a rank until the timeout.
  const int refused = runs[0].first == 2 ? 0 : 1;
  EXPECT_EQ(runs[refused].first, 2) << runs[0].second << runs[1].second;
  EXPECT_NE(runs[refused].second.find("but another rank registered WORLD_SIZE="), std::string::npos)
      << runs[refused].second;
  EXPECT_EQ(runs[1 - refused].first, 1) << runs[1 - refused].second;
}

TEST(Distributed, EveryRankExitsWhenOneThrowsDuringACollective) {
  auto run = run_ranks(2, {"collective"}, 0, 8000, std::chrono::seconds(20));
  EXPECT_NE(run.result.rank_exit_codes[0], 0) << run.output();
  EXPECT_NE(run.result.rank_exit_codes[1], 0) << run.output();
  EXPECT_TRUE(run.printed("injected failure before the barrier")) << run.output();
  EXPECT_LT(run.seconds, 30.0);
  EXPECT_TRUE(run.all_gone());
}

TEST(Distributed, ARankExitingWithoutAWordMakesTheOthersFail) {
  auto run = run_ranks(2, {"exit"}, 0, 4000, std::chrono::seconds(20));
  EXPECT_EQ(run.result.first_failed_rank, 1) << run.output();
  EXPECT_EQ(run.result.rank_exit_codes[1], 3);
  EXPECT_NE(run.result.rank_exit_codes[0], 0) << run.output();
  EXPECT_LT(run.seconds, 20.0);
  EXPECT_TRUE(run.all_gone());
}

TEST(Distributed, AHungRankMakesTheOthersExitAfterTheTimeout) {
  // Rank 1 stops itself (SIGSTOP): its sockets stay open, only the timeout can tell.
  auto run = run_ranks(2, {"stop"}, 0, /*timeout_ms=*/3000, std::chrono::seconds(1));
  EXPECT_NE(run.result.rank_exit_codes[0], 0) << run.output();
  EXPECT_EQ(run.result.first_failed_rank, 0) << run.output();
  EXPECT_TRUE(run.printed("rank 1")) << run.output();
  // Whether Gloo's receive or the heartbeat watchdog notices first, it is a pipetrain::Timeout.
  EXPECT_TRUE(run.printed("[rank 0] KIND timeout")) << run.output();
  EXPECT_LT(run.seconds, 20.0);
  EXPECT_TRUE(run.all_gone());
}

// Transparency: 3 SGD steps of a model with a residual crossing ranks and a tied weight give the
// weights of sequential training (1e-5 relative), for every schedule and process layout.
// Every schedule of the family, with each checkpoint mode: the model has a skip across stages
// and a weight tied across stages (rank_helper's make_model).
std::vector<std::string> every_schedule(const std::vector<std::string>& modes) {
  std::vector<std::string> specs;
  for (const auto& name : schedule::schedule_names()) {
    for (const auto& mode : modes) specs.push_back(mode.empty() ? name : name + ":" + mode);
  }
  return specs;
}

void expect_trained(const std::vector<std::string>& specs, int nproc) {
  std::vector<std::string> args = {"train", std::to_string(nproc)};
  args.insert(args.end(), specs.begin(), specs.end());
  auto run = run_ranks(nproc, args, 0, 30000, std::chrono::seconds(10));
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  for (const auto& spec : specs) {
    EXPECT_TRUE(run.printed("OK train " + spec + " ")) << spec << "\n" << run.output();
  }
}

TEST(DistributedTraining, MatchesSequentialTrainingOnTwoProcessesForEveryScheduleAndCheckpoint) {
  expect_trained(every_schedule({"always", "except_last", "never"}), 2);
}

TEST(DistributedTraining, MatchesSequentialTrainingOnFourProcessesForEverySchedule) {
  expect_trained(every_schedule({""}), 4);
}

// Variable lengths: documents of 5 to 200 tokens, one micro-batch each, on every schedule at 4
// processes; a hang fails within the run's time limit.
TEST(DistributedTraining, MicroBatchesOfEveryWidthMatchSequentialTrainingOnEverySchedule) {
  std::vector<std::string> args = {"documents", "4"};
  for (const auto& name : schedule::schedule_names()) args.push_back(name);
  auto run = run_ranks(4, args, 0, 30000, std::chrono::seconds(10));
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  for (const auto& name : schedule::schedule_names()) {
    EXPECT_TRUE(run.printed("OK documents " + name + " ")) << name << "\n" << run.output();
  }
}

TEST(DistributedTraining, MatchesSequentialTrainingWithTwoStagesTimesTwoReplicas) {
  auto run = run_ranks(4, {"train", "2", "1f1b", "zb-h1"}, 0, 20000);
  EXPECT_EQ(run.result.exit_code, 0) << run.output();
  EXPECT_TRUE(run.printed("OK train 1f1b ")) << run.output();
  EXPECT_TRUE(run.printed("OK train zb-h1 ")) << run.output();
}

}  // namespace
}  // namespace pipetrain
