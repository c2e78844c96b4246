// Custom schedule text: round trips, inference of counts and placement, and error messages.
#include "pipetrain/schedule/text_format.h"
#include "pipetrain/base/error.h"
#include "pipetrain/schedule/csv_format.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "pipetrain/base/error.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/lower.h"

namespace pipetrain::schedule {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_schedule(text);
  } catch (const pipetrain::BadInput& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(TextFormat, EveryGeneratedScheduleAndItsLoweringRoundTrip) {
  for (const auto& name : schedule_names()) {
    if (name == "dualpipev") continue;  // needs an even K; csv_format_test covers it
    const int V = name == "interleaved-1f1b" ? 2 : default_virtual_stages(name);
    const Schedule s = make_schedule(name, 3, 5, V);
    for (const Schedule& original : {s, lower(s)}) {
      const Schedule parsed = parse_schedule(format_schedule(original), original.name);
      EXPECT_EQ(parsed.actions, original.actions) << name;
      EXPECT_EQ(parsed.stage_rank, original.stage_rank) << name;
      EXPECT_EQ(parsed.num_ranks, original.num_ranks);
      EXPECT_EQ(parsed.num_stages, original.num_stages);
      EXPECT_EQ(parsed.num_microbatches, original.num_microbatches);
    }
  }
}

TEST(TextFormat, InfersCountsAndPlacementFromContent) {
  const Schedule s = parse_schedule(
      "# two ranks, stages 0 and 2 on rank 0\n"
      "\n"
      "0F0, 0F1 ,2F0,2F1,2B0,2B1,0B0,0B1   # rank 0\n"
      "1F0,1F1,3F0,3F1,3B0,3B1,1B0,1B1\n");
  EXPECT_EQ(s.num_ranks, 2);
  EXPECT_EQ(s.num_stages, 4);
  EXPECT_EQ(s.num_microbatches, 2);
  EXPECT_EQ(s.stage_rank, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(s.actions[0][1], (Action{0, Op::kForward, 1}));
}

TEST(TextFormat, EmptyRankIsWrittenAsDash) {
  Schedule s = parse_schedule("0F0,0B0\n-\n");
  EXPECT_EQ(s.num_ranks, 2);
  EXPECT_TRUE(s.actions[1].empty());
  EXPECT_EQ(format_schedule(s), "0F0,0B0\n-\n");
}

TEST(TextFormat, BadTokenErrorNamesLineAndToken) {
  const std::string message = error_of("# header\n0F0,0B0\n1F0,1X0,1B0\n");
  EXPECT_NE(message.find("line 3"), std::string::npos) << message;
  EXPECT_NE(message.find("'1X0'"), std::string::npos) << message;
}

TEST(TextFormat, StageOnTwoRanksNamesBothLines) {
  const std::string message = error_of("0F0,1F0\n1B0,0B0\n");
  EXPECT_NE(message.find("line 2"), std::string::npos) << message;
  EXPECT_NE(message.find("'1B0'"), std::string::npos) << message;
  EXPECT_NE(message.find("already on rank 0"), std::string::npos) << message;
}

TEST(TextFormat, EmptyTokenAndGapsAndEmptyTextAreErrors) {
  EXPECT_NE(error_of("0F0,,0B0\n").find("line 1"), std::string::npos);
  EXPECT_NE(error_of("0F0,0B0\n2F0,2B0\n").find("stage 1 never appears"), std::string::npos);
  EXPECT_NE(error_of("# nothing\n\n").find("no rank lines"), std::string::npos);
}

TEST(TextFormat, SaveWritesAtomicallyAndLoadReadsBack) {
  const std::string path = ::testing::TempDir() + "/pipetrain_text_format_test.sched";
  const Schedule s = make_schedule("zb-h1", 3, 4);
  save_schedule(s, path, "zb-h1 K=3 M=4\nsecond comment line");
  const Schedule loaded = load_schedule(path);
  EXPECT_EQ(loaded.actions, s.actions);
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first, "# zb-h1 K=3 M=4");
  std::remove(path.c_str());
}

TEST(TextFormat, LoadNamesTheFileInErrors) {
  const std::string path = ::testing::TempDir() + "/pipetrain_text_format_bad.sched";
  {
    std::ofstream out(path);
    out << "0F0,0Q0\n";
  }
  try {
    load_schedule(path);
    FAIL();
  } catch (const pipetrain::BadInput& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("line 1"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
  EXPECT_THROW(load_schedule(path), std::runtime_error);
}

// A file naming stage 999999999 or micro-batch 999999999 would make the reader (stage table) or
// validate()/simulate() (S x M cells) allocate gigabytes: BadInput naming the limit instead, before
// anything is allocated, in both the text and the CSV form.
TEST(TextFormat, IndicesPastTheLimitsAreBadInputBeforeAnythingIsAllocated) {
  for (const char* text : {"999999999F0\n", "0F999999999\n", "0F0,0F1048576\n"}) {
    for (bool csv : {false, true}) {
      try {
        csv ? parse_csv_schedule(text) : parse_schedule(text);
        FAIL() << text << " was accepted";
      } catch (const BadInput& e) {
        EXPECT_NE(std::string(e.what()).find("must be below 65536 and 1048576"), std::string::npos)
            << e.what();
      }
    }
  }
  // Within each index limit but past the cells one: 2 stages x 2^23 + 1 micro-batches.
  try {
    parse_schedule("0F0,0F1000000\n1F0\n");
  } catch (const BadInput& e) {
    FAIL() << "2 x 1000001 cells is within the limit: " << e.what();
  }
  std::string many_stages;
  for (int j = 0; j < 20; ++j) many_stages += std::to_string(j) + "F1048000,";
  many_stages.back() = '\n';
  EXPECT_THROW(parse_schedule(many_stages), BadInput) << "20 x 1048001 cells";
}

}  // namespace
}  // namespace pipetrain::schedule
