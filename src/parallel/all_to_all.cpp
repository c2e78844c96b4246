// Differentiable all-to-all of rows (pipetrain/parallel/all_to_all.h).
#include "pipetrain/parallel/all_to_all.h"

#include <chrono>
#include <mutex>

#include <torch/torch.h>

#include "pipetrain/base/check.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain::parallel {
namespace {

std::mutex stats_mutex;
AllToAllRowsStats stats;  // by stats_mutex

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
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  if (group.is_mirror()) return out;  // a profile's, not the run's
  const std::lock_guard<std::mutex> lock(stats_mutex);
  ++stats.calls;
  stats.seconds += seconds;
  stats.rows_sent += sent;
  stats.bytes_sent += sent * row_bytes;
  return out;
}

struct AllToAllRows : torch::autograd::Function<AllToAllRows> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const std::vector<int64_t>& send,
                               const std::vector<int64_t>& receive, C10dGroup* group) {
    ctx->saved_data["send"] = send;
    ctx->saved_data["receive"] = receive;
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return exchange(x, send, receive, *group);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* group = reinterpret_cast<C10dGroup*>(ctx->saved_data["group"].toInt());
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> receive = ctx->saved_data["receive"].toIntVector();
    return {exchange(grads[0], receive, send, *group), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor all_to_all_rows(const torch::Tensor& x, const std::vector<int64_t>& send,
                              const std::vector<int64_t>& receive, C10dGroup& group) {
  PIPETRAIN_CHECK_INPUT(x.dim() >= 1,
                        "all_to_all_rows needs rows (a tensor of 1 dimension or "
                        "more), got ",
                        x.sizes());
  return AllToAllRows::apply(x, send, receive, &group);
}

AllToAllRowsStats all_to_all_rows_stats() {
  const std::lock_guard<std::mutex> lock(stats_mutex);
  return stats;
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
