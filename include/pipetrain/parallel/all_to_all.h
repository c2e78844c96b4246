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

#include <cstdint>
#include <vector>

#include <torch/types.h>

namespace pipetrain {
class C10dGroup;
}

namespace pipetrain::parallel {

torch::Tensor all_to_all_rows(const torch::Tensor& x, const std::vector<int64_t>& send,
                              const std::vector<int64_t>& receive, C10dGroup& group);

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
};
AllToAllRowsStats all_to_all_rows_stats();

}  // namespace pipetrain::parallel
