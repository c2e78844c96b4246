// CollectiveLog: the data-parallel collectives of one rank's step -- ZeRO's all-gathers and
// reduce-scatters, the replicas' gradient all-reduce -- each from the moment it was started to the
// moment a wait found it complete, for the trace's collectives rows (`train --trace`: a row
// "rank r collectives" under the ranks' actions).
//
//   rank 0          F0 F0 F2 F2 ... B2 B2 B0 B0
//   rank 0 coll.        [all-gather s2]   [reduce-scatter s2 ......]  [reduce-scatter s0]
//
// An asynchronous collective's end is when its wait returned, so a span also covers the time it
// sat complete before anyone asked: it shows how long a collective was in flight at most, and
// where its wait fell. DistributedPipe restarts the log when a step starts; what a ZeRO optimizer
// records after the step (its reduce-scatters' waits, its step's all-gather) belongs to the same
// step.
//
// Thread-safety: none; the rank's training thread (the interpreter's hooks run on it).
#pragma once

#include <cstdint>
#include <vector>

namespace pipetrain {

enum class CollectiveKind : std::int32_t { kAllReduce, kReduceScatter, kAllGather };

// "all-reduce", "reduce-scatter", "all-gather".
const char* collective_name(CollectiveKind kind);

struct CollectiveEvent {
  int rank = 0;  // filled in by whoever gathers the ranks' logs
  CollectiveKind kind = CollectiveKind::kAllReduce;
  int stage = -1;  // the local stage whose tensors it carries; -1: several, or none in particular
  double start_us = 0;  // microseconds since the step started (as ActionEvent's)
  double end_us = 0;
  int64_t bytes = -1;  // what this rank sent into it (its piece, its gradients); -1: not recorded
};

class CollectiveLog {
 public:
  // Microseconds on the monotonic clock (EventLog::now_us's).
  static double now_us();
  // A collective of `kind` over `stage`'s tensors, started at start_us (now_us()'s clock), found
  // complete now, carrying `bytes` from this rank (-1: not recorded); filed relative to the
  // step's start.
  void finished(CollectiveKind kind, int stage, double start_us, int64_t bytes = -1);
  // A new step, started at now_us()'s `origin_us`: the log emptied.
  void restart(double origin_us) {
    events_.clear();
    origin_us_ = origin_us;
  }
  const std::vector<CollectiveEvent>& events() const { return events_; }

 private:
  std::vector<CollectiveEvent> events_;
  double origin_us_ = 0;
};

}  // namespace pipetrain
