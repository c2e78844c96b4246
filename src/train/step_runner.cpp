// The three StepRunners (pipetrain/train/step_runner.h).
#include "pipetrain/train/step_runner.h"

#include <set>
#include <sstream>

#include "pipetrain/base/check.h"
#include "pipetrain/data/batch.h"
#include "pipetrain/parallel/expert_parallel.h"
#include "pipetrain/runtime/distributed_pipe.h"
#include "pipetrain/runtime/run_layout.h"
#include "pipetrain/stage/batchnorm.h"
#include "pipetrain/train/grad_clip.h"
#include "pipetrain/train/optimizer.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain::train {
namespace {

NamedTensors to_named(const std::vector<std::pair<std::string, torch::Tensor>>& items) {
  NamedTensors named;
  for (const auto& [name, tensor] : items) {
    if (!named.contains(name)) named.insert(name, tensor);
  }
  return named;
}

// Sequential: the reference the pipeline must reproduce. Records one F and one B per step so
// --trace and --timeline work here too.
class SequentialRunner : public StepRunner {
 public:
  SequentialRunner(torch::nn::Sequential model, LossFn loss, Precision precision)
      : model_(std::move(model)), loss_(std::move(loss)), precision_(precision) {
    for (const auto& p : model_->parameters()) {
      check_precision_usable(precision_, p.device());
      device_ = p.device();
    }
  }

  double step(const data::Batch& batch) override {
    data::check_batch(batch);
    PIPETRAIN_CHECK_INPUT(batch.inputs.size() == 1,
                          "sequential training takes one input tensor, got ", batch.inputs.size());
    events_.clear();
    const double start = EventLog::now_us();
    // One micro-batch: the whole batch, cut to its own width with a layout.
    data::Microbatch whole = std::move(data::split_batch(batch, {batch.rows()}).front());
    // The batch where the model is (a model moved to a GPU trains there).
    const torch::Tensor inputs = whole.inputs[0].to(device_), targets = whole.target.to(device_);
    torch::Tensor output;
    {
      const AutocastGuard autocast(precision_, inputs.device());
      const data::LayoutScope layout(whole.layout.get());
      output = model_->forward(inputs);
    }
    // The loss in float32, as a pipeline's last stage computes it.
    torch::Tensor loss =
        loss_(output.is_floating_point() ? output.to(torch::kFloat) : output, targets);
    const double forward_end = EventLog::now_us();
    (loss_scale() == 1.0 ? loss : loss * loss_scale()).backward();
    const double end = EventLog::now_us();
    events_.push_back({0, {0, schedule::Op::kForward, 0}, 0, forward_end - start});
    events_.push_back({0, {0, schedule::Op::kBackward, 0}, forward_end - start, end - start});
    return loss.item<double>();
  }
  std::vector<torch::Tensor> parameters() override {
    return unique_parameters(model_->parameters());
  }
  NamedTensors named_parameters() override { return model_->named_parameters(); }
  NamedTensors named_buffers() override { return model_->named_buffers(); }
  double grad_norm_squared() override { return local_grad_norm_squared(parameters()); }
  std::vector<ActionEvent> last_events() override { return events_; }
  int trace_rows() const override { return 1; }
  std::string description() const override { return "sequential (1 stage, 1 micro-batch)"; }

 private:
  torch::nn::Sequential model_;
  LossFn loss_;
  Precision precision_;
  torch::Device device_ = torch::kCPU;  // of the parameters
  std::vector<ActionEvent> events_;
};

class PipeRunner : public StepRunner {
 public:
  PipeRunner(torch::nn::Sequential model, LossFn loss, const PipeOptions& options)
      : model_(model), loss_(std::move(loss)), pipe_(model, options) {
    description_ = describe_pipeline(pipe_->options(), pipe_->balance(), RunLayout{});
  }

