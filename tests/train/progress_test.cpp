#include "pipetrain/train/progress.h"

#include <sstream>

#include <gtest/gtest.h>

namespace pipetrain::train {
namespace {

// A clock the test advances by hand.
struct FakeClock {
  double now = 100.0;
  SecondsClock function() {
    return [this] { return now; };
  }
};

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(Progress, PlainModePrintsALineEveryNStepsWithRateLossAndEta) {
  std::ostringstream out;
  FakeClock clock;
  ProgressReporter progress(
      out, false,
      ProgressOptions().total_steps(10).epochs(2).log_every_steps(2).log_every_seconds(0),
      clock.function());
  for (int64_t step = 1; step <= 4; ++step) {
    clock.now += 1.0;  // one step per second, 32 samples each
    progress.update(step, 0, 32, 2.0);
  }
  std::string text = out.str();
  EXPECT_EQ(count(text, "\n"), 2u) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos);
  // After 4 of 10 steps at 1 s each: 6 s left; 32 samples/s.
  EXPECT_NE(text.find("epoch 1/2 step 4/10 samples/s 32.0 loss 2.0000 eta 0:06"), std::string::npos)
      << text;
}

// A language model's rate in tokens, and MFU: 32 samples of 512 tokens a second, 1e9 model FLOPs
// a sample, on hardware of 1e11 FLOP/s: 16384 tokens/s and 32%.
TEST(Progress, ALanguageModelsLineShowsTokensPerSecondAndMfu) {
  std::ostringstream out;
  FakeClock clock;
  ProgressReporter progress(out, false,
                            ProgressOptions()
                                .total_steps(10)
                                .log_every_steps(2)
                                .log_every_seconds(0)
                                .tokens_per_sample(512)
                                .flops_per_token(1e9 / 512)
                                .peak_flops(1e11),
                            clock.function());
  for (int64_t step = 1; step <= 2; ++step) {
    clock.now += 1.0;
    progress.update(step, 0, 32, 2.0);
  }
  EXPECT_NE(out.str().find("step 2/10 samples/s 32.0 tokens/s 16384 MFU 32.0% loss 2.0000"),
            std::string::npos)
      << out.str();
  // Without a peak there is no MFU; without tokens, the line is the plain one (above).
  std::ostringstream plain;
  ProgressReporter no_peak(
      plain, false,
      ProgressOptions().total_steps(10).log_every_steps(1).tokens_per_sample(512).flops_per_token(
          1e9 / 512),
      clock.function());
  clock.now += 1.0;
  no_peak.update(1, 0, 32, 2.0);
  EXPECT_EQ(plain.str().find("MFU"), std::string::npos) << plain.str();
  EXPECT_NE(plain.str().find("tokens/s 16384 loss"), std::string::npos) << plain.str();
}

// Documents count their own tokens and targets per step (padding and uncounted targets left out):
// 3000 tokens and 2900 targets over 2 s.
TEST(Progress, StepsThatCountTheirTokensShowTokensAndTargetsPerSecond) {
  std::ostringstream out;
  FakeClock clock;
  ProgressReporter progress(out, false,
                            ProgressOptions()
                                .total_steps(10)
                                .log_every_steps(2)
                                .log_every_seconds(0)
                                .tokens_per_sample(512)  // a bound only: the steps' counts win
                                .flops_per_token(1e6)
                                .peak_flops(1e11),
                            clock.function());
  clock.now += 1.0;
  progress.update(1, 0, 4, 2.0, 1000, 990);
  clock.now += 1.0;
  progress.update(2, 0, 4, 2.0, 2000, 1910);
  EXPECT_NE(out.str().find("samples/s 4.0 tokens/s 1500 targets/s 1450 MFU 1.5% loss"),
            std::string::npos)
      << out.str();
  const TrainingRate rate = training_rate({2.0, 8, 3000, 2900}, ProgressOptions());
  EXPECT_EQ(rate.tokens, 3000);
  EXPECT_DOUBLE_EQ(rate.tokens_per_second, 1500);
  // Fixed windows: the steps count no tokens; the window does.
  const TrainingRate windows =
      training_rate({2.0, 8, 0, 0}, ProgressOptions().tokens_per_sample(512));
  EXPECT_EQ(windows.tokens, 8 * 512);
  EXPECT_DOUBLE_EQ(windows.tokens_per_second, 8 * 512 / 2.0);
  EXPECT_DOUBLE_EQ(rate.targets_per_second, 1450);
  EXPECT_DOUBLE_EQ(rate.mfu, 0);
}

TEST(Progress, PlainModeAlsoPrintsAfterTheTimeIntervalAndAtTheLastStep) {
  std::ostringstream out;
  FakeClock clock;
  ProgressReporter progress(
      out, false, ProgressOptions().total_steps(5).log_every_steps(0).log_every_seconds(10),
      clock.function());
  progress.update(1, 0, 1, 1.0);  // t = 0 s: nothing
  clock.now += 11;
  progress.update(2, 0, 1, 1.0);  // 11 s later: a line
  progress.update(3, 0, 1, 1.0);  // same instant: nothing
  progress.update(5, 0, 1, 1.0);  // last step: a line
  EXPECT_EQ(count(out.str(), "\n"), 2u) << out.str();
  EXPECT_NE(out.str().find("step 5/5"), std::string::npos);
}

TEST(Progress, TerminalModeRedrawsOneLineAndEndsItAtFinish) {
  std::ostringstream out;
  FakeClock clock;
  ProgressReporter progress(out, true, ProgressOptions().total_steps(4).bar_width(8),
                            clock.function());
  for (int64_t step = 1; step <= 4; ++step) {
    clock.now += 0.5;
    progress.update(step, 0, 10, 1.0);
  }
  std::string text = out.str();
  EXPECT_EQ(count(text, "\r"), 4u) << text;
  EXPECT_EQ(text.find('\n'), std::string::npos) << "a bar must not scroll";
  EXPECT_NE(text.find("[====>   ] 2/4"), std::string::npos) << text;
  EXPECT_NE(text.find("[========] 4/4"), std::string::npos) << text;
  EXPECT_NE(text.find("20 samples/s"), std::string::npos) << text;
  progress.finish();
  EXPECT_EQ(out.str().back(), '\n');
}

TEST(Progress, TerminalModeThrottlesRedraws) {
  std::ostringstream out;
  FakeClock clock;
  ProgressReporter progress(out, true, ProgressOptions().total_steps(100).redraw_seconds(1.0),
                            clock.function());
  for (int64_t step = 1; step <= 50; ++step) progress.update(step, 0, 1, 1.0);  // no time passes
  EXPECT_EQ(count(out.str(), "\r"), 1u);
}

TEST(Progress, SmoothedLossIsAMovingAverage) {
  std::ostringstream out;
  FakeClock clock;
  ProgressReporter progress(out, false, ProgressOptions().total_steps(10).smoothing(0.5),
                            clock.function());
  progress.update(1, 0, 1, 4.0);
  progress.update(2, 0, 1, 2.0);
  progress.update(3, 0, 1, 1.0);
  EXPECT_DOUBLE_EQ(progress.smoothed_loss(), 0.5 * (0.5 * 4.0 + 0.5 * 2.0) + 0.5 * 1.0);
}

TEST(Progress, MessageOnATerminalKeepsTheBarBelowIt) {
  std::ostringstream out;
  FakeClock clock;
  ProgressReporter progress(out, true, ProgressOptions().total_steps(2), clock.function());
  progress.update(1, 0, 1, 1.0);
  progress.message("epoch 1: test accuracy 0.9");
  std::string text = out.str();
  size_t message = text.find("epoch 1: test accuracy 0.9");
  ASSERT_NE(message, std::string::npos);
  EXPECT_NE(text.find('\n', message), std::string::npos);
  EXPECT_NE(text.find("1/2", text.find('\n', message)), std::string::npos) << text;
}

TEST(Progress, DurationsReadAsMinutesAndHours) {
  EXPECT_EQ(format_duration(6), "0:06");
  EXPECT_EQ(format_duration(125), "2:05");
  EXPECT_EQ(format_duration(3725), "1:02:05");
  EXPECT_EQ(format_duration(-1), "?");
}

}  // namespace
}  // namespace pipetrain::train
