// Compute lanes: the threads of one rank that may compute at once. Lane 0 is the schedule's own
// thread; lane 1 is the thread on which the overlap of expert exchanges
// (PipeOptions::overlap_expert_exchanges) runs a backward together with a forward of another
// micro-batch. A collective a layer issues goes to its group's copy for the calling thread's
// lane (ExpertParallel::group_of_lane), so the two lanes' collectives never meet in one group:
// every member runs the same actions on each lane, in one order, and each lane's group sees
// them in that order.
//
// Thread-safety: the lane is per thread.
#pragma once

namespace pipetrain {
class C10dGroup;
}

namespace pipetrain::parallel {

// The calling thread's lane: 0 unless a LaneScope set another.
int current_lane();

// The group the calling thread's collectives go to: `second` on lane 1 where it is set, else
// `first`.
C10dGroup& group_of_lane(C10dGroup& first, C10dGroup* second);

class LaneScope {
 public:
  explicit LaneScope(int lane);
  ~LaneScope();
  LaneScope(const LaneScope&) = delete;
  LaneScope& operator=(const LaneScope&) = delete;

 private:
  int previous_;
};

}  // namespace pipetrain::parallel