  double step(const data::Batch& batch) override {
    return pipe_->train_step(batch, scaled(loss_)).item<double>() / loss_scale();
  }
  std::vector<torch::Tensor> parameters() override {
    return unique_parameters(model_->parameters());
  }
  NamedTensors named_parameters() override { return model_->named_parameters(); }
  NamedTensors named_buffers() override { return model_->named_buffers(); }
  double grad_norm_squared() override { return local_grad_norm_squared(parameters()); }
  std::map<int, torch::Tensor> stage_rng_states() override { return pipe_->stage_rng_states(); }
  void restore_stage_rng_states(const std::map<int, torch::Tensor>& states) override {
    pipe_->restore_stage_rng_states(states);
  }
  std::vector<ActionEvent> last_events() override { return pipe_->last_events(); }
  int trace_rows() const override { return static_cast<int>(pipe_->num_ranks()); }
  std::string description() const override { return description_; }
  int total_ranks() const override { return static_cast<int>(pipe_->num_ranks()); }
  // One process has one replica: ZeRO here is only the offload's way to the host (stages 1, 2).
  std::unique_ptr<ShardedOptimizer> make_sharded_optimizer(const std::string& optimizer,
                                                           const OptimizerOptions& options,
                                                           const ZeroOptions& zero) override {
    if (!zero.offload()) return StepRunner::make_sharded_optimizer(optimizer, options, zero);
    PIPETRAIN_CHECK_INPUT(zero.stage() < 3,
                          "--zero 3 in one process runs one stage (a rank process of its own, "
                          "a world of one); for several stages give --nproc N --pp N, or use "
                          "--zero 1 (or 2) with --offload-optimizer here");
    const std::vector<torch::Tensor> all = parameters();
    return std::make_unique<ShardedOptimizer>(nullptr, all, all, optimizer, options, zero);
  }
  std::vector<RankHoldings> rank_holdings() override {
    const schedule::Schedule& schedule = pipe_->schedule();
    const std::vector<int64_t> peaks = pipe_->rank_peak_stashed_bytes();
    std::vector<RankHoldings> ranks(static_cast<size_t>(schedule.num_ranks));
    for (int r = 0; r < schedule.num_ranks; ++r) {
      ranks[static_cast<size_t>(r)].rank = r;
      ranks[static_cast<size_t>(r)].peak_activation_bytes = peaks.at(static_cast<size_t>(r));
    }
    const std::vector<StageAccounting> accounting = pipe_->stage_accounting();
    int64_t first = 0;
    for (int j = 0; j < schedule.num_stages; ++j) {
      RankHoldings& rank = ranks[static_cast<size_t>(schedule.stage_rank[j])];
      rank.stages.push_back(j);
      rank.peak_offloaded_bytes += accounting.at(static_cast<size_t>(j)).peak_offloaded_bytes;
      const int64_t count = pipe_->balance()[static_cast<size_t>(j)];
      for (int64_t l = first; l < first + count; ++l) {
        for (const auto& p : model_->ptr(static_cast<size_t>(l))->parameters())
          rank.parameters.push_back(p);
      }
      first += count;
    }
    for (RankHoldings& rank : ranks) rank.parameters = unique_parameters(rank.parameters);
    return ranks;
  }

