// DistributedPipe: this rank's stages, a C10dTransport, the shared Interpreter, and the
// cross-process steps [3]..[5] of include/pipetrain/runtime/distributed_pipe.h.
#include "pipetrain/runtime/distributed_pipe.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <chrono>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "pipetrain/base/check.h"
#include "pipetrain/data/batch.h"
#include "pipetrain/parallel/all_to_all.h"
#include "pipetrain/runtime/gradient_reducer.h"
#include "pipetrain/runtime/interpreter.h"
#include "pipetrain/runtime/scoped_threads.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/overlap.h"
#include "pipetrain/schedule/send_release.h"
#include "pipetrain/schedule/validate.h"
#include "pipetrain/stage/device.h"
#include "pipetrain/stage/microbatch.h"
#include "pipetrain/stage/stage_rng.h"

namespace pipetrain {

namespace {

// This rank's device: options.devices()[pipeline_rank] when the list is given (one per pipeline
// rank, as Pipe's one per rank), else `given`.
torch::Device rank_device(const PipeOptions& options, torch::Device given, int pipeline_rank,
                          int ranks) {
  const std::vector<torch::Device>& devices = options.devices();
  if (devices.empty()) return given;
  PIPETRAIN_CHECK_INPUT(static_cast<int>(devices.size()) == ranks, "devices lists ", devices.size(),
                        " devices but the job has ", ranks,
                        " pipeline ranks; give one device per pipeline rank");
  const torch::Device mine = devices[static_cast<size_t>(pipeline_rank)];
  PIPETRAIN_CHECK_INPUT(given == torch::Device(torch::kCPU) || given == mine, "pipeline rank ",
                        pipeline_rank, " is given device ", given, " and devices[", pipeline_rank,
                        "] = ", mine, "; give only one of them");
  return mine;
}

}  // namespace

DistributedPipe::DistributedPipe(Distributed& distributed, torch::nn::Sequential model,
                                 PipeOptions options, torch::Device device)
    : distributed_(distributed),
      model_(std::move(model)),
      options_(std::move(options)),
      device_(device) {
  const auto& o = options_;
  const int64_t layers = static_cast<int64_t>(model_->size());
  PIPETRAIN_CHECK_INPUT(layers >= 1, "the Sequential has no layers");
  PIPETRAIN_CHECK_INPUT(o.chunks() >= 1, "chunks must be at least 1 (got ", o.chunks(), ")");
  PIPETRAIN_CHECK_INPUT(o.virtual_stages() >= 1, "virtual_stages must be at least 1");
  check_offload_options(o);
  if (o.overlap_expert_exchanges()) {
    // parallel/lane.h: a recompute would wait for the RNG lock a paired forward holds while that
    // forward waits for the peers' forwards, whose own recomputes hold theirs; the tp group's
    // collectives have one copy; CUDA's autograd runs a backward on its device threads, where the
    // lane is not set.
    PIPETRAIN_CHECK_INPUT(o.checkpoint() == Checkpoint::kNever,
                          "overlap_expert_exchanges needs checkpoint never (got ",
                          to_string(o.checkpoint()),
                          "): a recompute beside a forward would wait for the RNG the forward "
                          "holds");
    PIPETRAIN_CHECK_INPUT(distributed_.tensor_parallel_group() == nullptr,
                          "overlap_expert_exchanges runs without tensor parallelism (tp ",
                          distributed_.layout().tensor_parallel,
                          "): both lanes would post the tp group's collectives");
    PIPETRAIN_CHECK_INPUT(device.is_cpu() && o.devices().empty(),
                          "overlap_expert_exchanges runs on CPU stages (device ", device,
                          "): CUDA runs a backward on its own threads, outside the lane");
  }
  const std::vector<int64_t> balance = stage_balance(o, layers);
  num_stages_ = static_cast<int>(balance.size());
  const int v = static_cast<int>(o.virtual_stages());
  PIPETRAIN_CHECK_INPUT(num_stages_ % v == 0, num_stages_,
                        " stages are not divisible by virtual_stages ", v);
  num_ranks_ = num_stages_ / v;
  PIPETRAIN_CHECK_INPUT(
      num_ranks_ == distributed_.layout().pipeline_ranks, num_stages_,
      " stages with virtual_stages ", v, " need ", num_ranks_, " pipeline ranks but the job has ",
      distributed_.layout().pipeline_ranks, " (WORLD_SIZE ", distributed_.world_size(),
      " = pipeline ranks x replicas); start ", num_ranks_ * distributed_.layout().replicas,
      " processes or change --stages");
  const schedule::Schedule& first = schedule_for(static_cast<int>(o.chunks()));
  stage_rank_ = first.stage_rank;
  device_ = rank_device(o, device_, distributed_.pipeline_rank(), num_ranks_);
  check_device_usable(device_);
  PIPETRAIN_CHECK_INPUT(o.threads_per_stage() >= 0, "threads_per_stage must be >= 0 (got ",
                        o.threads_per_stage(), ")");
  const std::chrono::milliseconds timeout = timeout_of(o);

  // This rank's stages; every rank walks all layers so names and first-layer indices agree.
  const auto named = model_->named_children();
  std::vector<torch::nn::AnyModule> modules(model_->begin(), model_->end());
  const uint64_t seed = at::detail::getDefaultCPUGenerator().current_seed();
  // Which stages use each parameter tensor (by identity): a tensor on two ranks is a tie.
  std::map<const void*, std::set<int>> holders;
  std::map<const void*, std::string> first_name;
  const int me = distributed_.pipeline_rank();
  int64_t layer = 0;
  for (int j = 0; j < num_stages_; ++j) {
    std::vector<StageLayer> stage_layers;
    const int first_layer = static_cast<int>(layer);
    const bool mine = stage_rank_[static_cast<size_t>(j)] == me;
    for (int64_t n = 0; n < balance[static_cast<size_t>(j)]; ++n, ++layer) {
      const std::string& name = named[static_cast<size_t>(layer)].key();
      auto& module = modules[static_cast<size_t>(layer)];
      for (const auto& param : module.ptr()->named_parameters()) {
        const void* key = param.value().unsafeGetTensorImpl();
        holders[key].insert(stage_rank_[static_cast<size_t>(j)]);
        first_name.emplace(key, name + "." + param.key());
      }
      if (!mine) continue;
      module.ptr()->to(device_);
      stage_layers.push_back({name, module});
      for (const auto& param : module.ptr()->named_parameters()) {
        named_.emplace_back(name + "." + param.key(), param.value());
        local_holders_[param.value().unsafeGetTensorImpl()].insert(j);
      }
    }
    if (mine) {
      stages_[j] = std::make_unique<Stage>(j, first_layer, std::move(stage_layers), device_,
                                           stage_seed(seed, j));
      stages_[j]->set_precision(o.precision(), j == num_stages_ - 1);
      stages_[j]->set_rank_stash(rank_stash_);
    }
  }
  std::set<const void*> seen;
  for (const auto& [name, tensor] : named_) {
    const void* key = tensor.unsafeGetTensorImpl();
    if (!seen.insert(key).second) continue;
    unique_.push_back(tensor);
    dense_.push_back(tensor);
    const auto& ranks = holders[key];
    if (ranks.size() > 1) {
      const std::string tie = first_name[key];
      ties_.emplace_back(
          distributed_.declare_tie(tie, std::vector<int>(ranks.begin(), ranks.end())), tensor);
    }
  }
  transport_ = distributed_.make_transport(stage_rank_, device_, timeout);
}

DistributedPipe::~DistributedPipe() = default;

const schedule::Schedule& DistributedPipe::schedule_for(int microbatches) {
  auto found = schedules_.find(microbatches);
  if (found != schedules_.end()) return found->second;
  schedule::Schedule s = training_schedule_for(options_, num_ranks_, num_stages_, microbatches);
  if (!options_.overlap_expert_exchanges()) {
    return schedules_.emplace(microbatches, std::move(s)).first->second;
  }
  schedule::ForwardBackwardPairs paired = schedule::pair_forwards_with_backwards(s);
  const schedule::Schedule& kept =
      schedules_.emplace(microbatches, std::move(paired.schedule)).first->second;
  pairs_[&kept] = std::move(paired.starts);
  return kept;
}

const std::vector<std::vector<int>>* DistributedPipe::released_for(const schedule::Schedule& s) {
  auto found = released_.find(&s);
  if (found == released_.end()) found = released_.emplace(&s, schedule::released_sends(s)).first;
  return &found->second;
}

torch::Tensor DistributedPipe::train_step(const torch::Tensor& input, const torch::Tensor& target,
                                          const LossFn& loss_fn) {
  PIPETRAIN_CHECK_INPUT(
      input.defined() && input.dim() >= 1 && target.defined() && target.size(0) == input.size(0),
      "train_step needs an input and a target with the same number of rows");
  return train_step(data::Batch(input, target), loss_fn);
}

torch::Tensor DistributedPipe::train_step(const data::Batch& batch, const LossFn& loss_fn) {
  data::check_batch(batch);
  PIPETRAIN_CHECK_INPUT(batch.inputs.size() == 1,
                        "DistributedPipe::train_step takes one input tensor, got ",
                        batch.inputs.size());
  // [1] Weights relative to the whole mini-batch: the replicas' gradients are summed. Context
  // parallelism: each member of a group takes its columns of the group's rows, weighing its
  // counted targets among the mini-batch's.
  const parallel::ContextParallel& cp = distributed_.context_parallel();
  const double total = cp.split() && !batch.targets.is_floating_point()
                           ? static_cast<double>(data::counted_targets(batch.targets))
                           : batch.total_weight();
  const auto [first, count] = replica_rows(batch.rows());
  const data::Batch mine = data::rows_of(batch, first, count);
  const std::vector<int64_t> sizes = microbatch_sizes(count, options_.chunks());
  const int m = static_cast<int>(sizes.size());
  const schedule::Schedule& s = schedule_for(m);
  last_ = &s;

  StepData data;
  data.num_microbatches = m;
  for (data::Microbatch& whole : data::split_batch(mine, sizes)) {
    const data::Microbatch part =
        cp.split() ? data::tokens_at(whole, context_parallel_columns(whole.inputs[0])) : whole;
    data.inputs.push_back({part.inputs[0].to(device_)});
    data.targets.push_back(part.target.to(device_));
    data.loss_weights.push_back(total > 0 ? part.weight / total : 0.0);
    data.layouts.push_back(std::move(part.layout));
  }
  data.loss_fn = &loss_fn;
  data.training = true;
  data.checkpoint = options_.checkpoint();
  data.offload = options_.offload_activations();
  data.start = std::chrono::steady_clock::now();
  collectives_.restart(CollectiveLog::now_us());

  // [2]
  const ScopedThreadCount thread_count(static_cast<int>(options_.threads_per_stage()));
  std::map<int, Stage*> stages = fresh_stages();
  RankResult result;
  const auto paired = pairs_.find(&s);
  PIPETRAIN_CHECK_INPUT(
      paired == pairs_.end() || (stage_parameters_ == nullptr && parameter_hooks_ == nullptr),
      "overlap_expert_exchanges runs without ZeRO-3's gathers and ZeRO 2/3's gradient hooks: "
      "both lanes would use them at once (ZeRO 0 or 1)");
  Interpreter interpreter(
      distributed_.pipeline_rank(), s, stages, *transport_, released_for(s),
      paired == pairs_.end()
          ? nullptr
          : &paired->second.at(static_cast<size_t>(distributed_.pipeline_rank())));
  transport_->reset_peak_buffer_bytes();
  // [4] overlapped: each stage's gradients start their sum after its last backward.
  const bool replicas = allreduce_gradients_ && distributed_.data_parallel_group() != nullptr;
  std::optional<GradientReducer> reducer;
  std::map<int, std::vector<torch::Tensor>> final_at;  // stage -> the tensors final after it
  const std::set<const void*> after_schedule = summed_after_schedule();  // final after [3]
  if (replicas && options_.overlap_gradient_reduction()) {
    reducer.emplace(distributed_.data_parallel_group(), options_.bucket_bytes(), &collectives_);
    // A tensor two local stages share (a tie within the rank) is final after the later one.
    std::map<int, size_t> last_backward = s.last_gradient_actions(distributed_.pipeline_rank());
    for (const torch::Tensor& tensor : dense_) {
      if (after_schedule.count(tensor.unsafeGetTensorImpl())) continue;
      int owner = -1;
      for (int j : local_holders_.at(tensor.unsafeGetTensorImpl())) {
        if (owner < 0 || last_backward[j] > last_backward[owner]) owner = j;
      }
      final_at[owner].push_back(tensor);
    }
    data.on_stage_gradients = [&](int j) {
      const auto found = final_at.find(j);
      if (found != final_at.end()) reducer->start(found->second, j);
    };
  } else if (!allreduce_gradients_ && stage_gradients_hook_ &&
             options_.overlap_gradient_reduction()) {
    data.on_stage_gradients = stage_gradients_hook_;
  }
  if (stage_parameters_) {
    auto plan = residency_.find(&s);
    if (plan == residency_.end()) {
      plan = residency_
                 .emplace(&s, schedule::parameter_residency(s, distributed_.pipeline_rank(),
                                                            reshard_after_forward_))
                 .first;
    }
    data.parameters = stage_parameters_;
    data.residency = &plan->second;
  }
  if (parameter_hooks_) {
    parameter_hooks_->begin_step(s, distributed_.pipeline_rank(), options_.checkpoint());
  }
  // The expert exchanges' intervals of this step, against the actions' (parallel/all_to_all.h).
  parallel::record_all_to_all_intervals(true);
  interpreter.run(data, result);
  step_transport_stats_ = transport_->stats();
  events_ = std::move(result.events);
  const std::vector<parallel::LaneInterval> exchanges = parallel::take_all_to_all_intervals();
  parallel::record_all_to_all_intervals(false);  // none kept between steps
  if (!exchanges.empty()) {
    std::vector<parallel::LaneInterval> busy;
    for (const ActionEvent& event : events_) {
      if (!schedule::is_compute(event.action.op)) continue;
      busy.push_back(parallel::LaneInterval{
          event.lane, data.start + std::chrono::microseconds(static_cast<int64_t>(event.start_us)),
          data.start + std::chrono::microseconds(static_cast<int64_t>(event.end_us))});
    }
    parallel::add_exposed_all_to_all_seconds(parallel::exposed_seconds(exchanges, busy));
  }
  // [3] first, so that every ZeRO stage sums a tie's four copies in one order (ZeRO 1-3 reduce a
  // tie's gradient, summed over its holders, over the replicas after the step): the same bits.
  // The same for sequence parallelism's shares over the tensor-parallel group.
  for (const auto& [name, tensor] : ties_) distributed_.allreduce_tie(name, {tensor});
  distributed_.allreduce_tensor_parallel_gradients(tensor_parallel_summed_);
  // [4] Exposed: from the tie sums until the replicas' sums are in the gradients, either way.
  exposed_reduce_seconds_ = 0;
  reduce_buckets_ = 0;
  reduce_buffer_bytes_ = 0;
  if (replicas) {
    const auto begin = std::chrono::steady_clock::now();
    if (reducer) {
      std::vector<torch::Tensor> after;  // the tensors final only after [3], each once
      for (const torch::Tensor& tensor : dense_) {
        if (after_schedule.count(tensor.unsafeGetTensorImpl())) after.push_back(tensor);
      }
      if (!after.empty()) reducer->start(after);
      reduce_buckets_ = reducer->buckets_started();
      reduce_buffer_bytes_ = reducer->pending_bytes();
      reducer->finish();
    } else {
      const double start_us = CollectiveLog::now_us();
      reduce_buffer_bytes_ = distributed_.allreduce_gradients(dense_);
      collectives_.finished(CollectiveKind::kAllReduce, -1, start_us, reduce_buffer_bytes_);
    }
    // The experts' sum after the others' (their buffers are not in flight together).
    reduce_buffer_bytes_ =
        std::max(reduce_buffer_bytes_, distributed_.allreduce_expert_gradients(expert_parameters_));
    exposed_reduce_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  }
  // [5]
  std::optional<double> replica_loss;
  if (stages_.count(num_stages_ - 1)) {
    double sum = 0;
    for (const auto& loss : result.losses) sum += loss.item<double>();
    replica_loss = sum;
  }
  const double loss = distributed_.broadcast_loss(replica_loss);
  // Every rank took every message of the step before that collective: the sends are complete,
  // and the next step starts holding none (what the memory model assumes).
  transport_->flush();
  return torch::tensor(loss, torch::kFloat64);
}

void DistributedPipe::set_expert_parameters(std::vector<torch::Tensor> tensors) {
  std::set<const void*> experts;
  for (const torch::Tensor& tensor : tensors) experts.insert(tensor.unsafeGetTensorImpl());
  dense_.clear();
  for (const torch::Tensor& tensor : unique_) {
    if (!experts.count(tensor.unsafeGetTensorImpl())) dense_.push_back(tensor);
  }
  expert_parameters_ = std::move(tensors);
}

void DistributedPipe::set_parameter_hooks(StageParameterHooks* hooks) {
  parameter_hooks_ = hooks;
  for (auto& [j, stage] : stages_) {
    stage->clear();
    stage->set_parameter_hooks(hooks);
  }
}

std::vector<std::vector<torch::Tensor>> DistributedPipe::stage_layer_parameters(int j) const {
  const auto found = stages_.find(j);
  PIPETRAIN_CHECK_INPUT(found != stages_.end(), "stage ", j, " is not held by pipeline rank ",
                        distributed_.pipeline_rank());
  std::vector<std::vector<torch::Tensor>> layers;
  for (const StageLayer& layer : found->second->layers()) {
    layers.push_back(layer.module.ptr()->parameters());
  }
  return layers;
}

std::set<const void*> DistributedPipe::summed_after_schedule() const {
  std::set<const void*> after;
  for (const auto& [name, tensor] : ties_) after.insert(tensor.unsafeGetTensorImpl());
  for (const torch::Tensor& tensor : tensor_parallel_summed_) {
    after.insert(tensor.unsafeGetTensorImpl());
  }
  return after;
}

std::vector<std::pair<int, std::vector<torch::Tensor>>> DistributedPipe::gradient_groups() const {
  // A tie across ranks and a tp-summed tensor have their final gradient only after [3].
  const std::set<const void*> after_schedule = summed_after_schedule();
  std::map<int, std::vector<torch::Tensor>> by_stage;
  for (const torch::Tensor& tensor : unique_) {
    const std::set<int>& stages = local_holders_.at(tensor.unsafeGetTensorImpl());
    const bool one_stage =
        stages.size() == 1 && !after_schedule.count(tensor.unsafeGetTensorImpl());
    by_stage[one_stage ? *stages.begin() : -1].push_back(tensor);
  }
  std::vector<std::pair<int, std::vector<torch::Tensor>>> groups;
  for (auto& [stage, tensors] : by_stage) {
    if (stage >= 0) groups.emplace_back(stage, std::move(tensors));
  }
  if (by_stage.count(-1)) groups.emplace_back(-1, std::move(by_stage[-1]));
  return groups;
}

std::pair<int64_t, int64_t> DistributedPipe::replica_rows(int64_t rows) const {
  // The members of a context-parallel group share their rows.
  const int replicas = distributed_.layout().replicas / distributed_.layout().context_parallel;
  PIPETRAIN_CHECK_INPUT(rows >= replicas, "a mini-batch of ", rows, " rows cannot be shared by ",
                        replicas, " replicas; use at least one row per replica");
  const std::vector<int64_t> shares = microbatch_sizes(rows, replicas);
  const int d = distributed_.data_replica();
  const int64_t offset = std::accumulate(shares.begin(), shares.begin() + d, int64_t{0});
  return {offset, shares[static_cast<size_t>(d)]};
}

torch::Tensor DistributedPipe::context_parallel_columns(const torch::Tensor& tokens) const {
  const parallel::ContextParallel& cp = distributed_.context_parallel();
  const int64_t width = tokens.dim() == 2 ? tokens.size(1) : 0;
  const int64_t multiple = cp.ulysses ? cp.size() : 2 * cp.size();
  PIPETRAIN_CHECK_INPUT(
      width > 0 && width % multiple == 0, "context parallelism over ", cp.size(), " ranks (",
      cp.ulysses ? "Ulysses" : "ring", ") cuts each row into ", multiple,
      " equal chunks, and a micro-batch's rows are ", width,
      " tokens wide: give a sequence length (and with documents a pad multiple) divisible by ",
      multiple);
  return cp.positions(width / cp.size());
}

std::map<int, Stage*> DistributedPipe::fresh_stages() {
  std::map<int, Stage*> stages;
  for (auto& [j, stage] : stages_) {
    stage->clear();
    stage->reset_accounting();
    stages[j] = stage.get();
  }
  rank_stash_->restart_peak();
  return stages;
}

torch::Tensor DistributedPipe::forward(const torch::Tensor& input,
                                       std::shared_ptr<const data::SequenceLayout> layout) {
  PIPETRAIN_CHECK_INPUT(input.defined() && input.dim() >= 1,
                        "forward needs an input with a batch dimension (dim 0)");
  PIPETRAIN_CHECK_INPUT(!layout || (layout->rows() == input.size(0) && input.dim() >= 2 &&
                                    input.size(1) == layout->width()),
                        "the sequence layout (", layout ? layout->describe() : "",
                        ") does not match the input ", input.sizes());
  PIPETRAIN_CHECK_INPUT(!distributed_.context_parallel().split(),
                        "DistributedPipe::forward under context parallelism is not built yet "
                        "(train_step is)");
  const auto [first, count] = replica_rows(input.size(0));
  const torch::Tensor mine = input.narrow(0, first, count);
  const std::vector<int64_t> sizes = microbatch_sizes(mine.size(0), options_.chunks());
  const int m = static_cast<int>(sizes.size());
  auto found = inference_.find(m);
  if (found == inference_.end()) {
    found =
        inference_.emplace(m, schedule::lower(schedule::forward_only(schedule_for(m), m))).first;
  }
  StepData data;
  data.num_microbatches = m;
  data.inputs = split_microbatches({mine.to(device_)}, sizes);
  if (layout) {
    int64_t at = first;
    for (int64_t size : sizes) {
      data.layouts.push_back(layout->slice(at, size, layout->width()));
      at += size;
    }
  }
  data.training = false;
  data.start = std::chrono::steady_clock::now();
  const ScopedThreadCount thread_count(static_cast<int>(options_.threads_per_stage()));
  std::map<int, Stage*> stages = fresh_stages();
  RankResult result;
  Interpreter interpreter(distributed_.pipeline_rank(), found->second, stages, *transport_,
                          released_for(found->second));
  interpreter.run(data, result);
  if (!stages_.count(num_stages_ - 1)) return torch::Tensor();
  std::vector<torch::Tensor> outputs = join_microbatches(result.outputs);
  PIPETRAIN_CHECK_INPUT(outputs.size() == 1, "the model returned ", outputs.size(),
                        " tensors; DistributedPipe::forward returns one");
  return outputs[0];
}

C10dTransport::Stats DistributedPipe::transport_stats() const {
  return transport_->stats();
}

std::vector<torch::Tensor> DistributedPipe::parameters() const {
  return unique_;
}

std::vector<std::pair<std::string, torch::Tensor>> DistributedPipe::named_parameters() const {
  return named_;
}

std::map<std::string, torch::Tensor> DistributedPipe::gather_parameters() {
  return distributed_.gather_named_parameters(named_);
}

const schedule::Schedule& DistributedPipe::schedule() const {
  PIPETRAIN_CHECK_INPUT(last_ || !schedules_.empty(), "no schedule built yet");
  return last_ ? *last_ : schedules_.begin()->second;
}

std::map<int, StageAccounting> DistributedPipe::stage_accounting() const {
  std::map<int, StageAccounting> result;
  for (const auto& [j, stage] : stages_) result[j] = stage->accounting();
  return result;
}

std::vector<int> DistributedPipe::local_stages() const {
  std::vector<int> stages;
  for (const auto& [j, stage] : stages_) stages.push_back(j);
  return stages;
}

std::map<int, torch::Tensor> DistributedPipe::stage_rng_states() const {
  std::map<int, torch::Tensor> states;
  for (const auto& [j, stage] : stages_) states[j] = stage->rng().state();
  return states;
}

void DistributedPipe::restore_stage_rng_states(const std::map<int, torch::Tensor>& states) {
  for (auto& [j, stage] : stages_) {
    auto found = states.find(j);
    if (found != states.end()) stage->rng().set_state(found->second);
  }
}

}  // namespace pipetrain
