// pipetrain's schedules against torch.distributed.pipelining's of the same name (the pinned
// torch of the project's venv): for p in {2, 4, 8} and M in {p, 2p, 4p}, either the same action
// lists, or, simulated on the same costs, no larger makespan and no larger peak activations on
// any rank. torch_schedule_csv.py dumps torch's lists as the CSV its runtime writes, which
// parse_csv_schedule() reads: this also checks that CSV reader on every torch schedule.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "../helpers/python.h"
#include "pipetrain/base/error.h"
#include "pipetrain/schedule/csv_format.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/schedule/validate.h"

namespace pipetrain::schedule {
namespace {

namespace fs = std::filesystem;

const char* const kNames[] = {"looped-bfs", "interleaved-zb", "zb-v", "dualpipev"};

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class TorchAnchor : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!testing::python_has_torch()) return;
    dir_ =
        fs::path(::testing::TempDir()) / ("pipetrain_torch_anchor_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::string command = testing::kPython +
                          " " PIPETRAIN_SOURCE_DIR "/tests/schedule/torch_schedule_csv.py " +
                          dir_.string();
    for (const char* name : kNames) {
      for (int p : {2, 4, 8}) {
        for (int M : {p, 2 * p, 4 * p}) {
          command += " " + std::string(name) + ":" + std::to_string(p) + ":" + std::to_string(M);
        }
      }
    }
    dumped_ = std::system(command.c_str()) == 0;
  }
  static void TearDownTestSuite() {
    std::error_code ignored;
    if (!dir_.empty()) fs::remove_all(dir_, ignored);
  }
  void SetUp() override {
    if (!testing::python_has_torch()) GTEST_SKIP() << testing::no_python_torch_message();
    ASSERT_TRUE(dumped_) << "torch_schedule_csv.py failed";
  }
  static fs::path dir_;
  static bool dumped_;
};
fs::path TorchAnchor::dir_;
bool TorchAnchor::dumped_ = false;

TEST_F(TorchAnchor, EveryScheduleIsTorchsOrNoSlowerAndNoHungrierOnAnyRank) {
  Costs costs;  // F = I = W = 1, B = 2, no comm: the ZB paper's equal costs
  int compared = 0;
  int identical = 0;
  for (const char* name : kNames) {
    for (int p : {2, 4, 8}) {
      for (int M : {p, 2 * p, 4 * p}) {
        const std::string what =
            std::string(name) + " p=" + std::to_string(p) + " M=" + std::to_string(M);
        const fs::path base =
            dir_ / (std::string(name) + "-" + std::to_string(p) + "-" + std::to_string(M));
        if (fs::exists(base.string() + ".refused")) {
          // torch refuses the shape (DualPipeV: M < 2p); so must we, with a message.
          EXPECT_THROW(make_schedule(name, p, M, 2), pipetrain::BadInput) << what;
          continue;
        }
        const Schedule theirs = parse_csv_schedule(read(base.string() + ".csv"), name);
        const Schedule ours = make_schedule(name, p, M, 2);
        ASSERT_TRUE(check(theirs).ok) << what << "\n" << check(theirs).message;
        ASSERT_EQ(theirs.stage_rank, ours.stage_rank) << what;
        ++compared;
        if (theirs.actions == ours.actions) {
          ++identical;
          continue;
        }
        const SimulationResult t = simulate(theirs, costs);
        const SimulationResult o = simulate(ours, costs);
        EXPECT_LE(o.makespan, t.makespan + 1e-9) << what;
        for (int r = 0; r < p; ++r) {
          EXPECT_LE(o.peak_rank_activations[r], t.peak_rank_activations[r] + 1e-9)
              << what << " rank " << r;
        }
      }
    }
  }
  EXPECT_EQ(compared, 4 * 9 - 3);  // torch's DualPipeV refuses M = p
  std::cout << compared << " shapes compared, " << identical << " identical action lists\n";
}

}  // namespace
}  // namespace pipetrain::schedule