 private:
  torch::nn::Sequential model_;
  LossFn loss_;
  Pipe pipe_;
  std::string description_;
};

class DistributedRunner : public StepRunner {
 public:
  DistributedRunner(Distributed& distributed, torch::nn::Sequential model, LossFn loss,
                    const PipeOptions& options, std::string description, const TiedNames& tied,
                    const torch::Device& device, TensorParallelModel tensor_parallel)
      : distributed_(distributed),
        model_(model),
        loss_(std::move(loss)),
        pipe_(distributed, model, options, device),
        overlap_gradient_reduction_(options.overlap_gradient_reduction()),
        description_(std::move(description)),
        split_(std::move(tensor_parallel.split)) {
    // Layers this rank holds: the first component of its parameter names. Buffers are filed
    // under the same layers (a layer without parameters has no buffers in our models).
    std::set<std::string> names;
    for (const auto& [name, tensor] : pipe_.named_parameters()) {
      names.insert(name);
      layers_.insert(name.substr(0, name.find('.')));
    }
    // A tied tensor is held by several pipeline ranks; for the gradient norm only the rank that
    // holds its first name counts it.
    std::set<const void*> skip;
    for (const auto& [first, second] : tied) {
      if (!names.count(first) && names.count(second)) {
        for (const auto& [name, tensor] : pipe_.named_parameters()) {
          if (name == second) skip.insert(tensor.unsafeGetTensorImpl());
        }
      }
    }
    // Sequence parallelism: each rank's gradient of a whole tensor is its sequence share, summed
    // over the group by the pipe before the replicas' sum.
    if (tensor_parallel.sequence_parallel && distributed_.tensor_parallel_group()) {
      std::set<const void*> seen;
      std::vector<torch::Tensor> shared;
      for (const auto& [name, tensor] : pipe_.named_parameters()) {
        if (tensor_parallel.summed_in_backward && tensor_parallel.summed_in_backward(name)) {
          continue;
        }
        if (!split_(name) && seen.insert(tensor.unsafeGetTensorImpl()).second) {
          shared.push_back(tensor);
        }
      }
      pipe_.set_tensor_parallel_summed(std::move(shared));
    }
    // A tensor every tp rank holds whole (a norm's weight) counts on tp rank 0 only; a slice
    // several ranks share (a replicated key/value head), on the first of them.
    for (const auto& [name, tensor] : pipe_.named_parameters()) {
      if (!split_) break;  // tp 1
      const std::optional<parallel::TensorSplit> split = split_(name);
      const int replicas = split ? split->replicas : distributed_.layout().tensor_parallel;
      if (distributed_.tp_rank() % replicas != 0) skip.insert(tensor.unsafeGetTensorImpl());
    }
    // Expert parallelism: the experts' gradients are summed over the ranks holding the same
    // experts, not over every replica; each is held by R / E replicas where a dense tensor is
    // held by R, so the norm counts them E times (the norm divides by R).
    if (distributed_.expert_parallel_group()) {
      std::vector<torch::Tensor> experts;
      for (const auto& [name, tensor] : pipe_.named_parameters()) {
        if (parallel::is_expert_parameter(name)) {
          experts.push_back(tensor);
          expert_tensors_.insert(tensor.unsafeGetTensorImpl());
        }
      }
      pipe_.set_expert_parameters(std::move(experts));
    }
    for (const torch::Tensor& tensor : pipe_.parameters()) {
      if (!skip.count(tensor.unsafeGetTensorImpl())) norm_parameters_.push_back(tensor);
    }
    // The deferred batch norms of this rank's layers, in model order (the same on every replica).
    const std::vector<int64_t> balance = stage_balance(options, model->size());
    std::vector<int64_t> first(balance.size() + 1, 0);
    for (size_t j = 0; j < balance.size(); ++j) first[j + 1] = first[j] + balance[j];
    for (int j : pipe_.local_stages()) {
      for (int64_t l = first[static_cast<size_t>(j)]; l < first[static_cast<size_t>(j) + 1]; ++l) {
        const auto layer = model->ptr(static_cast<size_t>(l));
        std::vector<std::shared_ptr<torch::nn::Module>> modules = {layer};
        for (const auto& child : layer->modules(/*include_self=*/false)) modules.push_back(child);
        for (const auto& module : modules) {
          if (auto* norm = dynamic_cast<DeferredBatchNormImpl*>(module.get()))
            batch_norms_.push_back(norm);
        }
      }
    }
  }

  void sum_batch_norm_statistics() override {
    const auto& replicas = distributed_.data_parallel_group();
    if (!replicas) return;
    if (batch_norms_.empty()) return;
    DeferredBatchNormImpl::sum_tracked_over(batch_norms_, [&](torch::Tensor& values) {
      std::vector<torch::Tensor> one = {values};
      replicas->allreduce_sum(one);
    });
  }

  double step(const data::Batch& batch) override {
    const double loss = pipe_.train_step(batch, scaled(loss_)).item<double>();
    return loss / loss_scale();
  }
  std::vector<torch::Tensor> parameters() override { return pipe_.parameters(); }
  NamedTensors named_parameters() override { return to_named(pipe_.named_parameters()); }
  NamedTensors named_buffers() override {
    NamedTensors buffers;
    for (const auto& item : model_->named_buffers()) {
      if (layers_.count(item.key().substr(0, item.key().find('.')))) {
        buffers.insert(item.key(), item.value());
      }
    }
    return buffers;
  }
  double grad_norm_squared() override {
    // Replicas hold equal gradients after the data-parallel sum: count one replica's worth.
    double local = local_grad_norm_squared(norm_parameters_);
    if (!expert_tensors_.empty()) {
      std::vector<torch::Tensor> experts;
      for (const torch::Tensor& p : norm_parameters_) {
        if (expert_tensors_.count(p.unsafeGetTensorImpl())) experts.push_back(p);
      }
      local += (distributed_.layout().expert_parallel - 1) * local_grad_norm_squared(experts);
    }
    return sum_over_ranks(local) / distributed_.layout().replicas;
  }
  std::map<int, torch::Tensor> stage_rng_states() override { return pipe_.stage_rng_states(); }
  void restore_stage_rng_states(const std::map<int, torch::Tensor>& states) override {
    pipe_.restore_stage_rng_states(states);
  }
  std::vector<ActionEvent> last_events() override { return pipe_.last_events(); }
  int event_rank() const override { return distributed_.rank(); }
  int trace_rows() const override { return distributed_.world_size(); }
  std::string description() const override { return description_; }
  bool is_main() const override { return distributed_.rank() == 0; }

