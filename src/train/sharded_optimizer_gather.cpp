// ZeRO-3's parameters (pipetrain/train/sharded_optimizer.h): segments gathered into a buffer the
// parameters then point into, freed again, by stage (StageParameters, driven by the pipe's
// residency plan) or by layer (StageParameterHooks, driven by the stages and
// schedule/unit_residency.h's plan).
//
//   start_gather_segment   piece (this replica's, narrowed if the segment gathers narrower)
//                          --all-gather--> `gathered`: every replica's pieces, padded
//   wait_segment           wait; widen (or move to the parameters' device) if need be; every
//                          parameter's storage now points into that buffer: no copy
//   release_segment        every parameter's storage freed: the buffer goes with the last one
#include "pipetrain/train/sharded_optimizer.h"

#include <algorithm>
#include <optional>
#include <tuple>

#include <torch/torch.h>

#include "pipetrain/base/check.h"
#include "pipetrain/stage/tensor_bytes.h"
#include "pipetrain/train/block_quantize.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain::train {
namespace {

// Stage 3 frees a parameter's storage and points it into a gathered buffer again, leaving the
// tensor itself (shape, version counter, autograd identity) alone: modules, optimizers and the
// autograd graphs that saved it keep their handles, and see the values once they are back.
void free_storage(const torch::Tensor& p) {
  c10::StorageImpl* storage = p.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, p.device()));
  storage->set_nbytes(0);
}

// A gathered buffer the parameters of its segment point into; when the last of them is freed it
// goes back to the pool (train/buffer_pool.h).
struct Lease {
  torch::Tensor buffer;
  std::shared_ptr<BufferPool> pool;
  bool keep = true;  // false: gathered outside a step (gather_all), not kept as a spare
  ~Lease() { pool->give(buffer, keep); }
};

// p's storage pointed into the leased buffer from element `offset` (p is contiguous from its
// storage's start): the parameter reads and writes the buffer, and holds the lease until it is
// freed.
void point_into(const torch::Tensor& p, const std::shared_ptr<Lease>& lease, int64_t offset) {
  const torch::Tensor& buffer = lease->buffer;
  auto* holder = new std::shared_ptr<Lease>(lease);
  void* data = static_cast<char*>(buffer.data_ptr()) + offset * buffer.element_size();
  c10::StorageImpl* storage = p.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(
      data, holder, [](void* ctx) { delete static_cast<std::shared_ptr<Lease>*>(ctx); },
      p.device()));
  storage->set_nbytes(static_cast<size_t>(tensor_bytes(p)));
}

}  // namespace

torch::Tensor ShardedOptimizer::gather_source() const {
  return staged_ ? device_shard_ : shard_;
}

void ShardedOptimizer::take_parameters() {  // [0]
  if (stage_ != 3 || !parameters_are_truth_) return;
  load_shard();
  parameters_are_truth_ = false;
  release_all();
}

std::vector<size_t> ShardedOptimizer::segments_of_stage(int stage) const {
  std::vector<size_t> found;
  for (size_t k = 0; k < segments_.size(); ++k) {
    if (segments_[k].stage == stage || segments_[k].stage < 0) found.push_back(k);
  }
  return found;
}

void ShardedOptimizer::start_gather(int stage) {
  if (stage_ != 3) return;
  take_parameters();  // a step run without zero_grad() first
  for (size_t k : segments_of_stage(stage)) start_gather_segment(k);
}

void ShardedOptimizer::wait_gathered(int stage) {
  if (stage_ != 3) return;
  take_parameters();
  for (size_t k : segments_of_stage(stage)) wait_segment(k);
}

void ShardedOptimizer::release(int stage) {
  if (stage_ != 3) return;
  take_parameters();
  for (size_t k = 0; k < segments_.size(); ++k) {
    if (segments_[k].stage == stage) release_segment(k);
  }
}

