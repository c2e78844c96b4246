#include "pipetrain/schedule/action.h"
#include "pipetrain/base/error.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "pipetrain/base/error.h"

namespace pipetrain::schedule {
namespace {

TEST(Action, TextFormRoundTripsForEveryOp) {
  for (int op = 0; op < 8; ++op) {
    Action action{12, static_cast<Op>(op), 345};
    EXPECT_EQ(parse_action(to_string(action)), action) << to_string(action);
  }
  EXPECT_EQ(to_string(Action{2, Op::kForward, 0}), "2F0");
  EXPECT_EQ(to_string(Action{1, Op::kSendGradient, 7}), "1SB7");
}

TEST(Action, ParseIgnoresSurroundingWhitespace) {
  EXPECT_EQ(parse_action("  3W10 "), (Action{3, Op::kBackwardWeight, 10}));
}

TEST(Action, ParseRejectsMalformedTextNamingIt) {
  for (const char* bad : {"", "F0", "2F", "2X0", "2F0x", "-1F0", "2 F0", "2SX0"}) {
    try {
      parse_action(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const pipetrain::BadInput& e) {
      EXPECT_NE(std::string(e.what()).find("F, B, I, W"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace pipetrain::schedule
