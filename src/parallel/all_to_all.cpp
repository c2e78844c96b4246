// Differentiable all-to-all of rows (pipetrain/parallel/all_to_all.h).
#include "pipetrain/parallel/all_to_all.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <tuple>

#include <torch/torch.h>

#include "pipetrain/base/check.h"
#include "pipetrain/parallel/lane.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain::parallel {
namespace {

std::mutex stats_mutex;
AllToAllRowsStats stats;              // by stats_mutex
bool recording = false;               // by stats_mutex
std::vector<LaneInterval> intervals;  // by stats_mutex

torch::Tensor exchange(const torch::Tensor& x, const std::vector<int64_t>& send,
                       const std::vector<int64_t>& receive, C10dGroup& group) {
  const auto begin = std::chrono::steady_clock::now();
  int64_t rows = 0;
  for (int64_t r : receive) rows += r;
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = rows;
  torch::Tensor out = torch::empty(shape, x.options());
  group.all_to_all(x.contiguous(), send, out, receive);
  int64_t sent = 0;
  for (size_t g = 0; g < send.size(); ++g) {
    if (static_cast<int>(g) != group.rank()) sent += send[g];
  }
  const int64_t row_bytes = x.size(0) > 0 ? static_cast<int64_t>(x.nbytes()) / x.size(0) : 0;
  const auto end = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(end - begin).count();
  if (group.is_mirror()) return out;  // a profile's, not the run's
  const std::lock_guard<std::mutex> lock(stats_mutex);
  if (recording) intervals.push_back(LaneInterval{current_lane(), begin, end});
  ++stats.calls;
  stats.seconds += seconds;
  stats.rows_sent += sent;
  stats.bytes_sent += sent * row_bytes;
  return out;
}

struct AllToAllRows : torch::autograd::Function<AllToAllRows> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const std::vector<int64_t>& send,
                               const std::vector<int64_t>& receive, C10dGroup* group,
                               C10dGroup* second) {
    ctx->saved_data["send"] = send;
    ctx->saved_data["receive"] = receive;
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["second"] = reinterpret_cast<int64_t>(second);
    return exchange(x, send, receive, group_of_lane(*group, second));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* group = reinterpret_cast<C10dGroup*>(ctx->saved_data["group"].toInt());
    auto* second = reinterpret_cast<C10dGroup*>(ctx->saved_data["second"].toInt());
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> receive = ctx->saved_data["receive"].toIntVector();
    return {exchange(grads[0], receive, send, group_of_lane(*group, second)), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor all_to_all_rows(const torch::Tensor& x, const std::vector<int64_t>& send,
                              const std::vector<int64_t>& receive, C10dGroup& group,
                              C10dGroup* second) {
  PIPETRAIN_CHECK_INPUT(x.dim() >= 1,
                        "all_to_all_rows needs rows (a tensor of 1 dimension or "
                        "more), got ",
                        x.sizes());
  return AllToAllRows::apply(x, send, receive, &group, second);
}

AllToAllRowsStats all_to_all_rows_stats() {
  const std::lock_guard<std::mutex> lock(stats_mutex);
  return stats;
}

void record_all_to_all_intervals(bool on) {
  const std::lock_guard<std::mutex> lock(stats_mutex);
  recording = on;
  intervals.clear();
}

void add_exposed_all_to_all_seconds(double seconds) {
  const std::lock_guard<std::mutex> lock(stats_mutex);
  stats.exposed_seconds += seconds;
}

std::vector<LaneInterval> take_all_to_all_intervals() {
  const std::lock_guard<std::mutex> lock(stats_mutex);
  std::vector<LaneInterval> taken;
  taken.swap(intervals);
  return taken;
}

double exposed_seconds(const std::vector<LaneInterval>& exchanges,
                       const std::vector<LaneInterval>& busy) {
  // A sweep over the intervals' ends: per lane, how many of its exchanges and of its busy
  // intervals are open.
  constexpr int kLanes = 4;
  using Clock = std::chrono::steady_clock;
  std::vector<std::tuple<Clock::time_point, int, int>> events;  // time, lane x 2 + kind, +-1
  auto add = [&](const std::vector<LaneInterval>& list, int kind) {
    for (const LaneInterval& v : list) {
      PIPETRAIN_CHECK_INPUT(v.lane >= 0 && v.lane < kLanes, "exposed_seconds: lane ", v.lane,
                            " is outside 0..", kLanes - 1);
      if (!(v.begin < v.end)) continue;
      events.emplace_back(v.begin, v.lane * 2 + kind, 1);
      events.emplace_back(v.end, v.lane * 2 + kind, -1);
    }
  };
  add(exchanges, 0);
  add(busy, 1);
  std::sort(events.begin(), events.end());
  int open[2 * kLanes] = {};
  double exposed = 0;
  for (size_t e = 0; e < events.size(); ++e) {
    std::get<2>(events[e]) > 0 ? ++open[std::get<1>(events[e])] : --open[std::get<1>(events[e])];
    if (e + 1 == events.size()) break;
    bool exchanging = false, computing = false;
    for (int lane = 0; lane < kLanes; ++lane) {
      exchanging = exchanging || open[2 * lane] > 0;
      computing = computing || (open[2 * lane + 1] > 0 && open[2 * lane] == 0);
    }
    if (exchanging && !computing) {
      exposed += std::chrono::duration<double>(std::get<0>(events[e + 1]) - std::get<0>(events[e]))
                     .count();
    }
  }
  return exposed;
}

std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send, C10dGroup& group) {
  PIPETRAIN_CHECK_INPUT(static_cast<int>(send.size()) == group.size(),
                        "exchange_counts: ", send.size(), " counts for a group of ", group.size());
  torch::Tensor mine = torch::tensor(send, torch::kLong);
  torch::Tensor theirs = torch::empty_like(mine);
  group.all_to_all(mine, theirs);
  return std::vector<int64_t>(theirs.data_ptr<int64_t>(),
                              theirs.data_ptr<int64_t>() + theirs.numel());
}

}  // namespace pipetrain::parallel
