// ZeRO++ (pipetrain/train/sharded_optimizer.h, "ZeRO++"): quantized weights in the gathers (qwZ),
// the partition's secondary copy for the backward's gathers (hpZ), and quantized gradients through
// two all-to-alls (qgZ).
//
// Replicas and hosts: the data-parallel group's members in rank order, d = n * L + l on host n at
// local index l, L members on every host (hosts: the world's ranks_per_host). hpZ's partitions
// are consecutive runs of hpz_partition_size replicas (a host's, where that is the size given).
#include <algorithm>
#include <map>

#include <torch/torch.h>

#include "pipetrain/base/check.h"
#include "pipetrain/stage/tensor_bytes.h"
#include "pipetrain/train/block_quantize.h"
#include "pipetrain/train/sharded_optimizer.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain::train {

void check_zero_plus_plus(const ZeroOptions& zero, int replicas) {
  PIPETRAIN_CHECK_INPUT(!zero.quantized_weights() || zero.stage() == 3,
                        "--zero-quantized-weights quantizes ZeRO-3's parameter gathers: it needs "
                        "--zero 3 (got --zero ",
                        zero.stage(), ")");
  PIPETRAIN_CHECK_INPUT(zero.hpz_partition_size() >= 1,
                        "--zero-hpz-partition-size must be 1 (off) or more, got ",
                        zero.hpz_partition_size());
  PIPETRAIN_CHECK_INPUT(zero.hpz_partition_size() == 1 || zero.stage() == 3,
                        "--zero-hpz-partition-size ", zero.hpz_partition_size(),
                        " keeps a copy of ZeRO-3's gathered parameters: it needs --zero 3 (got "
                        "--zero ",
                        zero.stage(), ")");
  PIPETRAIN_CHECK_INPUT(replicas <= 0 || replicas % zero.hpz_partition_size() == 0,
                        "--zero-hpz-partition-size ", zero.hpz_partition_size(),
                        " does not divide the ", replicas, " data-parallel replicas");
}

std::map<int, std::vector<int>> hosts_of_replicas(const std::vector<int>& members,
                                                  int ranks_per_host, const std::string& group) {
  std::map<int, std::vector<int>> hosts;  // host -> its members, in rank order
  for (int rank : members) hosts[ranks_per_host > 0 ? rank / ranks_per_host : 0].push_back(rank);
  const size_t local = hosts.begin()->second.size();
  for (const auto& [host, ranks] : hosts) {
    PIPETRAIN_CHECK_INPUT(ranks.size() == local,
                          "--zero-quantized-gradients reduces within each host, then between "
                          "hosts, and needs as many replicas on every host: data-parallel group ",
                          group, " has ", local, " on host ", hosts.begin()->first, " and ",
                          ranks.size(), " on host ", host, " (--ranks-per-host ", ranks_per_host,
                          ")");
  }
  return hosts;
}

void ShardedOptimizer::make_zero_plus_plus_groups() {
  check_zero_plus_plus(zero_, replicas_);
  C10dGroup* dp = group();
  if (dp == nullptr || !distributed_->world()) return;  // one replica: nothing is sent
  C10dWorld& world = *distributed_->world();
  const std::vector<int>& members = dp->ranks();
  const int me = dp->rank();
  const int h = zero_.hpz_partition_size();
  if (h > 1) {
    const int first = me / h * h;
    hpz_group_ = world.new_group(dp->name() + "/hpz" + std::to_string(me / h),
                                 {members.begin() + first, members.begin() + first + h});
  }
  if (zero_.quantized_gradients()) {
    const int per_host = world.options().ranks_per_host;
    std::map<int, std::vector<int>> hosts =
        hosts_of_replicas(members, per_host, "'" + dp->name() + "'");
    const int my_host = per_host > 0 ? members[static_cast<size_t>(me)] / per_host : 0;
    const std::vector<int>& mine = hosts[my_host];
    const size_t l = static_cast<size_t>(
        std::find(mine.begin(), mine.end(), members[static_cast<size_t>(me)]) - mine.begin());
    std::vector<int> cross;
    for (const auto& [host, ranks] : hosts) cross.push_back(ranks[l]);
    host_group_ = world.new_group(dp->name() + "/qgz-host" + std::to_string(my_host), mine);
    cross_group_ = world.new_group(dp->name() + "/qgz-cross" + std::to_string(l), cross);
  }
}

