// validate()/check(): every kind of broken schedule is rejected with a sentence and a marked grid.
#include "pipetrain/schedule/validate.h"
#include "pipetrain/base/error.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "pipetrain/base/error.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/text_format.h"

namespace pipetrain::schedule {
namespace {

// The grid line of `rank` in a check() message.
std::string grid_line(const std::string& message, int rank) {
  const std::string head = "\nrank " + std::to_string(rank) + " ";
  const auto begin = message.find(head);
  if (begin == std::string::npos) return "";
  const auto end = message.find('\n', begin + 1);
  return message.substr(begin + 1, end - begin - 1);
}

TEST(Validate, BackwardBeforeItsForwardIsRejectedAtThatCell) {
  const Schedule s = parse_schedule("0F0,0F1,0B0,0B1\n1F0,1B1,1B0,1F1\n");
  const CheckResult result = check(s);
  ASSERT_FALSE(result.ok);
  EXPECT_NE(result.explanation.find("1B1"), std::string::npos) << result.message;
  EXPECT_NE(result.explanation.find("before its forward"), std::string::npos) << result.message;
  // Marked at rank 1, step 1 and nowhere else.
  EXPECT_NE(grid_line(result.message, 1).find("1F0  >1B1<"), std::string::npos) << result.message;
  EXPECT_EQ(grid_line(result.message, 0).find('>'), std::string::npos) << result.message;
  ASSERT_EQ(result.cells.size(), 1u);
  EXPECT_EQ(result.cells[0].rank, 1);
  EXPECT_EQ(result.cells[0].step, 1);
}

TEST(Validate, CrossedOrderDeadlocksAndTheReportNamesTheChain) {
  // Rank 0 wants 1's gradient of 0 before sending forward 1; rank 1 wants forward 1 first.
  const Schedule s = parse_schedule("0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n");
  try {
    validate(s);
    FAIL() << "accepted a deadlocking schedule";
  } catch (const ScheduleError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("deadlock"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 0 waits at step 1 (0B0) for the gradient of micro-batch 0 from "
                           "stage 1"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("activation of micro-batch 1 from stage 0"), std::string::npos)
        << message;
    EXPECT_NE(grid_line(message, 0).find(">0B0<"), std::string::npos) << message;
    EXPECT_NE(grid_line(message, 1).find(">1F1<"), std::string::npos) << message;
  }
}

TEST(Validate, LoweredDeadlockIsFoundByTheBlockingDryRun) {
  const Schedule valid = lower(parse_schedule("0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n"));
  ASSERT_TRUE(check(valid).ok) << check(valid).message;
  // Rank 0 receives the gradient of micro-batch 0 before sending its activation.
  Schedule broken = lower(parse_schedule("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"));
  auto& rank0 = broken.actions[0];
  // rank0: 0F0 0SF0 0F1 0SF1 0RB0 0B0 0RB1 0B1 -> move 0RB0 to the front
  const Action receive{0, Op::kRecvGradient, 0};
  rank0.erase(std::find(rank0.begin(), rank0.end(), receive));
  rank0.insert(rank0.begin(), receive);
  const CheckResult result = check(broken);
  ASSERT_FALSE(result.ok);
  EXPECT_NE(result.explanation.find("deadlock"), std::string::npos) << result.message;
  EXPECT_NE(grid_line(result.message, 0).find(">0RB0<"), std::string::npos) << result.message;
}

TEST(Validate, MissingAndExtraCommunicationAreNamed) {
  Schedule s = lower(one_f_one_b(2, 2));
  auto& rank1 = s.actions[1];
  rank1.erase(std::find(rank1.begin(), rank1.end(), Action{1, Op::kRecvActivation, 1}));
  CheckResult result = check(s);
  ASSERT_FALSE(result.ok);
  EXPECT_NE(result.explanation.find("1RF1"), std::string::npos) << result.message;

  Schedule extra = lower(one_f_one_b(2, 2));
  extra.actions[0].push_back({0, Op::kSendGradient, 1});
  result = check(extra);
  ASSERT_FALSE(result.ok);
  EXPECT_NE(result.explanation.find("0SB1"), std::string::npos) << result.message;
}

TEST(Validate, MissingOrDuplicatedComputeIsRejected) {
  EXPECT_FALSE(check(parse_schedule("0F0,0F1,0B0\n1F0,1F1,1B0,1B1\n")).ok);  // no 0B1
  EXPECT_FALSE(check(parse_schedule("0F0,0F0,0B0\n1F0,1B0\n")).ok);          // F twice
  EXPECT_FALSE(check(parse_schedule("0F0,0I0,0B0,0W0\n1F0,1B0\n")).ok);      // B and I
  EXPECT_FALSE(check(parse_schedule("0F0,0I0\n1F0,1B0\n")).ok);              // I without W
  const CheckResult w_first = check(parse_schedule("0F0,0W0,0I0\n1F0,1B0\n"));
  ASSERT_FALSE(w_first.ok);
  EXPECT_NE(w_first.explanation.find("before its input backward"), std::string::npos);
  EXPECT_NE(w_first.message.find(">0W0<"), std::string::npos) << w_first.message;
}

TEST(Validate, ActionOnTheWrongRankIsRejected) {
  Schedule s = one_f_one_b(2, 1);
  s.actions[0].push_back({1, Op::kForward, 0});
  const CheckResult result = check(s);
  ASSERT_FALSE(result.ok);
  EXPECT_NE(result.explanation.find("placed on rank 1"), std::string::npos) << result.message;
}

TEST(Validate, SelfWaitOnOneRankIsExplained) {
  // K = 1 with two stages on one rank: stage 1's forward listed before stage 0's.
  const Schedule s = parse_schedule("1F0,0F0,1B0,0B0\n");
  const CheckResult result = check(s);
  ASSERT_FALSE(result.ok);
  EXPECT_NE(result.explanation.find("only runs later"), std::string::npos) << result.message;
}

TEST(Validate, ThrowsScheduleErrorWhichIsAnInvalidArgument) {
  EXPECT_THROW(validate(parse_schedule("0B0,0F0\n")), pipetrain::BadInput);
  EXPECT_NO_THROW(validate(zero_bubble_h1(3, 6)));
}

TEST(Validate, WideGridsShowAWindowAroundTheMark) {
  Schedule s = one_f_one_b(2, 100);
  std::swap(s.actions[1][120], s.actions[1][121]);  // 1F60 <-> 1B60 region: B before F
  const CheckResult result = check(s);
  ASSERT_FALSE(result.ok);
  EXPECT_NE(result.message.find("..."), std::string::npos);
  EXPECT_LT(result.message.size(), 2000u) << result.message;
  EXPECT_NE(result.message.find(">"), std::string::npos);
}

TEST(Validate, DeadlockFarApartInALongScheduleShowsEachRanksWindow) {
  // Rank 0: F0..F49, then waits for the gradient of 0 before forwarding 50..99.
  // Rank 1: F0..F49, B1..B49, then waits for F50 before running B0: stuck 50 steps later.
  std::string rank0;
  std::string rank1;
  auto add = [](std::string& line, const std::string& action) {
    line += (line.empty() ? "" : ",") + action;
  };
  for (int i = 0; i < 50; ++i) add(rank0, "0F" + std::to_string(i));
  add(rank0, "0B0");
  for (int i = 50; i < 100; ++i) add(rank0, "0F" + std::to_string(i));
  for (int i = 1; i < 100; ++i) add(rank0, "0B" + std::to_string(i));
  for (int i = 0; i < 50; ++i) add(rank1, "1F" + std::to_string(i));
  for (int i = 1; i < 50; ++i) add(rank1, "1B" + std::to_string(i));
  for (int i = 50; i < 100; ++i) add(rank1, "1F" + std::to_string(i));
  add(rank1, "1B0");
  for (int i = 50; i < 100; ++i) add(rank1, "1B" + std::to_string(i));
  const CheckResult result = check(parse_schedule(rank0 + "\n" + rank1 + "\n"));
  ASSERT_FALSE(result.ok);
  EXPECT_NE(result.message.find("far apart"), std::string::npos) << result.message;
  EXPECT_NE(result.message.find("steps 44-56: ... "), std::string::npos) << result.message;
  EXPECT_NE(grid_line(result.message, 0).find(">0B0<"), std::string::npos) << result.message;
  EXPECT_NE(grid_line(result.message, 1).find(">1F50<"), std::string::npos) << result.message;
  EXPECT_LT(result.message.size(), 2000u) << result.message;
}

}  // namespace
}  // namespace pipetrain::schedule
