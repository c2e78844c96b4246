// all_to_all_rows: the rows of a tensor sent to the members of a group in slices of their own
// sizes, differentiably: expert parallelism's dispatch of tokens to the ranks holding their
// experts, and the combine that brings them back, are two of these.
//
//   forward   y = the rows `send[g]` of x went to member g; y holds receive[g] rows from each
//   backward  dx = all_to_all_rows(dy, receive, send): each row's gradient goes back to the member
//             that sent the row, into the row it came from
//
// Every member of the group calls it together, in one order (transport/c10d.h); `send` and
// `receive` must agree between members (exchange_counts gives each member what the others will
// send it).
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include <torch/types.h>

namespace pipetrain {
class C10dGroup;
}

namespace pipetrain::parallel {

// `second`: the members' group for compute lane 1 (parallel/lane.h), or null. The forward and the
// backward each exchange over the group of the lane of the thread that runs them (a forward on
// the schedule's thread may have its backward beside another forward, on lane 1).
torch::Tensor all_to_all_rows(const torch::Tensor& x, const std::vector<int64_t>& send,
                              const std::vector<int64_t>& receive, C10dGroup& group,
                              C10dGroup* second = nullptr);

// What each member will send this one: `send[g]` is what this member sends member g; the result's
// [g] is what member g sends this one (an all-to-all of one count each).
std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send, C10dGroup& group);

// What this process's all_to_all_rows calls (forward and backward) did so far: how many, the
// seconds spent inside them (blocking: the time the caller waited, exposed unless another thread
// computed meanwhile), and the rows and bytes sent to other members. Thread-safe.
struct AllToAllRowsStats {
  int64_t calls = 0;
  double seconds = 0;
  int64_t rows_sent = 0;
  int64_t bytes_sent = 0;
  // Of `seconds`, what no compute lane covered, as DistributedPipe measures it each training
  // step (exposed_seconds below, added with add_exposed_all_to_all_seconds).
  double exposed_seconds = 0;
};
AllToAllRowsStats all_to_all_rows_stats();

// Where the overlap is measured: each all_to_all_rows call's interval and lane, kept while
// recording is on (record_all_to_all_intervals(true); either call drops what was kept) until
// take_all_to_all_intervals() takes them. Thread-safe.
struct LaneInterval {
  int lane = 0;
  std::chrono::steady_clock::time_point begin, end;
};
void record_all_to_all_intervals(bool on);
void add_exposed_all_to_all_seconds(double seconds);
std::vector<LaneInterval> take_all_to_all_intervals();

// Seconds of `exchanges` no lane computed through: the measure of the union of the exchanges'
// intervals less the times some lane was inside one of its `busy` intervals (its actions) and
// not in an exchange of its own. Without a second lane every exchange is exposed; with one, what
// the other lane's compute covered is hidden.
double exposed_seconds(const std::vector<LaneInterval>& exchanges,
                       const std::vector<LaneInterval>& busy);

}  // namespace pipetrain::parallel
