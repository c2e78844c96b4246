// ZeRO's gradients (pipetrain/train/sharded_optimizer.h): [1] the reduce-scatters by segment
// (at the step's end, started early with the overlap, or streamed per micro-batch) and [2] the
// shard's norm and scaling.
//
//   streamed (stages 2, 3):   gradients(j, l) of micro-batch i --> pack the layer's segments
//                             --> reduce-scatter started, 2 in flight at most --> piece added
//                             to the shard's gradient
//   at the step's end:        the other segments, packed and reduce-scattered 2 deep; stage 1
//                             (aliased) writes each received piece into the slices of .grad()
//                             it is made of, and the inner optimizer steps those
#include "pipetrain/train/sharded_optimizer.h"

#include <algorithm>
#include <map>

#include <torch/torch.h>

#include "pipetrain/base/check.h"
#include "pipetrain/stage/tensor_bytes.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain::train {
namespace {

// The squares of `values` summed in float64, a million elements at a time (a float64 copy of a
// whole embedding's gradient would be a buffer as large as the parameter).
double sum_of_squares(const torch::Tensor& values) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  double total = 0;
  const torch::Tensor flat = values.reshape({-1});
  for (int64_t at = 0; at < flat.numel(); at += kChunk) {
    const torch::Tensor chunk = flat.narrow(0, at, std::min(kChunk, flat.numel() - at));
    total += chunk.to(torch::kDouble).square().sum().item<double>();
  }
  return total;
}

}  // namespace

torch::Tensor& ShardedOptimizer::reduced_gradient() {
  if (!staged_) return shard_grad_;
  if (!comm_grad_.defined()) comm_grad_ = torch::zeros({shard_size_}, comm_options());
  return comm_grad_;
}

torch::Tensor ShardedOptimizer::pack_gradients(size_t k,
                                               const std::function<torch::Tensor(size_t q)>& grad,
                                               bool* pooled) const {
  const Segment& s = segments_[k];
  *pooled = true;
  if (s.parameters.size() == 1 && parameters_[s.parameters.front()].numel() == s.padded) {
    torch::Tensor g = grad(s.parameters.front());
    if (g.defined() && g.is_contiguous() && g.scalar_type() == comm_options().dtype() &&
        g.device() == comm_device_) {
      *pooled = false;
      return g.detach().view({-1});
    }
    torch::Tensor flat = pool_->take(s.padded, comm_options());
    if (g.defined()) {
      flat.copy_(g.detach().reshape({-1}));
    } else {
      flat.zero_();
    }
    return flat;
  }
  torch::Tensor flat = pool_->take(s.padded, comm_options());
  flat.zero_();
  for (size_t q : s.parameters) {
    const torch::Tensor g = grad(q);
    if (!g.defined()) continue;
    flat.narrow(0, offsets_[q] - s.start, parameters_[q].numel()).copy_(g.detach().reshape({-1}));
  }
  return flat;
}

ShardedOptimizer::InFlight ShardedOptimizer::start_reduce_scatter(size_t k, torch::Tensor flat,
                                                                  bool add, bool pooled_flat) {
  const Segment& s = segments_[k];
  InFlight r;
  r.segment = k;
  r.flat = std::move(flat);
  r.add = add;
  // One replica with the gradient in the file: the piece is the packed segment itself, written
  // (or added) from there, with no copy.
  const bool direct = grads_in_file_ && s.group == nullptr;
  const bool own_piece = !direct && (add || shard_grad_.defined() == false);
  r.piece = direct      ? r.flat.narrow(0, 0, s.piece)
            : own_piece ? pool_->take(s.piece, comm_options())
                        : reduced_gradient().narrow(0, s.shard_offset, s.piece);
  r.own_piece = own_piece;
  r.pooled_flat = pooled_flat;
  // Its buffers: the packed segment (a streamed gradient reduced in place too: it outlives its
  // hand-over; an accumulated .grad() is counted as gradients), and the piece where it is one of
  // its own.
  r.bytes =
      (pooled_flat || add ? tensor_bytes(r.flat) : 0) + (own_piece ? tensor_bytes(r.piece) : 0);
  reduce_buffer_bytes_now_ += r.bytes;
  reduce_buffer_bytes_ = std::max(reduce_buffer_bytes_, reduce_buffer_bytes_now_);
  r.start_us = CollectiveLog::now_us();
  if (C10dGroup* dp = s.group) {
    TrafficLabel label(kZeroTrafficLabels[2]);
    if (host_group_) {  // qgZ: two quantized all-to-alls, done before this returns
      quantized_reduce_scatter(r.flat, r.piece);
      r.wait = [] {};
    } else {
      r.wait = dp->reduce_scatter_sum_start(r.flat, r.piece);
    }
  } else {
    if (!direct) r.piece.copy_(r.flat.narrow(0, s.member * s.piece, s.piece));
    r.wait = [] {};
  }
  return r;
}