void ShardedOptimizer::gather_all() {
  if (stage_ != 3) return;
  // In the parameters' dtype: what is read now (a checkpoint, an evaluation, the end of training)
  // must be the shard's values, not their rounding.
  for (size_t k = 0; k < segments_.size(); ++k) {
    if (gathers_[k].narrowed) release_segment(k);
    start_gather_segment(k, /*exact=*/true);
  }
  for (size_t k = 0; k < segments_.size(); ++k) wait_segment(k);
  parameters_are_truth_ = true;
}

void ShardedOptimizer::release_all() {
  if (stage_ != 3) return;
  for (size_t k = 0; k < segments_.size(); ++k) release_segment(k);
}

void ShardedOptimizer::start_gather_segment(size_t k, bool exact) {
  Gather& g = gathers_[k];
  if (g.state != Residency::kFreed) return;
  const Segment& s = segments_[k];
  if (!exact) {
    // By stage the plan says nothing of what a gather serves: a segment's first of the step is
    // a forward's, the later ones a backward's.
    if (!by_layer_) gather_for_backward_ = gathered_this_step_[k] != 0;
    gathered_this_step_[k] = 1;
    if (reads_secondary(k)) {  // hpZ: from the partition's copy, within the host
      start_secondary_gather(k, g);
      return;
    }
  }
  // One replica with the values in the file: its piece is the whole segment, read straight into
  // the buffer the parameters will point into (no second copy).
  const bool direct =
      params_in_file_ && s.group == nullptr && (exact || s.gather_dtype == comm_options().dtype());
  torch::Tensor piece;
  if (params_in_file_) {  // read from the file into a buffer of its own, then where it is sent
    const int64_t elements = direct ? s.padded : s.piece;
    torch::Tensor host = pool_->take(elements, comm_options().device(torch::kCPU));
    state_file_->read_range(values_field_, s.shard_offset, s.piece, host.data_ptr());
    piece = host;
    if (!comm_device_.is_cpu()) {
      piece = pool_->take(elements, comm_options());
      piece.copy_(host);
      pool_->give(host);
    }
  } else {
    piece = gather_source().detach().narrow(0, s.shard_offset, s.piece);
  }
  // Narrower than the parameters (ZeroOptions::cast_gather): rounded here, widened on arrival.
  // (Never when direct: read in the parameters' dtype to be gathered in it.)
  g.narrowed = !exact && piece.scalar_type() != s.gather_dtype;
  g.keep = !exact;
  // qwZ: int8 blocks and their scales are sent instead, and dequantized into the gather dtype.
  g.quantized = zero_.quantized_weights() && !exact && s.group != nullptr;
  if (g.quantized) {
    g.values_dtype = g.narrowed ? s.gather_dtype : piece.scalar_type();
    const auto bytes = piece.options().dtype(torch::kUInt8);
    const int64_t q = quantized_bytes(s.piece);
    g.piece = pool_->take(q, bytes);
    quantize_blocks(piece, g.piece);
    if (params_in_file_) pool_->give(piece);
  } else if (g.narrowed) {
    g.piece = pool_->take(s.piece, piece.options().dtype(s.gather_dtype));
    g.piece.copy_(piece);
    if (params_in_file_) pool_->give(piece);
  } else {
    g.piece = piece;
  }
  g.own_piece = !direct && (g.narrowed || params_in_file_ || g.quantized);
  g.gathered = direct ? g.piece : pool_->take(g.piece.numel() * s.members, g.piece.options());
  g.buffer_bytes = tensor_bytes(g.gathered) + (g.own_piece ? tensor_bytes(g.piece) : 0);
  buffer_bytes_ += g.buffer_bytes;
  note_gather_peaks();
  gather_bytes_sent_ += tensor_bytes(g.piece);
  gather_bytes_uncast_ += tensor_bytes(piece);
  if (!direct) reduce_thread_.drain();  // the group's collectives in one order on every replica
  std::optional<TrafficLabel> label;    // a step's gathers (not gather_all's)
  if (!exact) label.emplace(kZeroTrafficLabels[gather_for_backward_ ? 1 : 0]);
  g.start_us = CollectiveLog::now_us();
  if (C10dGroup* dp = s.group) {
    g.wait = dp->all_gather_start(g.piece, g.gathered);
  } else {
    if (!direct) g.gathered.copy_(g.piece);
    g.wait = [] {};
  }
  g.state = Residency::kGathering;
}

