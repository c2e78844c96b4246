// C10dGroup: a process group's collectives (transport/c10d.h), and under
// TORCH_DISTRIBUTED_DEBUG=DETAIL the check of their order before each is posted. The world that
// makes the groups (rendezvous, abort channel, watchdog) is in c10d_world.cpp.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "c10d_internal.h"
#include "pipetrain/base/check.h"
#include "pipetrain/base/error.h"

namespace pipetrain {

int C10dGroup::Impl::group_rank_of(int world_rank) const {
  auto it = std::find(ranks.begin(), ranks.end(), world_rank);
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}

namespace {
thread_local std::string traffic_label;  // TrafficLabel's, "" when none lives
}  // namespace

const char* to_string(TrafficKind kind) {
  return C10dGroup::Impl::kKinds[static_cast<int>(kind)];
}

TrafficLabel::TrafficLabel(std::string label) : previous_(std::move(traffic_label)) {
  traffic_label = std::move(label);
}
TrafficLabel::~TrafficLabel() {
  traffic_label = std::move(previous_);
}

bool C10dGroup::Impl::same_host(std::size_t g) const {
  const auto host = [this](int world_rank) {
    return ranks_per_host > 0 ? world_rank / ranks_per_host : 0;
  };
  return host(ranks[g]) == host(ranks[static_cast<std::size_t>(group_rank)]);
}

void C10dGroup::Impl::add_sent(int kind, int64_t within, int64_t between) {
  sent->within[static_cast<std::size_t>(kind)] += within;
  sent->between[static_cast<std::size_t>(kind)] += between;
  if (!traffic_label.empty()) {
    std::lock_guard<std::mutex> lock(sent->labelled_mutex);
    CollectiveTraffic& t = sent->labelled[traffic_label];
    t.within_host += within;
    t.between_hosts += between;
  }
}

void C10dGroup::Impl::count_traffic(int kind, const at::Tensor& tensor, int root) {
  const int64_t n = static_cast<int64_t>(ranks.size());
  if (n < 2 || !tensor.defined() || kind >= kTrafficKinds) return;
  const int64_t bytes = static_cast<int64_t>(tensor.nbytes());
  if (kind == kAllToAll) {  // B / n to each other member
    count_all_to_all(std::vector<int64_t>(static_cast<std::size_t>(n), bytes / n));
    return;
  }
  // A ring: everything to the next member.
  const int next = (group_rank + 1) % static_cast<int>(n);
  int64_t sent_bytes = 0;
  switch (kind) {
    case kAllReduce:
      sent_bytes = 2 * (n - 1) * bytes / n;
      break;
    case kBroadcast:
      sent_bytes = next == root ? 0 : bytes;
      break;
    case kReduceScatter:
      sent_bytes = (n - 1) * bytes / n;
      break;
    default:  // kAllGather
      sent_bytes = (n - 1) * bytes;
      break;
  }
  const bool within = same_host(static_cast<std::size_t>(next));
  add_sent(kind, within ? sent_bytes : 0, within ? 0 : sent_bytes);
}

void C10dGroup::Impl::count_all_to_all(const std::vector<int64_t>& bytes) {
  int64_t within = 0, between = 0;
  for (std::size_t g = 0; g < bytes.size() && g < ranks.size(); ++g) {
    if (static_cast<int>(g) == group_rank) continue;
    (same_host(g) ? within : between) += bytes[g];
  }
  add_sent(kAllToAll, within, between);
}

C10dGroup::Traffic C10dGroup::traffic(Collective collective) const {
  const auto k = static_cast<std::size_t>(collective);
  return {impl_->sent->within[k].load(), impl_->sent->between[k].load()};
}

std::unique_lock<std::mutex> C10dGroup::Impl::check_collective(Kind kind, const at::Tensor& tensor,
                                                               int root) {
  count_traffic(kind, tensor, root);
  if (!check_backend) return {};
  std::unique_lock<std::mutex> lock(post_mutex);
  const int64_t sequence = checked++;
  constexpr int64_t kFields = 5;  // sequence, kind, dtype (-1: none), elements, root
  const at::Tensor mine =
      torch::tensor({sequence, static_cast<int64_t>(kind),
                     tensor.defined() ? static_cast<int64_t>(tensor.scalar_type()) : int64_t{-1},
                     tensor.defined() ? tensor.numel() : int64_t{0}, static_cast<int64_t>(root)},
                    torch::kLong);
  const int size = static_cast<int>(ranks.size());
  at::Tensor all = torch::empty({size * kFields}, torch::kLong);
  at::Tensor input = mine;
  detail::wait_work(check_backend->_allgather_base(all, input),
                    c10::str("checking collective ", sequence, " of group '", name, "'"));
  const auto describe = [&](const at::Tensor& row) {
    const auto f = row.accessor<int64_t, 1>();
    std::string what = f[1] >= 0 && f[1] <= kGatherBytes ? kKinds[f[1]] : "an unknown collective";
    if (f[1] != kBarrier && f[1] != kGatherBytes) {  // those two carry no tensor
      what += c10::str(
          " of ", f[3], " ",
          f[2] >= 0 ? c10::toString(static_cast<c10::ScalarType>(static_cast<int8_t>(f[2]))) : "?");
    }
    if (f[4] >= 0) what += c10::str(f[1] == kGatherBytes ? " to" : " from", " group rank ", f[4]);
    return c10::str(what, " as its collective ", f[0]);
  };
  const at::Tensor rows = all.view({size, kFields});
  for (int g = 0; g < size; ++g) {
    if (torch::equal(rows[g], mine)) continue;
    throw_error(ErrorKind::Runtime,
                c10::str("collective mismatch over group '", name, "': group rank ", group_rank,
                         " (rank ", ranks[group_rank], ") posts ", describe(mine), ", group rank ",
                         g, " (rank ", ranks[g], ") posts ", describe(rows[g]),
                         "; every member must post a group's collectives in one order (checked "
                         "because TORCH_DISTRIBUTED_DEBUG=DETAIL)"));
  }
  return lock;
}

C10dGroup::C10dGroup(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

bool C10dGroup::is_mirror() const {
  return impl_->mirror;
}

std::shared_ptr<C10dGroup> C10dGroup::mirror(int size, int rank) {
  PIPETRAIN_CHECK_INPUT(size >= 1 && rank >= 0 && rank < size, "a mirror group of ", size,
                        " members has no member ", rank);
  auto impl = std::make_shared<Impl>();
  impl->name = "mirror of " + std::to_string(size);
  for (int r = 0; r < size; ++r) impl->ranks.push_back(r);
  impl->group_rank = rank;
  impl->mirror = true;
  return std::make_shared<C10dGroup>(std::move(impl));
}
C10dGroup::~C10dGroup() = default;

int C10dGroup::rank() const {
  return impl_->group_rank;
}
int C10dGroup::size() const {
  return static_cast<int>(impl_->ranks.size());
}
const std::vector<int>& C10dGroup::ranks() const {
  return impl_->ranks;
}
const std::string& C10dGroup::name() const {
  return impl_->name;
}

torch::Device C10dGroup::collective_device(const torch::Device& device) const {
  return impl_->cpu_backend && device.is_cuda() ? device : torch::Device(torch::kCPU);
}

void C10dGroup::allreduce_sum(std::vector<torch::Tensor>& tensors) {
  allreduce_sum_start(tensors)();
}

// Every collective posts detached aliases of its tensors (same storage and version counter, no
// autograd metadata). A posted Work holds its tensors until Gloo's pt_gloo_runloop thread drops it,
// holding its queue's mutex; a tensor with a grad_fn (tensor parallelism posts a custom autograd
// Function's input from its forward) could then free the autograd graph on that thread, locking
// each freed node's mutex under Gloo's, where the training thread locks them the other way round
// (a node's backward posting a collective). ThreadSanitizer reported that order as a potential
// deadlock (`make tsan`'s ShardedOptimizer.ZeroThreeComposesWithTheRestOfTheStepBitForBit run, 3-D
// with sequence parallelism); detached, the graph is always freed by the thread that built it.
std::function<void()> C10dGroup::allreduce_sum_start(std::vector<torch::Tensor>& tensors) {
  if (impl_->mirror) {
    for (auto& tensor : tensors) tensor.mul_(size());
    return [] {};
  }
  // c10d treats the tensors of one call as per-device replicas, so each gets its own call; all
  // are posted before the first wait so Gloo pipelines them.
  std::vector<c10::intrusive_ptr<detail::C10dWork>> works;
  for (auto& tensor : tensors) {
    std::vector<at::Tensor> one{tensor.detach()};  // detached: see above allreduce_sum_start
    ::c10d::AllreduceOptions options;
    options.reduceOp = ::c10d::ReduceOp::SUM;
    const auto posting = impl_->check_collective(Impl::kAllReduce, tensor);
    works.push_back(impl_->backend_for(tensor).allreduce(one, options));
  }
  return [works = std::move(works), name = impl_->name] {
    for (const auto& work : works) detail::wait_work(work, "allreduce over group '" + name + "'");
  };
}

void C10dGroup::broadcast(std::vector<torch::Tensor>& tensors, int root) {
  PIPETRAIN_CHECK_INPUT(root >= 0 && root < size(), "broadcast root ", root,
                        " is not a rank of group '", impl_->name, "' (size ", size(), ")");
  if (impl_->mirror) return;
  std::vector<c10::intrusive_ptr<detail::C10dWork>> works;
  for (auto& tensor : tensors) {
    std::vector<at::Tensor> one{tensor.detach()};  // detached: see above allreduce_sum_start
    ::c10d::BroadcastOptions options;
    options.rootRank = root;
    const auto posting = impl_->check_collective(Impl::kBroadcast, tensor, root);
    works.push_back(impl_->backend_for(tensor).broadcast(one, options));
  }
  for (auto& work : works) detail::wait_work(work, "broadcast over group '" + impl_->name + "'");
}

namespace {

void check_shard_sizes(const C10dGroup& group, const torch::Tensor& flat,
                       const torch::Tensor& shard, const char* what) {
  PIPETRAIN_CHECK_INPUT(
      flat.is_contiguous() && shard.is_contiguous() && flat.scalar_type() == shard.scalar_type() &&
          flat.numel() == shard.numel() * group.size(),
      what, " over group '", group.name(), "' needs a contiguous flat tensor of ", group.size(),
      " x the shard's elements and one dtype (flat ", flat.numel(), " ", flat.scalar_type(),
      ", shard ", shard.numel(), " ", shard.scalar_type(), ")");
}

// Gloo's reduce-scatter and all-gather stage the whole flat vector in a buffer of their own, a
// second copy of it for the collective's length (890 MiB for Qwen2-1.5B's embedding table, at a
// ZeRO-3 gather and at its gradient's reduction). On the CPU a flat vector larger than this goes
// through in chunks of about this size, one collective after the other through a buffer of a
// chunk, so what the collective stages is a chunk's. Each element meets the same values: an
// all-gather copies, and a reduce-scatter sums each element's R values (bit for bit the
// unchunked sums at R = 2, where a sum of two is one addition either way).
constexpr int64_t kChunkBytes = int64_t{16} << 20;

bool chunked(const at::Tensor& flat) {
  return flat.is_cpu() && flat.numel() * static_cast<int64_t>(flat.element_size()) > kChunkBytes;
}

// For each chunk of the shard, [from, from + length) with R of them about kChunkBytes: `chunk`
// gets the range and a buffer of R x length elements, and `flat` as R rows of the shard's
// length.
template <typename F>
void for_each_chunk(const at::Tensor& flat, int64_t ranks, int64_t n, F&& chunk) {
  const int64_t step = std::min(
      n, std::max<int64_t>(1, kChunkBytes / (ranks * static_cast<int64_t>(flat.element_size()))));
  const at::Tensor rows = flat.detach().view({ranks, n});
  at::Tensor buffer = at::empty({ranks * step}, flat.options());
  for (int64_t from = 0; from < n; from += step) {
    const int64_t length = std::min(step, n - from);
    chunk(rows, from, length, buffer.narrow(0, 0, ranks * length));
  }
}

}  // namespace

void C10dGroup::reduce_scatter_sum(const torch::Tensor& flat, torch::Tensor& shard) {
  reduce_scatter_sum_start(flat, shard)();
}

std::function<void()> C10dGroup::reduce_scatter_sum_start(const torch::Tensor& flat,
                                                          torch::Tensor& shard) {
  check_shard_sizes(*this, flat, shard, "reduce_scatter_sum");
  if (size() == 1) {
    shard.copy_(flat);
    return [] {};
  }
  if (impl_->mirror) {
    shard.copy_(flat.narrow(0, rank() * shard.numel(), shard.numel()));
    shard.mul_(size());
    return [] {};
  }
  ::c10d::ReduceScatterOptions options;
  options.reduceOp = ::c10d::ReduceOp::SUM;
  if (chunked(flat)) {  // one chunk at a time, done before this returns
    const int64_t ranks = size();
    for_each_chunk(flat, ranks, shard.numel(),
                   [&](const at::Tensor& rows, int64_t from, int64_t length, at::Tensor input) {
                     input.view({ranks, length}).copy_(rows.narrow(1, from, length));
                     at::Tensor output = shard.detach().narrow(0, from, length);
                     c10::intrusive_ptr<detail::C10dWork> work;
                     {
                       const auto posting = impl_->check_collective(Impl::kReduceScatter, input);
                       work =
                           impl_->backend_for(input)._reduce_scatter_base(output, input, options);
                     }
                     detail::wait_work(work, "reduce_scatter over group '" + impl_->name + "'");
                   });
    return [] {};
  }
  at::Tensor input = flat.detach();  // detached: see above allreduce_sum_start
  at::Tensor output = shard.detach();
  const auto posting = impl_->check_collective(Impl::kReduceScatter, input);
  auto work = impl_->backend_for(input)._reduce_scatter_base(output, input, options);
  return [work, name = impl_->name] {
    detail::wait_work(work, "reduce_scatter over group '" + name + "'");
  };
}

void C10dGroup::all_gather(const torch::Tensor& shard, torch::Tensor& flat) {
  all_gather_start(shard, flat)();
}

std::function<void()> C10dGroup::all_gather_start(const torch::Tensor& shard, torch::Tensor& flat) {
  check_shard_sizes(*this, flat, shard, "all_gather");
  if (size() == 1) {
    flat.copy_(shard);
    return [] {};
  }
  if (impl_->mirror) {
    flat.view({size(), shard.numel()}).copy_(shard.reshape({1, -1}));
    return [] {};
  }
  if (chunked(flat)) {  // one chunk at a time, done before this returns
    const int64_t ranks = size();
    for_each_chunk(flat, ranks, shard.numel(),
                   [&](const at::Tensor& rows, int64_t from, int64_t length, at::Tensor output) {
                     at::Tensor input = shard.detach().narrow(0, from, length);
                     c10::intrusive_ptr<detail::C10dWork> work;
                     {
                       const auto posting = impl_->check_collective(Impl::kAllGather, input);
                       work = impl_->backend_for(input)._allgather_base(output, input);
                     }
                     detail::wait_work(work, "all_gather over group '" + impl_->name + "'");
                     rows.narrow(1, from, length).copy_(output.view({ranks, length}));
                   });
    return [] {};
  }
  at::Tensor input = shard.detach();  // detached: see above allreduce_sum_start
  at::Tensor output = flat.detach();
  const auto posting = impl_->check_collective(Impl::kAllGather, input);
  auto work = impl_->backend_for(input)._allgather_base(output, input);
  return [work, name = impl_->name] {
    detail::wait_work(work, "all_gather over group '" + name + "'");
  };
}

void C10dGroup::all_to_all(const torch::Tensor& input, torch::Tensor& output) {
  PIPETRAIN_CHECK_INPUT(input.is_contiguous() && output.is_contiguous() &&
                            input.scalar_type() == output.scalar_type() &&
                            input.numel() == output.numel() && input.numel() % size() == 0,
                        "all_to_all over group '", name(),
                        "' needs contiguous input and output of one dtype and ", size(),
                        " equal slices (input ", input.numel(), " ", input.scalar_type(),
                        ", output ", output.numel(), " ", output.scalar_type(), ")");
  if (size() == 1) {
    output.copy_(input);
    return;
  }
  if (impl_->mirror) {  // every member sends this member what this member sends itself
    const int64_t n = input.numel() / size();
    output.view({size(), n}).copy_(input.reshape({-1}).narrow(0, rank() * n, n).reshape({1, -1}));
    return;
  }
  at::Tensor in = input.detach();  // detached: see above allreduce_sum_start
  at::Tensor out = output.detach();
  std::vector<int64_t> splits;  // empty: equal slices
  ::c10d::AllToAllOptions options;
  c10::intrusive_ptr<detail::C10dWork> work;
  {
    const auto posting = impl_->check_collective(Impl::kAllToAll, in);
    work = impl_->backend_for(in).alltoall_base(out, in, splits, splits, options);
  }
  detail::wait_work(work, "all_to_all over group '" + impl_->name + "'");
}

void C10dGroup::all_to_all(const torch::Tensor& input, const std::vector<int64_t>& send,
                           torch::Tensor& output, const std::vector<int64_t>& receive) {
  all_to_all_start(input, send, output, receive)();
}

std::function<void()> C10dGroup::all_to_all_start(const torch::Tensor& input,
                                                  const std::vector<int64_t>& send,
                                                  torch::Tensor& output,
                                                  const std::vector<int64_t>& receive) {
  const auto sum = [](const std::vector<int64_t>& v) {
    return std::accumulate(v.begin(), v.end(), int64_t{0});
  };
  const bool shapes = input.dim() >= 1 && output.dim() == input.dim() &&
                      input.sizes().slice(1) == output.sizes().slice(1);
  PIPETRAIN_CHECK_INPUT(
      input.is_contiguous() && output.is_contiguous() &&
          input.scalar_type() == output.scalar_type() && shapes &&
          static_cast<int>(send.size()) == size() && static_cast<int>(receive.size()) == size() &&
          sum(send) == input.size(0) && sum(receive) == output.size(0),
      "all_to_all over group '", name(), "' needs contiguous tensors of one dtype and row shape, ",
      size(), " send and receive counts summing to their rows (input ", input.sizes(), ", output ",
      output.sizes(), ", ", send.size(), " and ", receive.size(), " counts)");
  if (size() == 1) {
    output.copy_(input);
    return [] {};
  }
  if (impl_->mirror) {
    // Shapes only: member g's rows are this member's rows for g, cut or padded with zeros to
    // the count (members that differ cannot be mirrored).
    int64_t from = 0, to = 0;
    for (int g = 0; g < size(); ++g) {
      const int64_t sent = send[static_cast<size_t>(g)];
      const int64_t wanted = receive[static_cast<size_t>(g)];
      const int64_t copied = std::min(sent, wanted);
      output.narrow(0, to, copied).copy_(input.narrow(0, from, copied));
      output.narrow(0, to + copied, wanted - copied).zero_();
      from += sent;
      to += wanted;
    }
    return [] {};
  }
  at::Tensor in = input.detach();  // detached: see above allreduce_sum_start
  at::Tensor out = output.detach();
  std::vector<int64_t> in_splits = send, out_splits = receive;
  const int64_t row_bytes = input.size(0) > 0 ? static_cast<int64_t>(input.nbytes()) / input.size(0)
                                              : static_cast<int64_t>(input.element_size());
  std::vector<int64_t> bytes;
  for (int64_t rows : send) bytes.push_back(rows * row_bytes);
  ::c10d::AllToAllOptions options;
  c10::intrusive_ptr<detail::C10dWork> work;
  {
    // Checked by kind alone (the members' slice sizes differ), as gather_bytes is.
    const auto posting = impl_->check_collective(Impl::kAllToAll, at::Tensor());
    impl_->count_all_to_all(bytes);
    work = impl_->backend_for(in).alltoall_base(out, in, out_splits, in_splits, options);
  }
  return [work, name = impl_->name] {
    detail::wait_work(work, "all_to_all over group '" + name + "'");
  };
}

void C10dGroup::barrier() {
  if (impl_->mirror) return;
  detail::C10dBackendBase& backend = impl_->cpu_backend ? *impl_->cpu_backend : *impl_->backend;
  c10::intrusive_ptr<detail::C10dWork> work;
  {
    const auto posting = impl_->check_collective(Impl::kBarrier, at::Tensor());
    work = backend.barrier();
  }
  detail::wait_work(work, "barrier of group '" + impl_->name + "'");
}

std::vector<std::vector<char>> C10dGroup::gather_bytes(const std::vector<char>& mine) {
  const int size_tag = kC10dControlTagBase + 1;
  const int data_tag = kC10dControlTagBase + 2;
  std::vector<std::vector<char>> result;
  if (impl_->mirror) {
    if (rank() == 0) result.assign(static_cast<size_t>(size()), mine);
    return result;
  }
  // Checked as a whole (its blobs' sizes differ between members, so only its kind and root are
  // compared), and the group's lock held until the last blob has gone or come: its sends and
  // receives are the posting.
  const auto posting = impl_->check_collective(Impl::kGatherBytes, at::Tensor(), 0);
  if (rank() != 0) {
    std::vector<at::Tensor> length{
        torch::tensor({static_cast<int64_t>(mine.size())}, torch::kLong)};
    detail::wait_work(impl_->backend_for(length[0]).send(length, 0, size_tag),
                      "gather (size) to group rank 0");
    if (!mine.empty()) {
      std::vector<at::Tensor> data{
          torch::empty({static_cast<int64_t>(mine.size())}, torch::kUInt8)};
      std::memcpy(data[0].data_ptr(), mine.data(), mine.size());
      detail::wait_work(impl_->backend_for(data[0]).send(data, 0, data_tag),
                        "gather (data) to group rank 0");
    }
    return result;
  }
  result.resize(static_cast<std::size_t>(size()));
  result[0] = mine;
  for (int g = 1; g < size(); ++g) {
    std::vector<at::Tensor> length{torch::empty({1}, torch::kLong)};
    const std::string from = "gather from world rank " + std::to_string(impl_->ranks[g]);
    detail::wait_work(impl_->backend_for(length[0]).recv(length, g, size_tag), from);
    const int64_t n = length[0].item<int64_t>();
    if (n > 0) {
      std::vector<at::Tensor> data{torch::empty({n}, torch::kUInt8)};
      detail::wait_work(impl_->backend_for(data[0]).recv(data, g, data_tag), from);
      const auto* bytes = static_cast<const char*>(data[0].data_ptr());
      result[g].assign(bytes, bytes + n);
    }
  }
  return result;
}

}  // namespace pipetrain