  std::optional<Checkpoint> gather(const Checkpoint& given) override {
    // Tensor parallelism: whole tensors first, within the group; tp rank 0 sends them.
    const Checkpoint part = join_tensor_parallel(given);
    const std::string bytes = distributed_.tp_rank() == 0 ? serialize_checkpoint(part) : "";
    std::vector<std::vector<char>> parts = distributed_.world()->world_group()->gather_bytes(
        std::vector<char>(bytes.begin(), bytes.end()));
    if (!is_main()) return std::nullopt;
    Checkpoint merged = part;
    for (size_t r = 1; r < parts.size(); ++r) {
      if (parts[r].empty()) continue;  // a tp rank other than 0
      merge_checkpoint(merged, deserialize_checkpoint(std::string(parts[r].begin(), parts[r].end()),
                                                      "rank " + std::to_string(r)));
    }
    return merged;
  }
  ShardPlacement shard_placement() const override {
    ShardPlacement placement;
    placement.tensor_parallel = {split_, distributed_.tp_rank(),
                                 distributed_.layout().tensor_parallel};
    placement.replica = distributed_.replica();
    placement.replicas = distributed_.layout().replicas;
    placement.expert_parallel = distributed_.layout().expert_parallel;
    return placement;
  }
  std::vector<std::string> gather_text(const std::string& mine) override {
    std::vector<std::vector<char>> parts = distributed_.world()->world_group()->gather_bytes(
        std::vector<char>(mine.begin(), mine.end()));
    if (!is_main()) return {};
    std::vector<std::string> texts;
    for (const auto& part : parts) texts.emplace_back(part.begin(), part.end());
    return texts;
  }
  void barrier() override { distributed_.world()->world_group()->barrier(); }
  EventLog gather_events(const EventLog& mine) override {
    std::vector<std::vector<char>> parts =
        distributed_.world()->world_group()->gather_bytes(mine.serialize());
    EventLog merged = mine;
    for (size_t r = 1; r < parts.size(); ++r) merged.merge(EventLog::deserialize(parts[r]));
    return merged;
  }
  std::unique_ptr<ShardedOptimizer> make_sharded_optimizer(const std::string& optimizer,
                                                           const OptimizerOptions& options,
                                                           const ZeroOptions& zero) override {
    // One replica's shard is everything: pointless, unless the offload moves it to the host.
    PIPETRAIN_CHECK_INPUT(distributed_.layout().replicas > 1 || zero.offload(), "ZeRO stage ",
                          zero.stage(),
                          " shards the optimizer over data-parallel replicas, and this run has "
                          "one; start it with more than one replica (--dp 2 or more)");
    // The optimizer is the trainer's, which keeps it while it trains through this runner.
    return make_pipe_sharded_optimizer(distributed_, pipe_, norm_parameters_, optimizer, options,
                                       zero, overlap_gradient_reduction_);
  }
  int64_t transport_bytes_sent() const override { return pipe_.transport_stats().data_bytes_sent; }
  double last_exposed_reduce_seconds() const override {
    return pipe_.last_exposed_reduce_seconds();
  }
  std::vector<CollectiveEvent> last_collectives() const override {
    return pipe_.collective_log().events();
  }
  int total_ranks() const override { return distributed_.world_size(); }
  std::vector<RankHoldings> rank_holdings() override {
    RankHoldings mine;
    mine.rank = distributed_.rank();
    mine.parameters = pipe_.parameters();
    for (const auto& [j, accounting] : pipe_.stage_accounting()) {
      mine.stages.push_back(j);
      mine.peak_offloaded_bytes += accounting.peak_offloaded_bytes;
    }
    mine.peak_activation_bytes = pipe_.rank_peak_stashed_bytes();
    mine.peak_receive_buffer_bytes = pipe_.step_transport_stats().peak_receive_buffer_bytes;
    mine.peak_send_buffer_bytes = pipe_.step_transport_stats().peak_send_buffer_bytes;
    mine.reduce_buffer_bytes = pipe_.last_reduce_buffer_bytes();
    return {mine};
  }
  double sum_over_ranks(double value) override {
    return sum_over_ranks(std::vector<double>{value}).front();
  }
  std::vector<double> sum_over_ranks(std::vector<double> values) override {
    std::vector<torch::Tensor> tensors = {torch::tensor(values, torch::kFloat64)};
    distributed_.world()->world_group()->allreduce_sum(tensors);
    const double* sums = tensors[0].data_ptr<double>();
    return std::vector<double>(sums, sums + values.size());
  }
  int processes() const override { return distributed_.world_size(); }
  int process_index() const override { return distributed_.rank(); }

