// parallel/all_to_all.h's measure of exposed exchange time, and parallel/lane.h's choice of a
// group's copy per compute lane.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "pipetrain/base/error.h"
#include "pipetrain/parallel/all_to_all.h"
#include "pipetrain/parallel/expert_parallel.h"
#include "pipetrain/parallel/lane.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// [begin, end) in milliseconds from a fixed origin, on `lane`.
LaneInterval at(int lane, int begin_ms, int end_ms) {
  static const Clock::time_point origin = Clock::now();
  return LaneInterval{lane, origin + std::chrono::milliseconds(begin_ms),
                      origin + std::chrono::milliseconds(end_ms)};
}

TEST(ExposedSeconds, OneLaneExposesEveryExchangeEvenInsideItsOwnAction) {
  // A forward 0..100 ms with two exchanges inside it: nothing else computes meanwhile.
  EXPECT_NEAR(exposed_seconds({at(0, 10, 30), at(0, 60, 70)}, {at(0, 0, 100)}), 0.030, 1e-9);
  EXPECT_NEAR(exposed_seconds({at(0, 10, 30)}, {}), 0.020, 1e-9);
}

TEST(ExposedSeconds, TheOtherLanesComputeHidesWhatItCoversAndNotItsOwnExchanges) {
  // Lane 0's exchange 10..40; lane 1 computes 0..100 but exchanges itself 20..30: hidden 10..20
  // and 30..40, exposed 20..30 (both lanes wait).
  EXPECT_NEAR(exposed_seconds({at(0, 10, 40), at(1, 20, 30)}, {at(0, 0, 50), at(1, 0, 100)}), 0.010,
              1e-9);
  // Lane 1 starts computing at 25: 10..25 exposed.
  EXPECT_NEAR(exposed_seconds({at(0, 10, 40)}, {at(0, 0, 50), at(1, 25, 100)}), 0.015, 1e-9);
  // Overlapping exchanges of one lane count once.
  EXPECT_NEAR(exposed_seconds({at(0, 10, 40), at(0, 20, 50)}, {}), 0.040, 1e-9);
  EXPECT_THROW(exposed_seconds({at(7, 0, 1)}, {}), BadInput);
}

TEST(ComputeLanes, EachThreadPicksItsLanesCopyOfTheGroup) {
  ExpertParallel ep{C10dGroup::mirror(2), C10dGroup::mirror(2)};
  EXPECT_EQ(current_lane(), 0);
  EXPECT_EQ(&ep.group_of_lane(), ep.group.get());
  C10dGroup* seen = nullptr;
  std::thread other([&] {
    const LaneScope lane(1);
    seen = &ep.group_of_lane();
  });
  other.join();
  EXPECT_EQ(seen, ep.second.get());
  EXPECT_EQ(&ep.group_of_lane(), ep.group.get());  // the scope was the other thread's
  {
    const LaneScope lane(1);
    EXPECT_EQ(current_lane(), 1);
    ep.second.reset();  // no second copy: lane 1 uses the one group
    EXPECT_EQ(&ep.group_of_lane(), ep.group.get());
  }
  EXPECT_EQ(current_lane(), 0);
}

}  // namespace
}  // namespace pipetrain::parallel