void ShardedOptimizer::finish_reduce_scatter(InFlight& r) {
  r.wait();
  r.wait = nullptr;  // the collective's hold on the buffers goes with it
  reduce_buffer_bytes_now_ -= r.bytes;
  const Segment& s = segments_[r.segment];
  if (log_)
    log_->finished(CollectiveKind::kReduceScatter, s.stage, r.start_us, tensor_bytes(r.flat));
  torch::NoGradGuard no_grad;
  if (grads_in_file_) {
    add_to_file_gradient(r.segment, r.piece, /*overwrite=*/!r.add);
  } else if (r.add) {
    reduced_gradient().narrow(0, s.shard_offset, s.piece).add_(r.piece);
  } else if (!shard_grad_.defined()) {
    // Stage 1, aliased: the received sums go into the slices of .grad() this replica steps.
    for (size_t i = s.first_slice; i < s.end_slice; ++i) {
      const Slice& slice = slices_[i];
      const torch::Tensor& p = parameters_[slice.parameter];
      if (!p.grad().defined()) {
        p.mutable_grad() = torch::zeros_like(p);
      } else if (!p.grad().is_contiguous()) {
        p.mutable_grad() = p.grad().contiguous();
      }
      torch::Tensor grad = p.grad().view({-1}).narrow(0, slice.parameter_offset, slice.length);
      grad.copy_(r.piece.narrow(0, slice.shard_offset - s.shard_offset, slice.length));
      parts_[i].mutable_grad() = grad;
    }
  }
  if (r.pooled_flat) pool_->give(r.flat);
  if (r.own_piece) pool_->give(r.piece);
  r.flat = torch::Tensor();
  r.piece = torch::Tensor();
}

void ShardedOptimizer::start_reduce(size_t segment) {  // [1], one segment ahead
  PIPETRAIN_CHECK_INPUT(segment < segments_.size(), "ZeRO segment ", segment, " of ",
                        segments_.size());
  if (reduce_started_.size() < segments_.size()) {
    reduce_started_.resize(segments_.size(), 0);
    started_.resize(segments_.size());
  }
  if (reduce_started_[segment]) return;
  reduce_started_[segment] = 1;
  // Here, not on the thread: it may allocate the reduced gradient the step reads.
  if (shard_grad_.defined()) reduced_gradient();
  auto launch = [this, segment]() {
    torch::NoGradGuard no_grad;  // per thread
    bool pooled = true;
    torch::Tensor flat = pack_gradients(
        segment, [this](size_t q) { return parameters_[q].grad(); }, &pooled);
    started_[segment] = start_reduce_scatter(segment, std::move(flat), /*add=*/false, pooled);
  };
  // On a GPU the pack is an asynchronous copy on the stream: here, after what the thread has.
  reduce_thread_.submit_or_run_here(std::move(launch), /*run_here=*/!comm_device_.is_cpu());
}

