// The three TrainRunners of `pipetrain train` (train_runner.h).
#include "train_runner.h"

#include <set>
#include <sstream>

#include "pipetrain/runtime/distributed_pipe.h"
#include "pipetrain/train/grad_clip.h"
#include "pipetrain/train/optimizer.h"

namespace pipetrain::cli {
namespace {

train::NamedTensors to_named(const std::vector<std::pair<std::string, torch::Tensor>>& items) {
  train::NamedTensors named;
  for (const auto& [name, tensor] : items) {
    if (!named.contains(name)) named.insert(name, tensor);
  }
  return named;
}

// Sequential: the reference the pipeline must reproduce. Records one F and one B per step so
// --trace and --timeline work here too.
class SequentialRunner : public TrainRunner {
 public:
  explicit SequentialRunner(BuiltModel& model) : model_(model) {}

  double step(const torch::Tensor& inputs, const torch::Tensor& targets) override {
    events_.clear();
    const double start = EventLog::now_us();
    torch::Tensor loss = model_.loss(model_.sequential->forward(inputs), targets);
    const double forward_end = EventLog::now_us();
    loss.backward();
    const double end = EventLog::now_us();
    events_.push_back({0, {0, schedule::Op::kForward, 0}, 0, forward_end - start});
    events_.push_back({0, {0, schedule::Op::kBackward, 0}, forward_end - start, end - start});
    return loss.item<double>();
  }
  std::vector<torch::Tensor> parameters() override {
    return train::unique_parameters(model_.sequential->parameters());
  }
  train::NamedTensors named_parameters() override { return model_.sequential->named_parameters(); }
  train::NamedTensors named_buffers() override { return model_.sequential->named_buffers(); }
  double grad_norm_squared() override { return train::local_grad_norm_squared(parameters()); }
  std::vector<ActionEvent> last_events() override { return events_; }
  int trace_rows() const override { return 1; }
  std::string description() const override { return "sequential (1 stage, 1 micro-batch)"; }

 private:
  BuiltModel& model_;
  std::vector<ActionEvent> events_;
};

class PipeRunner : public TrainRunner {
 public:
  PipeRunner(BuiltModel& model, const PipeOptions& options, const std::string& checkpoint)
      : model_(model), pipe_(model.sequential, options) {
    std::ostringstream text;
    text << pipe_->num_stages() << " stages on " << pipe_->num_ranks() << " ranks (balance";
    for (int64_t b : pipe_->balance()) text << " " << b;
    text << "), " << pipe_->options().chunks() << " micro-batches, schedule "
         << pipe_->options().schedule() << ", checkpoint " << checkpoint;
    description_ = text.str();
  }

  double step(const torch::Tensor& inputs, const torch::Tensor& targets) override {
    return pipe_->train_step(inputs, targets, model_.loss).item<double>();
  }
  std::vector<torch::Tensor> parameters() override {
    return train::unique_parameters(model_.sequential->parameters());
  }
  train::NamedTensors named_parameters() override { return model_.sequential->named_parameters(); }
  train::NamedTensors named_buffers() override { return model_.sequential->named_buffers(); }
  double grad_norm_squared() override { return train::local_grad_norm_squared(parameters()); }
  std::vector<ActionEvent> last_events() override { return pipe_->last_events(); }
  int trace_rows() const override { return static_cast<int>(pipe_->num_ranks()); }
  std::string description() const override { return description_; }

 private:
  BuiltModel& model_;
  Pipe pipe_;
  std::string description_;
};

class DistributedRunner : public TrainRunner {
 public:
  DistributedRunner(Distributed& distributed, BuiltModel& model, const PipeOptions& options,
                    std::string description)
      : distributed_(distributed),
        model_(model),
        pipe_(distributed, model.sequential, options),
        description_(std::move(description)) {
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
    for (const auto& [first, second] : model.tied_parameters) {
      if (!names.count(first) && names.count(second)) {
        for (const auto& [name, tensor] : pipe_.named_parameters()) {
          if (name == second) skip.insert(tensor.unsafeGetTensorImpl());
        }
      }
    }
    for (const torch::Tensor& tensor : pipe_.parameters()) {
      if (!skip.count(tensor.unsafeGetTensorImpl())) norm_parameters_.push_back(tensor);
    }
  }

  double step(const torch::Tensor& inputs, const torch::Tensor& targets) override {
    return pipe_.train_step(inputs, targets, model_.loss);
  }
  std::vector<torch::Tensor> parameters() override { return pipe_.parameters(); }
  train::NamedTensors named_parameters() override { return to_named(pipe_.named_parameters()); }
  train::NamedTensors named_buffers() override {
    train::NamedTensors buffers;
    for (const auto& item : model_.sequential->named_buffers()) {
      if (layers_.count(item.key().substr(0, item.key().find('.')))) {
        buffers.insert(item.key(), item.value());
      }
    }
    return buffers;
  }
  double grad_norm_squared() override {
    // Replicas hold equal gradients after the data-parallel sum: count one replica's worth.
    const double local = train::local_grad_norm_squared(norm_parameters_);
    return sum_over_ranks(local) / distributed_.layout().replicas;
  }
  std::vector<ActionEvent> last_events() override { return pipe_.last_events(); }
  int event_rank() const override { return distributed_.rank(); }
  int trace_rows() const override { return distributed_.world_size(); }
  std::string description() const override { return description_; }
  bool is_main() const override { return distributed_.rank() == 0; }

  std::optional<train::Checkpoint> gather(const train::Checkpoint& part) override {
    const std::string bytes = train::serialize_checkpoint(part);
    std::vector<std::vector<char>> parts = distributed_.world()->world_group()->gather_bytes(
        std::vector<char>(bytes.begin(), bytes.end()));
    if (!is_main()) return std::nullopt;
    train::Checkpoint merged = part;
    for (size_t r = 1; r < parts.size(); ++r) {
      train::merge_checkpoint(
          merged, train::deserialize_checkpoint(std::string(parts[r].begin(), parts[r].end()),
                                                "rank " + std::to_string(r)));
    }
    return merged;
  }
  EventLog gather_events(const EventLog& mine) override {
    std::vector<std::vector<char>> parts =
        distributed_.world()->world_group()->gather_bytes(mine.serialize());
    EventLog merged = mine;
    for (size_t r = 1; r < parts.size(); ++r) merged.merge(EventLog::deserialize(parts[r]));
    return merged;
  }
  double sum_over_ranks(double value) override {
    std::vector<torch::Tensor> tensors = {torch::tensor({value}, torch::kFloat64)};
    distributed_.world()->world_group()->allreduce_sum(tensors);
    return tensors[0].item<double>();
  }

 private:
  Distributed& distributed_;
  BuiltModel& model_;
  DistributedPipe pipe_;
  std::string description_;
  std::set<std::string> layers_;
  std::vector<torch::Tensor> norm_parameters_;
};

}  // namespace

std::unique_ptr<TrainRunner> make_sequential_runner(BuiltModel& model) {
  return std::make_unique<SequentialRunner>(model);
}

std::unique_ptr<TrainRunner> make_pipe_runner(BuiltModel& model, const PipeOptions& options,
                                              const std::string& checkpoint) {
  return std::make_unique<PipeRunner>(model, options, checkpoint);
}

std::unique_ptr<TrainRunner> make_distributed_runner(Distributed& distributed, BuiltModel& model,
                                                     const PipeOptions& options,
                                                     const std::string& description) {
  return std::make_unique<DistributedRunner>(distributed, model, options, description);
}

}  // namespace pipetrain::cli