void ShardedOptimizer::wait_segment(size_t k) {
  Gather& g = gathers_[k];
  if (g.state == Residency::kWhole) return;
  start_gather_segment(k);
  g.wait();
  if (log_) {
    log_->finished(CollectiveKind::kAllGather, stage_of_segment(k), g.start_us,
                   tensor_bytes(g.piece));
  }
  torch::NoGradGuard no_grad;
  const Segment& s = segments_[k];
  const torch::Tensor& first = parameters_[s.parameters.front()];
  if (g.quantized) dequantize_gathered(k, g);
  if (g.keep && !g.from_secondary) keep_secondary(k, g.gathered);  // hpZ
  // The buffer the parameters point into: the gathered one, or its widening (a narrowed gather)
  // or copy on the parameters' device (gathered on the host for a GPU).
  g.wait = nullptr;  // the collective's hold on the buffers goes with it
  auto lease = std::make_shared<Lease>();
  lease->pool = pool_;
  lease->keep = g.keep;
  if (g.gathered.scalar_type() != first.scalar_type() || g.gathered.device() != first.device()) {
    lease->buffer = pool_->take(s.padded, first.options());
    lease->buffer.copy_(g.gathered);
    pool_->give(g.gathered);
  } else {
    lease->buffer = g.gathered;
  }
  if (g.own_piece) pool_->give(g.piece);
  g.gathered = torch::Tensor();
  g.piece = torch::Tensor();
  for (size_t q : s.parameters) {
    const torch::Tensor& p = parameters_[q];
    point_into(p, lease, offsets_[q] - s.start);
    whole_bytes_ += tensor_bytes(p);
  }
  buffer_bytes_ -= g.buffer_bytes;  // it landed: whole now, no longer in flight
  note_gather_peaks();
  const bool narrowed = g.narrowed;
  g = Gather{};
  g.narrowed = narrowed;
}

void ShardedOptimizer::release_segment(size_t k) {
  Gather& g = gathers_[k];
  if (g.state == Residency::kGathering) {
    g.wait();  // nothing may land in a dropped buffer
    g.wait = nullptr;
    pool_->give(g.gathered);
    if (g.own_piece) pool_->give(g.piece);
    g.gathered = torch::Tensor();
    g.piece = torch::Tensor();
  }
  buffer_bytes_ -= g.buffer_bytes;
  if (g.state == Residency::kWhole) {
    for (size_t q : segments_[k].parameters) {
      free_storage(parameters_[q]);
      whole_bytes_ -= tensor_bytes(parameters_[q]);
    }
  }
  g = Gather{};
  g.state = Residency::kFreed;
}

void ShardedOptimizer::note_gather_peaks() {
  if (by_layer_) {
    // A gathered buffer becomes the parameters' storage: what is whole and what is on its way
    // are one peak (the memory model's "gathered params" by layer), the buffers none apart.
    peak_whole_bytes_ = std::max(peak_whole_bytes_, whole_bytes_ + buffer_bytes_);
  } else {
    peak_whole_bytes_ = std::max(peak_whole_bytes_, whole_bytes_);
    peak_buffer_bytes_ = std::max(peak_buffer_bytes_, buffer_bytes_);
  }
}

int64_t ShardedOptimizer::parameter_bytes() const {
  int64_t total = 0;
  for (const torch::Tensor& p : parameters_) {
    total += stage_ == 3 ? static_cast<int64_t>(p.storage().nbytes()) : tensor_bytes(p);
  }
  // Stage 3's shard where the gathers read it (offloaded, the host's master copy is host_bytes),
  // and hpZ's copies.
  return stage_ == 3 ? total + tensor_bytes(gather_source()) + secondary_bytes_ : total;
}