 private:
  Distributed& distributed_;
  torch::nn::Sequential model_;
  LossFn loss_;
  DistributedPipe pipe_;
  bool overlap_gradient_reduction_ = false;  // PipeOptions', for the ZeRO optimizer's segments
  std::string description_;
  std::set<std::string> layers_;
  std::vector<torch::Tensor> norm_parameters_;
  std::set<const void*> expert_tensors_;  // expert parallelism: the experts this rank holds
  std::vector<DeferredBatchNormImpl*> batch_norms_;  // this rank's, in model order
  TensorParallelSplit split_;

  // `part` with every split tensor (a parameter, and its optimizer state of the same shape)
  // joined over the tensor-parallel group along its dimension. Collective over the group: every
  // member holds the same names (the same stages).
  Checkpoint join_tensor_parallel(const Checkpoint& part) {
    const auto& group = distributed_.tensor_parallel_group();
    if (!group) return part;
    Checkpoint whole = part;
    auto join = [&](const torch::Tensor& slice, const parallel::TensorSplit& split) {
      // On the slice's device: NCCL gathers CUDA tensors, Gloo either.
      const torch::Tensor flat_slice = slice.detach().contiguous().reshape({-1});
      torch::Tensor flat = torch::empty({group->size() * flat_slice.numel()}, flat_slice.options());
      group->all_gather(flat_slice, flat);
      // One piece per distinct slice: the first of the ranks that share it.
      std::vector<torch::Tensor> pieces;
      const std::vector<torch::Tensor> chunks = flat.chunk(group->size());
      for (int r = 0; r < group->size(); r += split.replicas) {
        pieces.push_back(chunks[static_cast<size_t>(r)].view(slice.sizes()));
      }
      return torch::cat(pieces, split.dim);
    };
    for (auto& [name, tensor] : whole.parameters) {
      const std::optional<parallel::TensorSplit> split = split_(name);
      if (!split) continue;
      const torch::Tensor slice = tensor;
      tensor = join(slice, *split);
      auto state = whole.optimizer_state.find(name);
      if (state == whole.optimizer_state.end()) continue;
      for (auto& [field, value] : state->second) {
        if (value.sizes() == slice.sizes()) value = join(value, *split);
      }
    }
    return whole;
  }
};

}  // namespace

std::unique_ptr<ShardedOptimizer> StepRunner::make_sharded_optimizer(const std::string&,
                                                                     const OptimizerOptions&,
                                                                     const ZeroOptions& zero) {
  if (zero.offload()) {
    throw BadInput("--offload-optimizer steps a pipeline's optimizer on the host; " +
                   description() + " has none: train through a pipeline schedule");
  }
  throw BadInput("ZeRO stage " + std::to_string(zero.stage()) +
                 " shards the optimizer over data-parallel replicas: it needs a multi-process "
                 "run with more than one replica (--nproc with --dp 2 or more)");
}

std::unique_ptr<StepRunner> make_sequential_runner(torch::nn::Sequential model, LossFn loss,
                                                   Precision precision) {
  return std::make_unique<SequentialRunner>(std::move(model), std::move(loss), precision);
}

std::unique_ptr<StepRunner> make_pipe_runner(torch::nn::Sequential model, LossFn loss,
                                             const PipeOptions& options) {
  return std::make_unique<PipeRunner>(std::move(model), std::move(loss), options);
}

std::unique_ptr<StepRunner> make_distributed_runner(Distributed& distributed,
                                                    torch::nn::Sequential model, LossFn loss,
                                                    const PipeOptions& options,
                                                    std::string description, const TiedNames& tied,
                                                    const torch::Device& device,
                                                    TensorParallelModel tensor_parallel) {
  PIPETRAIN_CHECK_INPUT(distributed.layout().tensor_parallel == 1 || tensor_parallel.split,
                        "a tensor-parallel run (", distributed.layout().tensor_parallel,
                        " ranks per stage) needs the model's TensorParallelSplit");
  return std::make_unique<DistributedRunner>(distributed, std::move(model), std::move(loss),
                                             options, std::move(description), tied, device,
                                             std::move(tensor_parallel));
}

}  // namespace pipetrain::train
