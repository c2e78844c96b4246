// ZeRO stages 1, 2 and 3 and the offload (pipetrain/train/sharded_optimizer.h). [n] cite the
// header's steps.
#include "pipetrain/train/sharded_optimizer.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include <torch/torch.h>

#include "pipetrain/base/check.h"
#include "pipetrain/runtime/distributed_pipe.h"
#include "pipetrain/runtime/gradient_reducer.h"
#include "pipetrain/stage/autocast_parameters.h"
#include "pipetrain/stage/precision.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain::train {
namespace {

// The name the inner optimizer's one parameter, the shard, goes by in a checkpoint form.
const char* const kShard = "shard";

int64_t bytes_of(const torch::Tensor& tensor) {
  return tensor.defined() ? tensor.numel() * static_cast<int64_t>(tensor.element_size()) : 0;
}

// Stage 3 frees a parameter's storage and allocates it again, leaving the tensor itself (shape,
// version counter, autograd identity) alone: modules, optimizers and the autograd graphs that
// saved it keep their handles, and see the values again once they are written back.
void free_storage(const torch::Tensor& p) {
  c10::StorageImpl* storage = p.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, p.device()));
  storage->set_nbytes(0);
}

void allocate_storage(const torch::Tensor& p) {
  c10::StorageImpl* storage = p.storage().unsafeGetStorageImpl();
  at::Allocator* allocator =
      storage->allocator() ? storage->allocator() : c10::GetAllocator(p.device().type());
  const auto bytes = static_cast<size_t>(bytes_of(p));
  storage->set_data_ptr_noswap(allocator->allocate(bytes));
  storage->set_nbytes(bytes);
}