// ---- By layer ---------------------------------------------------------------------------------

int ShardedOptimizer::unit_of(int j, std::size_t l) const {
  const auto found = unit_of_layer_.find({j, static_cast<int>(l)});
  return found == unit_of_layer_.end() ? -1 : found->second;
}

void ShardedOptimizer::start_unit(int u) {
  for (size_t k : units_[static_cast<size_t>(u)].segments) start_gather_segment(k);
}

void ShardedOptimizer::release_unit(int u) {
  for (size_t k : units_[static_cast<size_t>(u)].segments) release_segment(k);
}

void ShardedOptimizer::make_persistent_whole() {
  for (size_t k : persistent_) wait_segment(k);
}

void ShardedOptimizer::begin_step(const schedule::Schedule& s, int r,
                                  ::pipetrain::Checkpoint checkpoint) {
  if (!by_layer_) return;
  take_parameters();  // a step run without zero_grad() first
  const auto key = std::make_tuple(&s, r, checkpoint);
  auto found = plans_.find(key);
  if (found == plans_.end()) {
    // units_ are ordered by stage, then layer: the plan's ids are their indices.
    std::map<int, int> counts;
    std::vector<int64_t> bytes;
    for (const Unit& unit : units_) {
      ++counts[unit.stage];
      bytes.push_back(unit.bytes);
    }
    const schedule::UnitPolicy policy{zero_.prefetch_bytes(), zero_.max_live_bytes(),
                                      zero_.max_reuse_distance()};
    const schedule::UnitIds ids = schedule::unit_ids(counts);
    std::vector<char> backward;
    const std::vector<schedule::UnitId> uses =
        schedule::unit_uses(s, r, ids, checkpoint, &backward);
    found = plans_.emplace(key, schedule::plan_units(uses, bytes, policy)).first;
    plans_backward_[key] = std::move(backward);
  }
  plan_ = found->second;
  plan_backward_ = plans_backward_[key];
  next_use_ = 0;
  gather_for_backward_ = false;
  for (size_t k : persistent_) start_gather_segment(k);
  for (schedule::UnitId x : plan_.first) {
    gather_for_backward_ = use_is_backward(x, 0);
    start_unit(x);
  }
}

void ShardedOptimizer::acquire(int j, std::size_t l) {
  if (!by_layer_) return;
  make_persistent_whole();
  const int u = unit_of(j, l);
  if (u < 0) return;
  TORCH_INTERNAL_ASSERT(
      next_use_ < plan_.uses.size() && plan_.uses[next_use_] == u, "ZeRO-3 on rank ", rank_,
      ": stage ", j, " uses layer ", l, " (unit ", u, ") where the plan has use ", next_use_,
      " of ", plan_.uses.size(),
      next_use_ < plan_.uses.size() ? c10::str(", unit ", plan_.uses[next_use_]) : std::string());
  use_of_unit_[static_cast<size_t>(u)] = next_use_++;
  gather_for_backward_ = use_is_backward(u, next_use_ - 1);
  start_unit(u);  // nothing when whole or on its way
  for (size_t k : units_[static_cast<size_t>(u)].segments) wait_segment(k);
}

void ShardedOptimizer::release(int j, std::size_t l) {
  if (!by_layer_) return;
  const int u = unit_of(j, l);
  if (u < 0) return;
  const schedule::UnitStep& step = plan_.after[use_of_unit_[static_cast<size_t>(u)]];
  for (schedule::UnitId x : step.release) release_unit(x);
  for (schedule::UnitId x : step.gather) {
    gather_for_backward_ = use_is_backward(x, next_use_);
    start_unit(x);
  }
  if (!step.release.empty()) return_freed_memory();
}

}  // namespace pipetrain::train
