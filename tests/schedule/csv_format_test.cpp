// torch.distributed.pipelining's compute-only CSV: round trips of every family, the cells torch
// writes (idle steps, overlapped pairs, FSDP bookkeeping), and the errors for what pipetrain
// cannot run.
#include "pipetrain/schedule/csv_format.h"
#include "pipetrain/base/error.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "pipetrain/base/error.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/text_format.h"
#include "pipetrain/schedule/validate.h"

namespace pipetrain::schedule {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_csv_schedule(text);
  } catch (const pipetrain::BadInput& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(CsvFormat, EveryGeneratedScheduleAndItsLoweringRoundTrip) {
  for (const auto& name : schedule_names()) {
    const int V = name == "interleaved-1f1b" ? 2 : default_virtual_stages(name);
    const Schedule s = make_schedule(name, 4, 8, V);
    for (const Schedule& original : {s, lower(s)}) {
      const Schedule parsed = parse_csv_schedule(format_csv_schedule(original), name);
      EXPECT_EQ(parsed.actions, s.actions) << name;  // the lowering's sends are left out
      EXPECT_EQ(parsed.stage_rank, s.stage_rank) << name;
      EXPECT_EQ(parsed.num_microbatches, 8) << name;
    }
  }
}

TEST(CsvFormat, ReadsTorchsIdleCellsPairsAndBookkeeping) {
  EXPECT_NE(error_of("0F0,(0F1;0B0)OVERLAP\r\n").find("(action;action)OVERLAP_F_B"),
            std::string::npos);
  // Rank 0 holds stages 0 and 3 (the V), rank 1 stages 1 and 2; M = 1.
  const Schedule s = parse_csv_schedule(
      "0UNSHARD,0F0,,,,,3F0,3I0,3W0,,,0B0,0REDUCE_GRAD\r\n"
      ",1F0,2F0,,,(2I0;2W0)OVERLAP_F_B,,,1B0,\r\n");
  EXPECT_EQ(s.num_ranks, 2);
  EXPECT_EQ(s.num_stages, 4);
  EXPECT_EQ((std::vector<int>{0, 1, 1, 0}), s.stage_rank);
  EXPECT_EQ(format_schedule(s), "0F0,3F0,3I0,3W0,0B0\n1F0,2F0,2I0,2W0,1B0\n");
  EXPECT_TRUE(check(s).ok) << check(s).message;
}

TEST(CsvFormat, SendsUnknownActionsAndEmptyFilesAreErrorsNamingRowAndCell) {
  std::string message = error_of("0F0,0SEND_F0\n1RECV_F0,1F0\n");
  EXPECT_NE(message.find("row 1, cell '0SEND_F0'"), std::string::npos) << message;
  EXPECT_NE(message.find("compute-only"), std::string::npos) << message;
  message = error_of("0F0,0B0\n1F0,1X0\n");
  EXPECT_NE(message.find("row 2, cell '1X0'"), std::string::npos) << message;
  message = error_of("\r\n\r\n");
  EXPECT_NE(message.find("no rows"), std::string::npos) << message;
}

TEST(CsvFormat, AMissingBackwardOrADeadlockIsTheValidatorsGrid) {
  // Parsing checks form; validate() names what is wrong with the order, with the grid.
  const Schedule missing = parse_csv_schedule("0F0,0F1,0B0\n1F0,1B0,1F1,1B1\n");
  const CheckResult no_backward = check(missing);
  EXPECT_FALSE(no_backward.ok);
  EXPECT_NE(no_backward.message.find("0B1"), std::string::npos) << no_backward.message;
  const Schedule deadlock = parse_csv_schedule("0F0,0B0\n1B0,1F0\n");
  const CheckResult stuck = check(deadlock);
  EXPECT_FALSE(stuck.ok);
  EXPECT_NE(stuck.message.find("rank"), std::string::npos) << stuck.message;
}

TEST(CsvFormat, LoadAndSaveDispatchOnTheExtension) {
  const std::string path = ::testing::TempDir() + "/pipetrain_csv_format_test.CSV";
  EXPECT_TRUE(is_csv_path(path));
  EXPECT_FALSE(is_csv_path("schedule.txt"));
  const Schedule s = make_schedule("zb-v", 2, 4, 2);
  save_schedule(s, path, "a comment CSV has no room for");
  const Schedule loaded = load_schedule(path);
  EXPECT_EQ(loaded.actions, s.actions);
  EXPECT_EQ(loaded.stage_rank, s.stage_rank);
  std::remove(path.c_str());
}

// Found by fuzz/schedule_csv_fuzzer.cpp: a rank whose row holds only FSDP cells (or nothing) has
// no compute; its row is written blank, and reading it back must keep it as a rank, as torch's
// reader does (it was skipped, and the schedule came back with one rank fewer).
TEST(CsvFormat, ARankWithNoComputeRoundTripsAsABlankRow) {
  const Schedule read = parse_csv_schedule("0F0,0F1,0B0,0B1\n12UNSHARD\n");
  ASSERT_EQ(read.num_ranks, 2);
  EXPECT_TRUE(read.actions[1].empty());
  const Schedule again = parse_csv_schedule(format_csv_schedule(read));
  EXPECT_EQ(again.num_ranks, 2);
  EXPECT_EQ(format_schedule(again), format_schedule(read));
  // torch writes a row per rank; a blank row in the middle is an idle rank too.
  EXPECT_EQ(parse_csv_schedule("1F0,1B0\r\n\r\n0F0,0B0\r\n").num_ranks, 3);
}

}  // namespace
}  // namespace pipetrain::schedule