void ShardedOptimizer::gradients(int j, std::size_t l, const std::vector<torch::Tensor>& parameters,
                                 std::vector<torch::Tensor>& grads) {
  if (!streams_) return;
  const auto found = streamed_of_layer_.find({j, static_cast<int>(l)});
  if (found == streamed_of_layer_.end()) return;
  torch::NoGradGuard no_grad;
  std::map<const void*, size_t> at;
  int64_t handed = 0;
  for (size_t p = 0; p < parameters.size(); ++p) {
    at[parameters[p].unsafeGetTensorImpl()] = p;
    handed += tensor_bytes(grads[p]);
  }
  streamed_gradient_peak_ = std::max(streamed_gradient_peak_, handed);
  for (size_t k : found->second) {
    // Two reductions in flight at most, their buffers included: the oldest lands first.
    while (streams_in_flight_.size() >= 2) {
      finish_reduce_scatter(streams_in_flight_.front());
      streams_in_flight_.pop_front();
    }
    bool pooled = true;
    torch::Tensor flat = pack_gradients(
        k,
        [&](size_t q) {
          const auto entry = at.find(parameters_[q].unsafeGetTensorImpl());
          if (entry == at.end()) return torch::Tensor();
          torch::Tensor g = std::move(grads[entry->second]);  // taken: not accumulated into .grad()
          grads[entry->second] = torch::Tensor();
          return g;
        },
        &pooled);
    streams_in_flight_.push_back(start_reduce_scatter(k, std::move(flat), /*add=*/true, pooled));
  }
  return_freed_memory();  // the layer's gradients are packed and gone
}

bool ShardedOptimizer::takes_gradient(int j, std::size_t l, const torch::Tensor& parameter) const {
  if (!streams_) return false;
  const auto found = streamed_of_layer_.find({j, static_cast<int>(l)});
  if (found == streamed_of_layer_.end()) return false;
  for (size_t k : found->second) {
    for (size_t q : segments_[k].parameters) {
      if (parameters_[q].unsafeGetTensorImpl() == parameter.unsafeGetTensorImpl()) return true;
    }
  }
  return false;
}

void ShardedOptimizer::finish_streams() {
  while (!streams_in_flight_.empty()) {
    finish_reduce_scatter(streams_in_flight_.front());
    streams_in_flight_.pop_front();
  }
}

void ShardedOptimizer::reduce_gradients() {  // [1]
  torch::NoGradGuard no_grad;
  finish_streams();
  if (reduce_started_.empty()) {
    // The segments that did not stream, packed and reduce-scattered two at a time.
    reduce_thread_.drain();  // the group's collectives in one order on every replica
    std::deque<InFlight> in_flight;
    auto finish_oldest = [&] {
      finish_reduce_scatter(in_flight.front());
      in_flight.pop_front();
    };
    for (size_t k = 0; k < segments_.size(); ++k) {
      if (segments_[k].streamed) continue;
      bool pooled = true;
      torch::Tensor flat = pack_gradients(
          k, [this](size_t q) { return parameters_[q].grad(); }, &pooled);
      in_flight.push_back(start_reduce_scatter(k, std::move(flat), /*add=*/false, pooled));
      if (in_flight.size() > 1) finish_oldest();
    }
    while (!in_flight.empty()) finish_oldest();
  } else {
    for (size_t k = 0; k < segments_.size(); ++k) {
      if (!segments_[k].streamed) start_reduce(k);  // those not started yet
    }
    finish_started_reductions();
  }
  if (grads_in_file_) {
    // A segment no reduction reached this step (none does in training): zeros, as in memory.
    for (size_t k = 0; k < segments_.size(); ++k) {
      if (!grad_written_[k]) {
        add_to_file_gradient(k, torch::zeros({segments_[k].piece}, state_options_), true);
      }
    }
  }
  if (staged_) {  // to the host (offload) or the shard's device; blocking: the step reads it next
    shard_grad_.copy_(comm_grad_);
    comm_grad_ = torch::Tensor();
  }
  if (stage_ >= 2) {
    // What the step accumulated in .grad() (the segments that did not stream), and the most one
    // layer handed over at once.
    step_gradient_bytes_ = train::gradient_bytes(parameters_) + streamed_gradient_peak_;
    for (torch::Tensor& p : parameters_) p.mutable_grad() = torch::Tensor();
  }
}

void ShardedOptimizer::post_started_collectives() {
  reduce_thread_.drain();
}