void ShardedOptimizer::dequantize_gathered(size_t k, Gather& g) {
  const Segment& s = segments_[k];
  const int64_t q = quantized_bytes(s.piece);
  torch::Tensor values = pool_->take(s.padded, g.gathered.options().dtype(g.values_dtype));
  for (int d = 0; d < replicas_; ++d) {
    dequantize_blocks(g.gathered.narrow(0, d * q, q), values.narrow(0, d * s.piece, s.piece));
  }
  pool_->give(g.gathered);
  g.gathered = values;
}

bool ShardedOptimizer::use_is_backward(int u, size_t from) const {
  for (size_t i = from; i < plan_.uses.size(); ++i) {
    if (plan_.uses[i] == u) return i < plan_backward_.size() && plan_backward_[i] != 0;
  }
  return false;
}

bool ShardedOptimizer::reads_secondary(size_t k) const {
  return hpz_group_ && gather_for_backward_ && secondary_[k].defined();
}

void ShardedOptimizer::start_secondary_gather(size_t k, Gather& g) {
  const Segment& s = segments_[k];
  g.from_secondary = true;
  g.piece = secondary_[k];
  g.own_piece = false;
  g.narrowed = g.piece.scalar_type() != parameters_[s.parameters.front()].scalar_type();
  g.keep = true;
  g.gathered = pool_->take(s.padded, g.piece.options());
  g.buffer_bytes = tensor_bytes(g.gathered);
  buffer_bytes_ += g.buffer_bytes;
  note_gather_peaks();
  // Only the training loop posts on the partition's group: nothing to drain.
  TrafficLabel label(kZeroTrafficLabels[1]);
  g.start_us = CollectiveLog::now_us();
  g.wait = hpz_group_->all_gather_start(g.piece, g.gathered);
  g.state = Residency::kGathering;
}

void ShardedOptimizer::keep_secondary(size_t k, const torch::Tensor& gathered) {
  if (!hpz_group_ || secondary_[k].defined()) return;
  // By layer a persistent segment stays whole through the step: never gathered again.
  if (by_layer_ && segments_[k].layer < 0) return;
  const int64_t part = segments_[k].padded / hpz_group_->size();
  secondary_[k] = gathered.narrow(0, hpz_group_->rank() * part, part).clone();
  secondary_bytes_ += tensor_bytes(secondary_[k]);
}

void ShardedOptimizer::drop_secondaries() {
  for (torch::Tensor& t : secondary_) t = torch::Tensor();
  secondary_bytes_ = 0;
  std::fill(gathered_this_step_.begin(), gathered_this_step_.end(), 0);
}

// One hop of qgZ: `parts` [members, m] float32, part g quantized and sent to member g of
// `group`; returns [m], the sum of what every member sent this one, dequantized (in member order).
// A group of one sends nothing and quantizes nothing.
torch::Tensor ShardedOptimizer::quantized_exchange_sum(const torch::Tensor& parts,
                                                       C10dGroup& group) {
  const int64_t members = parts.size(0), m = parts.size(1);
  if (members == 1) return parts[0];
  const int64_t q = quantized_bytes(m);
  const auto bytes = parts.options().dtype(torch::kUInt8);
  torch::Tensor send = pool_->take(members * q, bytes);
  torch::Tensor received = pool_->take(members * q, bytes);
  for (int64_t g = 0; g < members; ++g) {
    quantize_blocks(parts[g].contiguous(), send.narrow(0, g * q, q));
  }
  group.all_to_all(send, received);
  torch::Tensor sum = torch::zeros({m}, parts.options());
  torch::Tensor values = torch::empty({m}, parts.options());
  for (int64_t g = 0; g < members; ++g) {
    dequantize_blocks(received.narrow(0, g * q, q), values);
    sum.add_(values);
  }
  pool_->give(send);
  pool_->give(received);
  return sum;
}

void ShardedOptimizer::quantized_reduce_scatter(const torch::Tensor& flat, torch::Tensor& piece) {
  torch::NoGradGuard no_grad;
  const int64_t hosts = cross_group_->size(), local = host_group_->size();
  const int64_t n = piece.numel();
  // Hop 1, within the host: to local member l the pieces of replicas h * L + l for every host h,
  // one after the other (the paper's reordering of the tensor's slices: [host][local] becomes
  // [local][host]), so that what member l sums, this host's sums of the pieces it sends on, is
  // in host order for hop 2.
  const torch::Tensor reordered =
      flat.to(torch::kFloat).view({hosts, local, n}).transpose(0, 1).reshape({local, hosts * n});
  const torch::Tensor partial = quantized_exchange_sum(reordered, *host_group_);
  // Hop 2, between hosts: to host h its piece of the partial sums.
  piece.copy_(quantized_exchange_sum(partial.view({hosts, n}), *cross_group_));
}

}  // namespace pipetrain::train