// `values` into p's storage through a tensor of its own: a saved p's version does not change, so
// the graph that saved it runs its backward with the values written here.
void write_values(const torch::Tensor& p, const torch::Tensor& values) {
  torch::Tensor alias =
      torch::empty({0}, p.options()).set_(p.storage(), p.storage_offset(), p.sizes(), p.strides());
  alias.copy_(values.view(p.sizes()));
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(Distributed* distributed, std::vector<torch::Tensor> parameters,
                                   const std::vector<torch::Tensor>& counted,
                                   const std::string& optimizer, const OptimizerOptions& options,
                                   const ZeroOptions& zero,
                                   const std::vector<std::vector<torch::Tensor>>& segments,
                                   std::vector<int> segment_stages,
                                   const std::vector<torch::ScalarType>& segment_gather_dtypes)
    : distributed_(distributed),
      rank_(distributed ? distributed->rank() : 0),
      parameters_(unique_parameters(parameters)),
      segment_stages_(std::move(segment_stages)),
      replicas_(distributed ? distributed->layout().replicas : 1),
      replica_(distributed ? distributed->replica() : 0),
      name_(optimizer),
      stage_(zero.stage()),
      offload_(zero.offload()) {
  const int stage = stage_;
  PIPETRAIN_CHECK_INPUT(stage >= 1 && stage <= 3, "ZeRO stage must be 1, 2 or 3 (got ", stage, ")");
  PIPETRAIN_CHECK_INPUT(!parameters_.empty(), "ZeRO: rank ", rank_, " has no parameters to shard");
  const torch::ScalarType dtype = parameters_.front().scalar_type();
  const torch::Device device = parameters_.front().device();
  PIPETRAIN_CHECK_INPUT(device.is_cpu() || device.is_cuda(),
                        "ZeRO shards parameters on the CPU or a CUDA device; rank ", rank_,
                        " holds them on ", device);
  std::map<const void*, size_t> index;
  for (size_t q = 0; q < parameters_.size(); ++q) {
    const torch::Tensor& p = parameters_[q];
    PIPETRAIN_CHECK_INPUT(p.scalar_type() == dtype && p.is_floating_point() && p.device() == device,
                          "ZeRO shards parameters of one floating dtype on one device; rank ",
                          rank_, " holds ", p.scalar_type(), " on ", p.device(), " beside ", dtype,
                          " on ", device);
    // Stage 3 frees each parameter's storage: it must hold that parameter and nothing else.
    PIPETRAIN_CHECK_INPUT(stage != 3 || (p.is_contiguous() && p.storage_offset() == 0 &&
                                         static_cast<int64_t>(p.storage().nbytes()) == bytes_of(p)),
                          "ZeRO-3 frees each parameter's storage between uses, and a parameter of "
                          "rank ",
                          rank_, " (shape ", p.sizes(),
                          ") shares its storage with other tensors (a view); give every "
                          "parameter storage of its own, or use --zero 2");
    index[p.unsafeGetTensorImpl()] = q;
    total_ += p.numel();
  }
  // The segments' parameters, each once, all of them.
  std::vector<std::vector<size_t>> groups;
  if (segments.empty()) {
    groups.emplace_back();
    for (size_t q = 0; q < parameters_.size(); ++q) groups.back().push_back(q);
  } else {
    std::set<size_t> placed;
    for (const auto& segment : segments) {
      std::vector<size_t> group;
      for (const torch::Tensor& p : segment) {
        auto found = index.find(p.unsafeGetTensorImpl());
        PIPETRAIN_CHECK_INPUT(found != index.end() && placed.insert(found->second).second,
                              "ZeRO segments: a tensor that is not one of the parameters, or in "
                              "two segments");
        group.push_back(found->second);
      }
      groups.push_back(std::move(group));
    }
    PIPETRAIN_CHECK_INPUT(placed.size() == parameters_.size(), "ZeRO segments hold ", placed.size(),
                          " of the ", parameters_.size(), " parameters");
  }
  PIPETRAIN_CHECK_INPUT(
      segment_gather_dtypes.empty() || segment_gather_dtypes.size() == groups.size(),
      "ZeRO: ", segment_gather_dtypes.size(), " gather dtypes for ", groups.size(), " segments");
  offsets_.assign(parameters_.size(), 0);
  for (auto& group : groups) {
    Segment segment;
    segment.gather_dtype =
        segment_gather_dtypes.empty() ? dtype : segment_gather_dtypes[segments_.size()];
    PIPETRAIN_CHECK_INPUT(c10::isFloatingType(segment.gather_dtype) &&
                              c10::elementSize(segment.gather_dtype) <= c10::elementSize(dtype),
                          "ZeRO: segment ", segments_.size(), " would gather in ",
                          segment.gather_dtype, "; a floating dtype no wider than the parameters' ",
                          dtype, " is needed");
    segment.parameters = std::move(group);
    segment.start = flat_size_;
    int64_t elements = 0;
    for (size_t q : segment.parameters) {
      offsets_[q] = segment.start + elements;
      elements += parameters_[q].numel();
    }
    segment.piece = (elements + replicas_ - 1) / replicas_;
    segment.padded = segment.piece * replicas_;
    segment.shard_offset = shard_size_;
    flat_size_ += segment.padded;
    shard_size_ += segment.piece;
    segments_.push_back(std::move(segment));
  }
  if (segment_stages_.empty()) segment_stages_.assign(segments_.size(), -1);
  PIPETRAIN_CHECK_INPUT(segment_stages_.size() == segments_.size(),
                        "ZeRO: ", segment_stages_.size(), " segment stages for ", segments_.size(),
                        " segments");
  gathers_.resize(segments_.size());
  for (const torch::Tensor& p : parameters_) whole_bytes_ += bytes_of(p);
  peak_whole_bytes_ = whole_bytes_;

  // Under NCCL the collectives take the device's tensors; Gloo's run on host buffers. Without
  // replicas nothing is communicated: the "collectives" (copies) run where the shard lives, so
  // that an offloaded rank builds its flat buffers on the host, not on the device.
  const torch::Device state_device = offload_ ? torch::Device(torch::kCPU) : device;
  comm_device_ = group() == nullptr ? state_device : group()->collective_device(device);
  staged_ = offload_ || comm_device_ != state_device;

  torch::NoGradGuard no_grad;
  // The shard and its gradient: in pinned host memory when offloaded from a GPU, so that the
  // copies to and from the device can run without a staging buffer.
  const auto options_of = torch::TensorOptions()
                              .dtype(dtype)
                              .device(state_device)
                              .pinned_memory(offload_ && device.is_cuda());
  std::set<const void*> counts;
  for (const torch::Tensor& c : counted) counts.insert(c.unsafeGetTensorImpl());
  const torch::Tensor mask = padded_flat(
      [&](size_t q) {
        const torch::Tensor& p = parameters_[q];
        return torch::full({p.numel()}, counts.count(p.unsafeGetTensorImpl()) ? 1.0 : 0.0,
                           torch::TensorOptions().dtype(torch::kDouble).device(state_device));
      },
      torch::TensorOptions().dtype(torch::kDouble).device(state_device));
  shard_ = torch::zeros({shard_size_}, options_of);
  load_shard();
  shard_grad_ = torch::zeros({shard_size_}, options_of);
  counted_mask_ = shard_of(mask).clone();
  inner_ = make_optimizer(name_, {shard_}, options);
}

ShardedOptimizer::~ShardedOptimizer() = default;

C10dGroup* ShardedOptimizer::group() const {
  return distributed_ ? distributed_->data_parallel_group().get() : nullptr;
}

torch::Tensor ShardedOptimizer::gather_source() const {
  if (!staged_) return shard_;
  if (stage_ == 3) return device_shard_;
  // Offloaded under Gloo (or alone) the collectives run where the shard is: it is read as it
  // is. Otherwise a copy where they run; from pinned memory to a GPU it is not waited for (the
  // collective is ordered after it on the device).
  if (shard_.device() == comm_device_) return shard_;
  return shard_.to(comm_device_, /*non_blocking=*/shard_.is_pinned() && comm_device_.is_cuda(),
                   /*copy=*/true);
}

torch::Tensor ShardedOptimizer::padded_flat(const std::function<torch::Tensor(size_t)>& value,
                                            const torch::TensorOptions& options) const {
  torch::Tensor flat = torch::zeros({flat_size_}, options);
  for (size_t q = 0; q < parameters_.size(); ++q) {
    flat.narrow(0, offsets_[q], parameters_[q].numel()).copy_(value(q));
  }
  return flat;
}

torch::Tensor ShardedOptimizer::shard_of(const torch::Tensor& flat) const {
  std::vector<torch::Tensor> pieces;
  for (const Segment& s : segments_) {
    pieces.push_back(flat.narrow(0, s.start + replica_ * s.piece, s.piece));
  }
  return torch::cat(pieces);
}

torch::Tensor ShardedOptimizer::gather_flat(const torch::Tensor& shard, bool pinned) const {
  torch::Tensor flat = torch::empty({flat_size_}, shard.options().pinned_memory(pinned));
  reduce_thread_.drain();  // the group's collectives in one order on every replica
  C10dGroup* dp = group();
  for (const Segment& s : segments_) {
    const torch::Tensor mine = shard.narrow(0, s.shard_offset, s.piece).contiguous();
    torch::Tensor whole = flat.narrow(0, s.start, s.padded);
    if (dp) {
      dp->all_gather(mine, whole);
    } else {
      whole.copy_(mine);
    }
  }
  return flat;
}

void ShardedOptimizer::zero_grad() {
  finish_started_reductions();  // a skipped step's: nothing of them may land in this step
  for (torch::Tensor& p : parameters_) p.mutable_grad() = torch::Tensor();
  shard_grad_.zero_();
  take_parameters();
  peak_whole_bytes_ = whole_bytes_;
  peak_buffer_bytes_ = buffer_bytes_;
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
    if (segment_stages_[k] == stage || segment_stages_[k] < 0) found.push_back(k);
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
    if (segment_stages_[k] == stage) release_segment(k);
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
  const torch::Tensor piece = gather_source().detach().narrow(0, s.shard_offset, s.piece);
  // Narrower than the parameters (ZeroOptions::cast_gather): rounded here, widened on arrival.
  g.narrowed = !exact && piece.scalar_type() != s.gather_dtype;
  g.piece = g.narrowed ? piece.to(s.gather_dtype) : piece;
  g.gathered = torch::empty({s.padded}, g.piece.options());
  g.buffer_bytes = bytes_of(g.gathered) + (g.narrowed ? bytes_of(g.piece) : 0);
  buffer_bytes_ += g.buffer_bytes;
  peak_buffer_bytes_ = std::max(peak_buffer_bytes_, buffer_bytes_);
  gather_bytes_sent_ += bytes_of(g.piece);
  gather_bytes_uncast_ += bytes_of(piece);
  reduce_thread_.drain();  // the group's collectives in one order on every replica
  g.start_us = CollectiveLog::now_us();
  if (C10dGroup* dp = group()) {
    g.wait = dp->all_gather_start(g.piece, g.gathered);
  } else {
    g.gathered.copy_(g.piece);
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
    log_->finished(CollectiveKind::kAllGather, stage_of_segment(k), g.start_us, bytes_of(g.piece));
  }
  torch::NoGradGuard no_grad;
  const Segment& s = segments_[k];
  for (size_t q : s.parameters) {
    const torch::Tensor& p = parameters_[q];
    allocate_storage(p);
    write_values(p, g.gathered.narrow(0, offsets_[q] - s.start, p.numel()));
    whole_bytes_ += bytes_of(p);
  }
  peak_whole_bytes_ = std::max(peak_whole_bytes_, whole_bytes_);
  buffer_bytes_ -= g.buffer_bytes;
  const bool narrowed = g.narrowed;
  g = Gather{};
  g.narrowed = narrowed;
}

void ShardedOptimizer::release_segment(size_t k) {
  Gather& g = gathers_[k];
  if (g.state == Residency::kGathering) g.wait();  // nothing may land in a dropped buffer
  buffer_bytes_ -= g.buffer_bytes;
  if (g.state == Residency::kWhole) {
    for (size_t q : segments_[k].parameters) {
      free_storage(parameters_[q]);
      whole_bytes_ -= bytes_of(parameters_[q]);
    }
  }
  g = Gather{};
  g.state = Residency::kFreed;
}

int64_t ShardedOptimizer::parameter_bytes() const {
  int64_t total = 0;
  for (const torch::Tensor& p : parameters_) {
    total += stage_ == 3 ? static_cast<int64_t>(p.storage().nbytes()) : bytes_of(p);
  }
  // Stage 3's shard where the gathers read it (offloaded, the host's master copy is host_bytes).
  return stage_ == 3 ? total + bytes_of(staged_ ? device_shard_ : shard_) : total;
}

torch::Tensor ShardedOptimizer::flat_gradients() const {
  return padded_flat(
      [&](size_t q) {
        const torch::Tensor& grad = parameters_[q].grad();
        return grad.defined() ? grad.detach().reshape({-1}).to(comm_device_, shard_.scalar_type())
                              : torch::zeros({parameters_[q].numel()}, comm_options());
      },
      comm_options());
}

void ShardedOptimizer::start_reduce(size_t segment) {  // [1], one segment ahead
  PIPETRAIN_CHECK_INPUT(segment < segments_.size(), "ZeRO segment ", segment, " of ",
                        segments_.size());
  if (reduce_started_.size() < segments_.size()) {
    reduce_started_.resize(segments_.size(), 0);
    started_flat_.resize(segments_.size());
    started_wait_.resize(segments_.size());
    started_us_.resize(segments_.size());
  }
  if (reduce_started_[segment]) return;
  reduce_started_[segment] = 1;
  // Here, not on the thread: it may allocate the reduced gradient the step reads.
  torch::Tensor mine =
      reduced_gradient().narrow(0, segments_[segment].shard_offset, segments_[segment].piece);
  C10dGroup* dp = group();
  auto launch = [this, segment, mine, dp]() mutable {
    torch::NoGradGuard no_grad;  // per thread
    const Segment& s = segments_[segment];
    torch::Tensor flat = torch::zeros({s.padded}, comm_options());
    int64_t at = 0;
    for (size_t q : s.parameters) {
      const torch::Tensor& grad = parameters_[q].grad();
      const int64_t n = parameters_[q].numel();
      if (grad.defined()) flat.narrow(0, at, n).copy_(grad.detach().reshape({-1}));
      at += n;
    }
    started_us_[segment] = CollectiveLog::now_us();
    if (dp) {
      started_wait_[segment] = dp->reduce_scatter_sum_start(flat, mine);
    } else {
      mine.copy_(flat.narrow(0, replica_ * s.piece, s.piece));
      started_wait_[segment] = [] {};
    }
    started_flat_[segment] = flat;
  };
  // On a GPU the pack is an asynchronous copy on the stream: here, after what the thread has.
  reduce_thread_.submit_or_run_here(std::move(launch), /*run_here=*/!comm_device_.is_cpu());
}

void ShardedOptimizer::reduce_gradients() {  // [1]
  torch::NoGradGuard no_grad;
  if (reduce_started_.empty()) {
    const torch::Tensor flat = flat_gradients();
    reduce_buffer_bytes_ = bytes_of(flat);
    for (size_t k = 0; k < segments_.size(); ++k) {
      const Segment& s = segments_[k];
      torch::Tensor mine = reduced_gradient().narrow(0, s.shard_offset, s.piece);
      const double start_us = CollectiveLog::now_us();
      if (C10dGroup* dp = group()) {
        dp->reduce_scatter_sum(flat.narrow(0, s.start, s.padded), mine);
      } else {
        mine.copy_(flat.narrow(0, s.start + replica_ * s.piece, s.piece));
      }
      if (log_) {
        log_->finished(CollectiveKind::kReduceScatter, stage_of_segment(k), start_us,
                       s.padded * static_cast<int64_t>(flat.element_size()));
      }
    }
  } else {
    for (size_t k = 0; k < segments_.size(); ++k) start_reduce(k);  // those not started yet
    reduce_buffer_bytes_ = finish_started_reductions();  // every segment's flat, in flight together
  }
  if (staged_) {  // to the host (offload) or the shard's device; blocking: the step reads it next
    shard_grad_.copy_(comm_grad_);
    comm_grad_ = torch::Tensor();
  }
  if (stage_ >= 2) {
    step_gradient_bytes_ = train::gradient_bytes(parameters_);  // what the step accumulated
    for (torch::Tensor& p : parameters_) p.mutable_grad() = torch::Tensor();
  }
}

void ShardedOptimizer::post_started_collectives() {
  reduce_thread_.drain();
}

int64_t ShardedOptimizer::finish_started_reductions() {
  reduce_thread_.drain();
  int64_t flat_bytes = 0;
  for (size_t k = 0; k < reduce_started_.size(); ++k) {
    if (!reduce_started_[k]) continue;
    started_wait_[k]();
    flat_bytes += bytes_of(started_flat_[k]);
    if (log_) {
      log_->finished(CollectiveKind::kReduceScatter, stage_of_segment(k), started_us_[k],
                     bytes_of(started_flat_[k]));
    }
  }
  reduce_started_.clear();
  started_flat_.clear();
  started_wait_.clear();
  started_us_.clear();
  return flat_bytes;
}

double ShardedOptimizer::local_grad_norm_squared() const {  // [2]
  return (shard_grad_.to(torch::kDouble).square() * counted_mask_).sum().item<double>();
}

void ShardedOptimizer::scale_gradients(double factor) {
  torch::NoGradGuard no_grad;
  shard_grad_.mul_(factor);
}

void ShardedOptimizer::load_shard() {
  torch::NoGradGuard no_grad;
  shard_.copy_(shard_of(padded_flat([&](size_t q) { return parameters_[q].detach().reshape({-1}); },
                                    comm_options())));
  if (staged_ && stage_ == 3) device_shard_ = shard_.to(comm_device_, false, /*copy=*/true);
}

torch::TensorOptions ShardedOptimizer::comm_options() const {
  return torch::TensorOptions().dtype(shard_.scalar_type()).device(comm_device_);
}

torch::Tensor& ShardedOptimizer::reduced_gradient() {
  if (!staged_) return shard_grad_;
  if (!comm_grad_.defined()) comm_grad_ = torch::zeros({shard_size_}, comm_options());
  return comm_grad_;
}

void ShardedOptimizer::step() {  // [3]
  if (stage_ == 3) {
    // The shard is the truth; whatever is whole now would be stale after the step.
    release_all();
  } else {
    // The parameters are the truth (a restore may have written them since the last step).
    load_shard();
  }
  torch::NoGradGuard no_grad;
  shard_.mutable_grad() = shard_grad_;
  inner_->step();
  if (stage_ == 3) {  // gathered where a stage next computes
    // From pinned memory the copy need not be waited for: the next gather is ordered after it on
    // the device, and the host shard is not written before the next reduction's blocking copy.
    if (staged_) device_shard_.copy_(shard_, /*non_blocking=*/shard_.is_pinned());
    return;
  }
  const double start_us = CollectiveLog::now_us();
  // Gathered on the host for a GPU's parameters (offloaded, or Gloo): into pinned memory, so that
  // the copies into the parameters are queued on the device and the step returns without
  // waiting for them; the next step's kernels are ordered after them on the stream.
  const torch::Device device = parameters_.front().device();
  const bool to_device = comm_device_.is_cpu() && device.is_cuda();
  const torch::Tensor flat = gather_flat(gather_source(), /*pinned=*/to_device);
  if (log_) log_->finished(CollectiveKind::kAllGather, -1, start_us);
  for (size_t q = 0; q < parameters_.size(); ++q) {
    torch::Tensor& p = parameters_[q];
    p.copy_(flat.narrow(0, offsets_[q], p.numel()).view(p.sizes()), /*non_blocking=*/to_device);
  }
}

void ShardedOptimizer::set_learning_rate(double lr) {
  train::set_learning_rate(*inner_, lr);
}

double ShardedOptimizer::learning_rate() const {
  return train::learning_rate(*inner_);
}

void ShardedOptimizer::capture(Checkpoint& part, const NamedTensors& named) {
  Checkpoint shard_form;
  NamedTensors shard_name;
  shard_name.insert(kShard, shard_);
  capture_optimizer(shard_form, *inner_, shard_name);
  if (replica_ == 0) part.optimizer = shard_form.optimizer;
  auto fields = shard_form.optimizer_state.find(kShard);
  if (fields == shard_form.optimizer_state.end()) return;  // no step yet, on every replica alike
  std::map<std::string, torch::Tensor> whole;              // field -> the padded flat state
  for (const auto& [field, tensor] : fields->second) {
    if (field == "step") continue;
    whole[field] = gather_flat(tensor.to(comm_device_).contiguous());
  }
  if (replica_ != 0) return;
  std::map<const void*, size_t> index;
  for (size_t q = 0; q < parameters_.size(); ++q) index[parameters_[q].unsafeGetTensorImpl()] = q;
  for (const auto& item : named) {
    auto found = index.find(item.value().unsafeGetTensorImpl());
    if (found == index.end()) continue;
    const torch::Tensor& p = parameters_[found->second];
    auto& state = part.optimizer_state[item.key()];
    for (const auto& [field, flat] : whole) {
      // A copy of its own on the host (one copy from a GPU, a clone on the CPU).
      state[field] = flat.narrow(0, offsets_[found->second], p.numel())
                         .view(p.sizes())
                         .to(flat.options().device(torch::kCPU), false, /*copy=*/true);
    }
    auto step = fields->second.find("step");
    if (step != fields->second.end()) {
      state["step"] = step->second.to(step->second.options().device(torch::kCPU), false, true);
    }
  }
}

void ShardedOptimizer::restore(const Checkpoint& checkpoint, const NamedTensors& named) {
  if (checkpoint.optimizer_state.empty()) return;  // no step was taken before the save
  if (checkpoint.optimizer != name_) {
    throw CheckpointError("checkpoint holds '" + checkpoint.optimizer +
                          "' optimizer state but this run uses '" + name_ +
                          "'; resume with "
                          "--optimizer " +
                          checkpoint.optimizer);
  }
  // Each parameter's name, and its state in the checkpoint.
  std::vector<const std::map<std::string, torch::Tensor>*> states(parameters_.size(), nullptr);
  std::vector<std::string> names(parameters_.size());
  std::map<const void*, size_t> index;
  for (size_t q = 0; q < parameters_.size(); ++q) index[parameters_[q].unsafeGetTensorImpl()] = q;
  for (const auto& item : named) {
    auto found = index.find(item.value().unsafeGetTensorImpl());
    if (found == index.end()) continue;
    names[found->second] = item.key();
    auto state = checkpoint.optimizer_state.find(item.key());
    if (state != checkpoint.optimizer_state.end()) states[found->second] = &state->second;
  }
  size_t with_state = 0;
  for (const auto* state : states) with_state += state != nullptr;
  if (with_state == 0) return;
  for (size_t q = 0; q < parameters_.size(); ++q) {
    if (states[q] == nullptr) {
      throw CheckpointError("checkpoint has optimizer state for some parameters of rank " +
                            std::to_string(rank_) + " but not for '" + names[q] + "'");
    }
  }
  std::map<std::string, torch::Tensor> shard_state;
  for (const auto& [field, first] : *states.front()) {
    if (field == "step") {
      shard_state[field] = first.clone();
      continue;
    }
    torch::Tensor flat = torch::zeros({flat_size_}, first.options());
    for (size_t q = 0; q < parameters_.size(); ++q) {
      auto tensor = states[q]->find(field);
      if (tensor == states[q]->end() || tensor->second.sizes() != parameters_[q].sizes()) {
        throw CheckpointError("checkpoint optimizer state '" + field + "' of '" + names[q] +
                              "' is missing or does not have the parameter's shape");
      }
      flat.narrow(0, offsets_[q], parameters_[q].numel()).copy_(tensor->second.reshape({-1}));
    }
    shard_state[field] = shard_of(flat).to(shard_.device()).clone();
  }
  Checkpoint shard_form;
  shard_form.optimizer = name_;
  shard_form.optimizer_state[kShard] = std::move(shard_state);
  NamedTensors shard_name;
  shard_name.insert(kShard, shard_);
  restore_optimizer(shard_form, *inner_, shard_name);
}

int64_t ShardedOptimizer::state_bytes() const {
  return optimizer_state_bytes(*inner_);
}

int64_t ShardedOptimizer::gradient_bytes() const {
  return (offload_ ? 0 : bytes_of(shard_grad_)) + train::gradient_bytes(parameters_);
}

int64_t ShardedOptimizer::host_bytes() const {
  return offload_ ? bytes_of(shard_) + bytes_of(shard_grad_) + state_bytes() : 0;
}

ShardedOptimizer::Holdings ShardedOptimizer::holdings(
    const std::vector<torch::Tensor>& parameters) const {
  std::map<const void*, size_t> index;
  for (size_t q = 0; q < parameters_.size(); ++q) index[parameters_[q].unsafeGetTensorImpl()] = q;
  std::vector<size_t> mine;
  for (const torch::Tensor& p : unique_parameters(parameters)) {
    const auto found = index.find(p.unsafeGetTensorImpl());
    if (found != index.end()) mine.push_back(found->second);
  }
  Holdings h;
  // The last reduction's flat: on the host when offloaded without replicas (built where the
  // shard lives), else where the collectives run.
  const bool flat_on_host = offload_ && group() == nullptr;
  if (mine.size() == parameters_.size()) {
    h.parameters = parameter_bytes();
    h.gradients = gradient_bytes();
    h.optimizer_state = state_bytes();
    h.host = host_bytes() + (flat_on_host ? reduce_buffer_bytes_ : 0);
    h.reduce_buffers = flat_on_host ? 0 : reduce_buffer_bytes_;
    h.step_gradients = step_gradient_bytes_;
    return h;
  }
  // This replica's shard elements that belong to `mine`: each parameter's flat range against
  // this replica's piece of its segment.
  std::vector<const Segment*> segment_of(parameters_.size(), nullptr);
  for (const Segment& s : segments_) {
    for (size_t q : s.parameters) segment_of[q] = &s;
  }
  int64_t elements = 0;
  std::vector<torch::Tensor> subset;
  for (size_t q : mine) {
    const Segment& s = *segment_of[q];
    const int64_t piece_start = s.start + replica_ * s.piece;
    const int64_t lo = std::max(offsets_[q], piece_start);
    const int64_t hi = std::min(offsets_[q] + parameters_[q].numel(), piece_start + s.piece);
    elements += std::max<int64_t>(0, hi - lo);
    subset.push_back(parameters_[q]);
    h.parameters += stage_ == 3 ? static_cast<int64_t>(parameters_[q].storage().nbytes())
                                : bytes_of(parameters_[q]);
  }
  const double share = shard_size_ > 0 ? static_cast<double>(elements) / shard_size_ : 0.0;
  const auto part = [&](int64_t bytes) {
    return static_cast<int64_t>(std::llround(share * static_cast<double>(bytes)));
  };
  if (stage_ == 3) h.parameters += part(bytes_of(staged_ ? device_shard_ : shard_));
  h.gradients = train::gradient_bytes(subset) + (offload_ ? 0 : part(bytes_of(shard_grad_)));
  h.optimizer_state = part(state_bytes());
  h.host = part(host_bytes());
  // The flat and the step's full gradients hold every parameter's elements once (the flat with
  // its segments' padding): `mine`'s share of the elements.
  int64_t whole = 0;
  for (size_t q : mine) whole += parameters_[q].numel();
  const auto element_part = [&](int64_t bytes) {
    return total_ > 0 ? static_cast<int64_t>(std::llround(static_cast<double>(whole) / total_ *
                                                          static_cast<double>(bytes)))
                      : 0;
  };
  (flat_on_host ? h.host : h.reduce_buffers) += element_part(reduce_buffer_bytes_);
  h.step_gradients = element_part(step_gradient_bytes_);
  return h;
}

void check_reshard_after_forward(bool reshard_after_forward, int zero_stage) {
  PIPETRAIN_CHECK_INPUT(!reshard_after_forward || zero_stage == 3,
                        "--reshard-after-forward frees ZeRO-3's gathered parameters; it needs "
                        "--zero 3, got --zero ",
                        zero_stage);
}

std::set<const void*> narrowed_gather_parameters(const torch::nn::Module& model,
                                                 const ZeroOptions& zero, Precision precision) {
  if (!gathers_narrowed(zero, precision)) return {};
  return narrowable_parameters(model);
}

bool gathers_narrowed(const ZeroOptions& zero, Precision precision) {
  return zero.stage() == 3 && zero.cast_gather() && precision != Precision::kFloat32;
}

std::unique_ptr<ShardedOptimizer> make_pipe_sharded_optimizer(
    Distributed& distributed, DistributedPipe& pipe, const std::vector<torch::Tensor>& counted,
    const std::string& optimizer, const OptimizerOptions& options, const ZeroOptions& zero,
    bool overlap) {
  const int stage = zero.stage();
  check_reshard_after_forward(zero.reshard_after_forward(), stage);
  // Overlapped, or ZeRO-3: one segment per local stage, reduced when that stage's gradients are
  // final, and (stage 3) gathered around its actions. Under bf16/fp16 at stage 3, a stage's
  // parameters read only through autocast's casts form a segment of their own, gathered in the
  // compute dtype (ZeroOptions::cast_gather).
  const Precision precision = pipe.options().precision();
  const std::set<const void*> cast = narrowed_gather_parameters(*pipe.model(), zero, precision);
  std::vector<std::vector<torch::Tensor>> segments;
  std::vector<int> segment_stages;
  std::vector<torch::ScalarType> gather_dtypes;
  std::multimap<int, size_t> segments_of_stage;
  auto add_segment = [&](int stage_index, std::vector<torch::Tensor> tensors,
                         torch::ScalarType gather_dtype) {
    if (tensors.empty()) return;
    if (stage_index >= 0) segments_of_stage.emplace(stage_index, segments.size());
    gather_dtypes.push_back(gather_dtype);
    segments.push_back(std::move(tensors));
    segment_stages.push_back(stage_index);
  };
  // With the overlap, a stage's segment is cut into buckets of at most PipeOptions::bucket_bytes
  // (--bucket-size; a parameter larger than that is a bucket of its own), each reduce-scattered
  // on its own as the replicas' all-reduce is (runtime/gradient_reducer.h).
  const int64_t bucket_bytes =
      overlap ? pipe.options().bucket_bytes() : std::numeric_limits<int64_t>::max();
  auto add_buckets = [&](int stage_index, std::vector<torch::Tensor> tensors,
                         torch::ScalarType gather_dtype) {
    if (stage_index < 0) return add_segment(stage_index, std::move(tensors), gather_dtype);
    for (auto& bucket : cut_into_buckets(tensors, bucket_bytes)) {
      add_segment(stage_index, std::move(bucket), gather_dtype);
    }
  };
  if (overlap || stage == 3) {
    for (auto& [stage_index, tensors] : pipe.gradient_groups()) {
      const torch::ScalarType dtype = tensors.front().scalar_type();
      std::vector<torch::Tensor> kept, narrowed;
      for (torch::Tensor& t : tensors) {
        const bool narrow = stage_index >= 0 && cast.count(t.unsafeGetTensorImpl());
        (narrow ? narrowed : kept).push_back(std::move(t));
      }
      add_buckets(stage_index, std::move(kept), dtype);
      add_buckets(stage_index, std::move(narrowed), compute_dtype(precision));
    }
  }
  auto sharded =
      std::make_unique<ShardedOptimizer>(&distributed, pipe.parameters(), counted, optimizer,
                                         options, zero, segments, segment_stages, gather_dtypes);
  pipe.set_allreduce_gradients(false);
  ShardedOptimizer* shards = sharded.get();
  shards->set_collective_log(&pipe.collective_log());
  if (stage == 3) pipe.set_stage_parameters(shards, zero.reshard_after_forward());
  if (overlap) {
    pipe.set_stage_gradients_hook([shards, segments_of_stage](int j) {
      const auto [first, last] = segments_of_stage.equal_range(j);
      for (auto it = first; it != last; ++it) shards->start_reduce(it->second);
    });
  }
  return sharded;
}

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> parameters;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) parameters.push_back(p);
  }
  return optimizer_state_bytes(optimizer, parameters);
}

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer,
                              const std::vector<torch::Tensor>& parameters) {
  NamedTensors named;
  for (const auto& p : parameters) named.insert("p" + std::to_string(named.size()), p);
  Checkpoint form;
  capture_optimizer(form, optimizer, named);
  int64_t total = 0;
  for (const auto& [name, fields] : form.optimizer_state) {
    for (const auto& [field, tensor] : fields) total += bytes_of(tensor);
  }
  return total;
}

int64_t gradient_bytes(const std::vector<torch::Tensor>& parameters) {
  int64_t total = 0;
  for (const torch::Tensor& p : unique_parameters(parameters)) total += bytes_of(p.grad());
  return total;
}

}  // namespace pipetrain::train
