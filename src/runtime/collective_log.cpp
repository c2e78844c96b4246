// The collectives of a rank's step, for traces (pipetrain/runtime/collective_log.h).
#include "pipetrain/runtime/collective_log.h"

#include <chrono>

namespace pipetrain {

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all-reduce";
    case CollectiveKind::kReduceScatter:
      return "reduce-scatter";
    case CollectiveKind::kAllGather:
      return "all-gather";
  }
  return "collective";
}

double CollectiveLog::now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void CollectiveLog::finished(CollectiveKind kind, int stage, double start_us, int64_t bytes) {
  events_.push_back({0, kind, stage, start_us - origin_us_, now_us() - origin_us_, bytes});
}

}  // namespace pipetrain
