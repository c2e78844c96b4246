// The in-process Pipe: stages, one worker per rank, a LocalTransport, and one Interpreter per
// worker per step (include/pipetrain/runtime/pipe.h).
//
// One step, as the caller's thread sees it:
//   [1] split input and target into M micro-batches; pick (or build and validate) the schedule
//       for this M
//   [2] reset the transport and the stages' accounting
//   [3] hand every worker "run your rank's actions"; each builds an Interpreter and runs
//       (a Pipe with one rank has no worker: the calling thread runs it)
//   [4] a worker that fails records its error (the first real one wins), raises `cancel` and
//       aborts the transport, which wakes every worker blocked in a receive; all return
//   [5] wait for every worker; on error clear every stash and rethrow the first error
//   [6] sum the weighted micro-batch losses
#include "pipetrain/runtime/pipe.h"

#include "pipetrain/base/message_of.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <numeric>
#include <optional>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include "pipetrain/base/check.h"
#include "pipetrain/data/batch.h"
#include "pipetrain/runtime/interpreter.h"
#include "pipetrain/runtime/scoped_threads.h"
#include "pipetrain/runtime/worker.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/validate.h"
#include "pipetrain/stage/device.h"
#include "pipetrain/stage/microbatch.h"
#include "pipetrain/stage/stage_rng.h"
#include "pipetrain/transport/local.h"