void ShardedOptimizer::finish_started_reductions() {
  reduce_thread_.drain();
  for (size_t k = 0; k < reduce_started_.size(); ++k) {
    if (reduce_started_[k]) finish_reduce_scatter(started_[k]);
  }
  reduce_started_.clear();
  started_.clear();
}

void ShardedOptimizer::add_to_file_gradient(size_t k, const torch::Tensor& piece, bool overwrite) {
  const Segment& s = segments_[k];
  // The in-memory shard's gradient is zeroed each step and added to (streamed pieces: 0 + x,
  // then old + x) or overwritten by the reduction (the step's end): the same values here.
  using Update = OptimizerStateFile::RangeUpdate;
  const torch::Tensor values = piece.narrow(0, 0, s.piece).contiguous();
  state_file_->update_range(grads_field_, s.shard_offset, s.piece, values,
                            overwrite          ? Update::kCopy
                            : grad_written_[k] ? Update::kAdd
                                               : Update::kAddOntoZeros);
  grad_written_[k] = 1;
}

void ShardedOptimizer::for_each_file_gradient_chunk(
    const std::function<void(const torch::Tensor&, const Slice&, int64_t at)>& f) const {
  constexpr int64_t kChunk = int64_t{1} << 20;  // sum_of_squares' chunks, from the slice's start
  torch::Tensor chunk =
      torch::empty({std::min<int64_t>(kChunk, std::max<int64_t>(shard_size_, 1))}, state_options_);
  for (const Slice& s : slices_) {
    for (int64_t at = 0; at < s.length; at += kChunk) {
      const int64_t n = std::min(kChunk, s.length - at);
      torch::Tensor values = chunk.narrow(0, 0, n);
      state_file_->read_range(grads_field_, s.shard_offset + at, n, values.data_ptr());
      for (double factor : grad_factors_) values.mul_(factor);
      f(values, s, at);
    }
  }
}

void ShardedOptimizer::for_each_slice_gradient(
    const std::function<void(const torch::Tensor&, const Slice&)>& f) const {
  if (grads_in_file_) {
    for_each_file_gradient_chunk(
        [&](const torch::Tensor& values, const Slice& s, int64_t) { f(values, s); });
    return;
  }
  for (size_t i = 0; i < slices_.size(); ++i) {
    const Slice& s = slices_[i];
    if (shard_grad_.defined()) {
      f(shard_grad_.narrow(0, s.shard_offset, s.length), s);
    } else if (parts_[i].grad().defined()) {
      f(parts_[i].grad(), s);
    }
  }
}

double ShardedOptimizer::local_grad_norm_squared() const {  // [2]
  double total = 0;
  if (grads_in_file_) {
    // Summed as sum_of_squares sums a slice in memory: its chunks into the slice's sum, then that
    // into the total (the same double additions in the same order).
    double slice = 0;
    for_each_file_gradient_chunk([&](const torch::Tensor& values, const Slice& s, int64_t at) {
      if (!s.counted) return;
      if (at == 0) slice = 0;
      slice += sum_of_squares(values);
      if (at + values.numel() == s.length) total += slice;
    });
    return total;
  }
  for_each_slice_gradient([&](const torch::Tensor& grad, const Slice& s) {
    if (s.counted) total += sum_of_squares(grad);
  });
  return total;
}

bool ShardedOptimizer::has_non_finite_gradient() const {
  bool found = false;
  for_each_slice_gradient([&](const torch::Tensor& grad, const Slice&) {
    if (!found) found = !torch::isfinite(grad).all().item<bool>();
  });
  return found;
}

void ShardedOptimizer::scale_gradients(double factor) {
  torch::NoGradGuard no_grad;
  if (grads_in_file_) {
    grad_factors_.push_back(factor);  // applied where the gradient is read, in order
    return;
  }
  if (shard_grad_.defined()) {
    shard_grad_.mul_(factor);
    return;
  }
  for_each_slice_gradient([&](const torch::Tensor& grad, const Slice&) {
    torch::Tensor g = grad;
    g.mul_(factor);
  });
}

}  // namespace pipetrain::train
