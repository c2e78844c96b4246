// Compute lanes (pipetrain/parallel/lane.h).
#include "pipetrain/parallel/lane.h"

namespace pipetrain::parallel {
namespace {
thread_local int lane = 0;
}  // namespace

int current_lane() {
  return lane;
}

LaneScope::LaneScope(int new_lane) : previous_(lane) {
  lane = new_lane;
}

LaneScope::~LaneScope() {
  lane = previous_;
}

}  // namespace pipetrain::parallel