namespace pipetrain {

struct PipeImpl::Runtime {
  int num_stages = 0;
  int num_ranks = 0;
  std::vector<int> stage_rank;
  std::vector<torch::Device> rank_devices;
  std::vector<std::unique_ptr<Stage>> stages;
  std::vector<std::shared_ptr<RankStash>> rank_stash;  // per rank: its stages' stash together
  std::unique_ptr<LocalTransport> transport;
  std::map<int, schedule::Schedule> training;   // lowered, by M
  std::map<int, schedule::Schedule> inference;  // compute-only forwards, by M
  const schedule::Schedule* last = nullptr;
  std::vector<ActionEvent> events;
  int threads = 1;  // intra-op threads of each rank
  // Per rank with worker threads: its stream, kept for every step (see run_step).
  std::vector<RankStream> rank_streams;
  // One per rank; none when there is one rank: it runs on the calling thread (see run_step).
  std::vector<std::unique_ptr<Worker>> workers;  // last: joined before the rest is destroyed
};

namespace {

std::string join(const std::vector<int64_t>& values) {
  std::string text;
  for (int64_t v : values) text += (text.empty() ? "" : ",") + std::to_string(v);
  return "{" + text + "}";
}

}  // namespace

PipeImpl::PipeImpl(torch::nn::Sequential model, PipeOptions options)
    : model_(std::move(model)), options_(std::move(options)) {
  reset();
}

PipeImpl::PipeImpl(const PipeImpl& other)
    : torch::nn::Cloneable<PipeImpl>(other),
      model_(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(other.model_->clone())),
      options_(other.options_),
      balance_(other.balance_) {}

PipeImpl& PipeImpl::operator=(const PipeImpl& other) {
  if (this == &other) return *this;
  runtime_.reset();  // joins our workers before the layers they run are replaced
  torch::nn::Module::operator=(other);
  model_ = other.model_;
  options_ = other.options_;
  balance_ = other.balance_;
  reset();  // workers of our own; the layers are already registered (Module::operator=)
  return *this;
}

PipeImpl::~PipeImpl() = default;

PipeImpl::Runtime& PipeImpl::runtime() const {
  PIPETRAIN_CHECK_INPUT(runtime_, "this Pipe has no runtime; call reset() after copying it");
  return *runtime_;
}

void PipeImpl::reset() {
  runtime_.reset();  // joins old workers first
  const auto& o = options_;
  const int64_t layers = static_cast<int64_t>(model_->size());
  PIPETRAIN_CHECK_INPUT(layers >= 1, "the Sequential has no layers; a Pipe needs at least one");
  PIPETRAIN_CHECK_INPUT(o.chunks() >= 1, "chunks must be at least 1 (got ", o.chunks(), ")");
  PIPETRAIN_CHECK_INPUT(o.virtual_stages() >= 1, "virtual_stages must be at least 1 (got ",
                        o.virtual_stages(), ")");
  const std::chrono::milliseconds timeout = timeout_of(o);
  PIPETRAIN_CHECK_INPUT(o.threads_per_stage() >= 0, "threads_per_stage must be >= 0 (got ",
                        o.threads_per_stage(), ")");
  check_offload_options(o);
  PIPETRAIN_CHECK_INPUT(!o.overlap_expert_exchanges(),
                        "overlap_expert_exchanges pairs the actions of a rank's process "
                        "(DistributedPipe); the in-process Pipe runs one thread per rank");

  balance_ = stage_balance(o, layers);
  const int num_stages = static_cast<int>(balance_.size());
  const int v = static_cast<int>(o.virtual_stages());
  PIPETRAIN_CHECK_INPUT(num_stages % v == 0, num_stages,
                        " stages cannot be spread over ranks with ", "virtual_stages ", v,
                        "; use a stage count divisible by ", v);
  const int num_ranks = num_stages / v;

  auto runtime = std::make_unique<Runtime>();
  runtime->num_stages = num_stages;
  runtime->num_ranks = num_ranks;

  // The schedule for `chunks`: checks the name and gives the stage placement.
  const int m = static_cast<int>(o.chunks());
  schedule::Schedule first = training_schedule_for(o, num_ranks, num_stages, m);
  runtime->stage_rank = first.stage_rank;

  // Devices.
  std::vector<torch::Device> devices = o.devices();
  if (devices.empty()) devices.assign(static_cast<size_t>(num_ranks), torch::Device(torch::kCPU));
  PIPETRAIN_CHECK_INPUT(static_cast<int>(devices.size()) == num_ranks, "devices lists ",
                        devices.size(), " devices but the Pipe has ", num_ranks, " ranks (",
                        num_stages, " stages / virtual_stages ", v, "); give one device per rank");
  for (const auto& device : devices) check_device_usable(device);
  runtime->rank_devices = devices;

  // Stages: slices of the Sequential, moved to their rank's device; children under their names.
  const uint64_t seed = at::detail::getDefaultCPUGenerator().current_seed();
  std::vector<torch::Device> stage_devices;
  int64_t layer = 0;
  for (int j = 0; j < num_stages; ++j) {
    const torch::Device device = devices[static_cast<size_t>(runtime->stage_rank[j])];
    const int first_layer = static_cast<int>(layer);
    std::vector<StageLayer> stage_layers =
        slice_layers(model_, layer, balance_[static_cast<size_t>(j)], device);
    layer += balance_[static_cast<size_t>(j)];
    for (const auto& stage_layer : stage_layers) {
      if (!named_children().contains(stage_layer.name)) {
        register_module(stage_layer.name, stage_layer.module.ptr());
      }
    }
    runtime->stages.push_back(std::make_unique<Stage>(j, first_layer, std::move(stage_layers),
                                                      device, stage_seed(seed, j)));
    runtime->stages.back()->set_precision(o.precision(), j == num_stages - 1);
    const auto r = static_cast<size_t>(runtime->stage_rank[j]);
    if (runtime->rank_stash.size() <= r) runtime->rank_stash.resize(r + 1);
    if (!runtime->rank_stash[r]) runtime->rank_stash[r] = std::make_shared<RankStash>();
    runtime->stages.back()->set_rank_stash(runtime->rank_stash[r]);
    stage_devices.push_back(device);
  }
  runtime->transport = std::make_unique<LocalTransport>(stage_devices, timeout);
  runtime->last = &runtime->training.emplace(m, std::move(first)).first->second;

  // Workers, one per rank; a single rank needs none.
  const int threads =
      o.threads_per_stage() > 0 ? static_cast<int>(o.threads_per_stage()) : at::get_num_threads();
  runtime->threads = threads;
  for (int r = 0; num_ranks > 1 && r < num_ranks; ++r) {
    runtime->rank_streams.push_back(rank_stream(runtime->rank_devices[static_cast<size_t>(r)], r));
    runtime->workers.push_back(
        std::make_unique<Worker>([threads] { at::set_num_threads(threads); }));
  }
  runtime_ = std::move(runtime);
}

std::chrono::milliseconds timeout_of(const PipeOptions& o) {
  const double seconds = o.timeout_seconds();
  PIPETRAIN_CHECK_INPUT(seconds >= kMinTimeoutSeconds && seconds <= kMaxTimeoutSeconds,
                        "timeout_seconds must be from ", kMinTimeoutSeconds, " to ",
                        kMaxTimeoutSeconds, " seconds (got ", seconds, ")");
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

void check_offload_options(const PipeOptions& o) {
  if (!o.offload_activations()) return;
  PIPETRAIN_CHECK_INPUT(o.checkpoint() != Checkpoint::kNever,
                        "offload_activations moves the inputs that checkpointed micro-batches keep "
                        "until their backward, and checkpoint never checkpoints none; use "
                        "checkpoint except_last or always");
  PIPETRAIN_CHECK_INPUT(o.checkpoint() != Checkpoint::kExceptLast || o.chunks() >= 2,
                        "offload_activations moves the inputs that checkpointed micro-batches keep "
                        "until their backward, and checkpoint except_last with 1 chunk "
                        "checkpoints none; use 2 or more chunks or checkpoint always");
}

std::vector<int64_t> stage_balance(const PipeOptions& o, int64_t layers) {
  std::vector<int64_t> balance;
  if (o.balance().empty()) {
    PIPETRAIN_CHECK_INPUT(o.stages() >= 1, "stages must be at least 1 (got ", o.stages(), ")");
    PIPETRAIN_CHECK_INPUT(o.stages() <= layers, "more stages (", o.stages(), ") than layers (",
                          layers, "); use at most ", layers, " stages");
    balance.assign(static_cast<size_t>(o.stages()), layers / o.stages());
    for (int64_t j = 0; j < layers % o.stages(); ++j) ++balance[static_cast<size_t>(j)];
    return balance;
  }
  balance = o.balance();
  PIPETRAIN_CHECK_INPUT(static_cast<int64_t>(balance.size()) <= layers, "more stages (",
                        balance.size(), ", balance ", join(balance), ") than layers (", layers,
                        ")");
  for (size_t j = 0; j < balance.size(); ++j) {
    PIPETRAIN_CHECK_INPUT(balance[j] >= 1, "balance ", join(balance), " gives stage ", j, " ",
                          balance[j], " layers; every stage needs at least one");
  }
  const int64_t sum = std::accumulate(balance.begin(), balance.end(), int64_t{0});
  PIPETRAIN_CHECK_INPUT(sum == layers, "balance ", join(balance), " sums to ", sum,
                        " but the Sequential has ", layers, " layers; make the balance sum to ",
                        layers);
  return balance;
}

std::vector<int64_t> rank_layers(const PipeOptions& options, int64_t layers, int rank) {
  const std::vector<int64_t> balance = stage_balance(options, layers);
  const int stages = static_cast<int>(balance.size());
  const int ranks = stages / static_cast<int>(std::max<int64_t>(1, options.virtual_stages()));
  const schedule::Schedule s =
      training_schedule_for(options, ranks, stages, static_cast<int>(options.chunks()));
  std::vector<int64_t> mine;
  int64_t first = 0;
  for (int j = 0; j < stages; ++j) {
    if (s.stage_rank[static_cast<size_t>(j)] == rank) {
      for (int64_t l = 0; l < balance[static_cast<size_t>(j)]; ++l) mine.push_back(first + l);
    }
    first += balance[static_cast<size_t>(j)];
  }
  return mine;
}

schedule::Schedule training_schedule_for(const PipeOptions& o, int ranks, int stages,
                                         int microbatches) {
  schedule::Schedule s;
  if (o.schedule() == "custom") {
    PIPETRAIN_CHECK_INPUT(o.custom_schedule().has_value(),
                          "schedule \"custom\" needs PipeOptions::custom_schedule (e.g. from "
                          "schedule::load_schedule(path))");
    s = *o.custom_schedule();
    PIPETRAIN_CHECK_INPUT(s.num_ranks == ranks && s.num_stages == stages,
                          "the custom schedule has ", s.num_ranks, " ranks and ", s.num_stages,
                          " stages but the pipeline has ", ranks, " ranks and ", stages,
                          " stages; match the balance/stages and virtual_stages to the schedule");
    PIPETRAIN_CHECK_INPUT(s.num_microbatches == microbatches, "the custom schedule is written for ",
                          s.num_microbatches, " micro-batches but this step has ", microbatches,
                          "; set chunks to ", s.num_microbatches, " and feed batches of at least ",
                          s.num_microbatches, " rows");
  } else {
    const int v = static_cast<int>(o.virtual_stages());
    try {
      s = schedule::make_schedule(o.schedule(), ranks, microbatches, v);
    } catch (const BadInput& e) {
      throw BadInput(c10::str("cannot build schedule '", o.schedule(), "' for ", ranks, " ranks, ",
                              microbatches, " micro-batches, virtual_stages ", v, ": ", e.what()));
    }
  }
  if (!schedule::is_lowered(s)) s = schedule::lower(s);
  try {
    schedule::validate(s);
  } catch (const std::exception& e) {
    throw ScheduleInvalid(c10::str("schedule '", o.schedule(), "' is not runnable: ", e.what()));
  }
  return s;
}

const schedule::Schedule& PipeImpl::training_schedule(int microbatches) {
  Runtime& rt = runtime();
  auto found = rt.training.find(microbatches);
  if (found != rt.training.end()) return found->second;
  schedule::Schedule s = training_schedule_for(options_, rt.num_ranks, rt.num_stages, microbatches);
  return rt.training.emplace(microbatches, std::move(s)).first->second;
}

const schedule::Schedule& PipeImpl::inference_schedule(int microbatches) {
  Runtime& rt = runtime();
  auto found = rt.inference.find(microbatches);
  if (found != rt.inference.end()) return found->second;
  return rt.inference.emplace(microbatches, schedule::forward_only(*rt.last, microbatches))
      .first->second;
}

std::vector<RankResult> PipeImpl::run_step(const schedule::Schedule& s, const StepData& data) {
  Runtime& rt = runtime();
  rt.transport->reset();  // [2]
  for (auto& stage : rt.stages) {
    stage->clear();
    stage->reset_accounting();
  }
  for (auto& rank : rt.rank_stash) rank->restart_peak();
  std::vector<RankResult> results(static_cast<size_t>(rt.num_ranks));
  // With worker threads, CUDA ranks run on streams of their own (RankStreamGuard; the same stream
  // every step), so that they overlap. They start after what the caller queued on its streams
  // (the inputs, the last optimizer step), and the caller's streams continue after what they did
  // (gradients, losses): events both ways, no host synchronisation. A single rank runs on the
  // caller's thread and stream, as plain LibTorch would.
  const bool own_streams = !rt.workers.empty();
  std::vector<ReadyMarker> caller_ready(static_cast<size_t>(rt.num_ranks));
  if (own_streams) {
    for (int r = 0; r < rt.num_ranks; ++r) {
      caller_ready[static_cast<size_t>(r)] = mark_ready(rt.rank_devices[static_cast<size_t>(r)]);
    }
  }
  std::vector<ReadyMarker> rank_done(static_cast<size_t>(rt.num_ranks));
  std::atomic<bool> cancel{false};
  std::mutex error_mutex;
  std::exception_ptr first_error;     // GUARDED_BY(error_mutex)
  bool first_error_cancelled = true;  // GUARDED_BY(error_mutex)

  auto run_rank = [&](int r) {
    std::map<int, Stage*> stages;
    for (int j : s.stages_of_rank(r)) stages[j] = rt.stages[static_cast<size_t>(j)].get();
    try {
      const torch::Device& device = rt.rank_devices[static_cast<size_t>(r)];
      std::optional<RankStreamGuard> stream;
      if (own_streams) stream.emplace(rt.rank_streams[static_cast<size_t>(r)]);
      wait_ready(caller_ready[static_cast<size_t>(r)], device);
      Interpreter interpreter(r, s, stages, *rt.transport);
      interpreter.run(data, results[static_cast<size_t>(r)], &cancel);
      if (own_streams) rank_done[static_cast<size_t>(r)] = mark_ready(device);
    } catch (const std::exception& e) {  // [4]
      const auto* step_error = dynamic_cast<const StepError*>(&e);
      const bool cancelled = step_error && step_error->cancelled;
      {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!first_error || (first_error_cancelled && !cancelled)) {
          first_error = std::current_exception();
          first_error_cancelled = cancelled;
        }
      }
      cancel.store(true);
      rt.transport->abort("rank " + std::to_string(r) + " failed: " + message_of(e));
    }
  };
  if (rt.workers.empty()) {
    // One rank: run it here. A hand-off to a worker would cost a wake-up per step and a second
    // OpenMP team next to the caller's (which runs the optimizer step right after).
    const ScopedThreadCount thread_count(rt.threads);
    run_rank(0);
  } else {
    for (int r = 0; r < rt.num_ranks; ++r) {  // [3]
      rt.workers[static_cast<size_t>(r)]->run([&run_rank, r] { run_rank(r); });
    }
    for (auto& worker : rt.workers) {  // [5]
      std::exception_ptr error = worker->wait();
      if (error && !first_error) first_error = error;
    }
  }
  for (int r = 0; r < rt.num_ranks; ++r) {
    wait_ready(rank_done[static_cast<size_t>(r)], rt.rank_devices[static_cast<size_t>(r)]);
  }
  rt.events.clear();
  for (const auto& result : results) {
    rt.events.insert(rt.events.end(), result.events.begin(), result.events.end());
  }
  std::sort(rt.events.begin(), rt.events.end(),
            [](const ActionEvent& a, const ActionEvent& b) { return a.start_us < b.start_us; });
  if (first_error) {
    for (auto& stage : rt.stages) stage->clear();
    rt.transport->reset();
    std::rethrow_exception(first_error);
  }
  for (const auto& stage : rt.stages) {
    PIPETRAIN_CHECK(stage->stashed_microbatches() == 0, ScheduleInvalid, "stage ", stage->index(),
                    " still holds ", stage->stashed_microbatches(),
                    " micro-batches after the step: schedule '", s.name, "' lacks their backward");
  }
  return results;
}

torch::Tensor PipeImpl::train_step(torch::Tensor input, torch::Tensor target,
                                   const LossFn& loss_fn) {
  return train_step(std::vector<torch::Tensor>{std::move(input)}, std::move(target), loss_fn);
}

torch::Tensor PipeImpl::train_step(std::vector<torch::Tensor> inputs, torch::Tensor target,
                                   const LossFn& loss_fn) {
  data::Batch batch;
  batch.inputs = std::move(inputs);
  batch.targets = std::move(target);
  return train_step(batch, loss_fn);
}

torch::Tensor PipeImpl::train_step(const data::Batch& batch, const LossFn& loss_fn) {
  Runtime& rt = runtime();
  PIPETRAIN_CHECK_INPUT(loss_fn, "train_step needs a loss function");
  data::check_batch(batch);
  const std::vector<int64_t> sizes = microbatch_sizes(batch.rows(), options_.chunks());  // [1]
  const int m = static_cast<int>(sizes.size());
  const schedule::Schedule& s = training_schedule(m);

  StepData data;
  data.num_microbatches = m;
  const torch::Device last_device = stage_device(rt.num_stages - 1);
  const double total = batch.total_weight();
  for (data::Microbatch& part : data::split_batch(batch, sizes)) {
    data.inputs.push_back(std::move(part.inputs));
    data.targets.push_back(part.target.to(last_device));
    data.loss_weights.push_back(total > 0 ? part.weight / total : 0.0);
    data.layouts.push_back(std::move(part.layout));
  }
  data.loss_fn = &loss_fn;
  data.training = true;
  data.checkpoint = options_.checkpoint();
  data.offload = options_.offload_activations();
  data.start = std::chrono::steady_clock::now();
  rt.last = &s;

  std::vector<RankResult> results = run_step(s, data);
  const auto& losses = results[static_cast<size_t>(rt.stage_rank.back())].losses;
  torch::Tensor total_loss = losses[0];
  for (size_t i = 1; i < losses.size(); ++i) total_loss = total_loss + losses[i];  // [6]
  return total_loss.detach();
}

torch::Tensor PipeImpl::forward(torch::Tensor input) {
  std::vector<torch::Tensor> outputs = forward(std::vector<torch::Tensor>{std::move(input)});
  PIPETRAIN_CHECK_INPUT(outputs.size() == 1, "the model returned ", outputs.size(),
                        " tensors; use forward(std::vector<torch::Tensor>) for tuple outputs");
  return outputs[0];
}

std::vector<torch::Tensor> PipeImpl::forward(std::vector<torch::Tensor> inputs) {
  return forward(std::move(inputs), nullptr);
}

torch::Tensor PipeImpl::forward(torch::Tensor input,
                                std::shared_ptr<const data::SequenceLayout> layout) {
  std::vector<torch::Tensor> outputs =
      forward(std::vector<torch::Tensor>{std::move(input)}, std::move(layout));
  PIPETRAIN_CHECK_INPUT(outputs.size() == 1, "the model returned ", outputs.size(),
                        " tensors; use forward(std::vector<torch::Tensor>) for tuple outputs");
  return outputs[0];
}

std::vector<torch::Tensor> PipeImpl::forward(std::vector<torch::Tensor> inputs,
                                             std::shared_ptr<const data::SequenceLayout> layout) {
  Runtime& rt = runtime();
  PIPETRAIN_CHECK_INPUT(!inputs.empty() && inputs[0].defined() && inputs[0].dim() >= 1,
                        "forward needs an input with a batch dimension (dim 0)");
  const std::vector<int64_t> sizes = microbatch_sizes(inputs[0].size(0), options_.chunks());
  const int m = static_cast<int>(sizes.size());
  const schedule::Schedule& s = inference_schedule(m);
  StepData data;
  data.num_microbatches = m;
  data.inputs = split_microbatches(inputs, sizes);
  if (layout) {
    PIPETRAIN_CHECK_INPUT(layout->rows() == inputs[0].size(0) && inputs[0].dim() >= 2 &&
                              inputs[0].size(1) == layout->width(),
                          "the sequence layout (", layout->describe(),
                          ") does not match the input ", inputs[0].sizes());
    int64_t first = 0;
    for (int64_t size : sizes) {
      data.layouts.push_back(layout->slice(first, size, layout->width()));
      first += size;
    }
  }
  data.training = false;
  data.start = std::chrono::steady_clock::now();
  std::vector<RankResult> results = run_step(s, data);
  return join_microbatches(results[static_cast<size_t>(rt.stage_rank.back())].outputs);
}

const schedule::Schedule& PipeImpl::schedule() const {
  return *runtime().last;
}
int64_t PipeImpl::num_stages() const {
  return runtime().num_stages;
}
int64_t PipeImpl::num_ranks() const {
  return runtime().num_ranks;
}

torch::Device PipeImpl::stage_device(int64_t j) const {
  const Runtime& rt = runtime();
  PIPETRAIN_CHECK_INPUT(j >= 0 && j < rt.num_stages, "stage ", j, " is out of range (",
                        rt.num_stages, " stages)");
  return rt.stages[static_cast<size_t>(j)]->device();
}

std::vector<int64_t> PipeImpl::rank_peak_stashed_bytes() const {
  std::vector<int64_t> peaks;
  for (const auto& rank : runtime().rank_stash) peaks.push_back(rank ? rank->peak : 0);
  return peaks;
}

std::vector<StageAccounting> PipeImpl::stage_accounting() const {
  std::vector<StageAccounting> result;
  for (const auto& stage : runtime().stages) result.push_back(stage->accounting());
  return result;
}

const std::vector<ActionEvent>& PipeImpl::last_events() const {
  return runtime().events;
}

void PipeImpl::manual_seed(uint64_t seed) {
  for (auto& stage : runtime().stages) stage->rng().seed(stage_seed(seed, stage->index()));
}

std::map<int, torch::Tensor> PipeImpl::stage_rng_states() const {
  std::map<int, torch::Tensor> states;
  for (auto& stage : runtime().stages) states[stage->index()] = stage->rng().state();
  return states;
}

void PipeImpl::restore_stage_rng_states(const std::map<int, torch::Tensor>& states) {
  for (auto& stage : runtime().stages) {
    auto found = states.find(stage->index());
    if (found != states.end()) stage->rng().set_state(found->second);
  }
}

}  // namespace pipetrain
