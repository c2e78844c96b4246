// Compute lanes (pipetrain/parallel/lane.h).
#include "pipetrain/parallel/lane.h"

namespace pipetrain::parallel {
namespace {
thread_local int lane = 0;
}  // namespace

int current_lane() {
  return lane;
}

C10dGroup& group_of_lane(C10dGroup& first, C10dGroup* second) {
  return lane == 1 && second != nullptr ? *second : first;
}

LaneScope::LaneScope(int new_lane) : previous_(lane) {
  lane = new_lane;
}

LaneScope::~LaneScope() {
  lane = previous_;
}

}  // namespace pipetrain::parallel
