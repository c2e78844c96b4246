// Predicted and measured memory per rank (pipetrain/train/memory_report.h).
#include "pipetrain/train/memory_report.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <set>
#include <sstream>

#include "pipetrain/base/check.h"
#include "pipetrain/base/error.h"
#include "pipetrain/partition/profiler.h"
#include "pipetrain/stage/allocation_counter.h"
#include "pipetrain/stage/microbatch.h"
#include "pipetrain/train/optimizer.h"
#include "pipetrain/train/sharded_optimizer.h"

namespace pipetrain::train {
namespace {

namespace pp = pipetrain::partition;

int64_t parameter_bytes(const std::vector<torch::Tensor>& parameters) {
  int64_t total = 0;
  for (const torch::Tensor& p : unique_parameters(parameters))
    total += static_cast<int64_t>(p.numel()) * static_cast<int64_t>(p.element_size());
  return total;
}

// What the loss keeps for its backward on one micro-batch: its saved tensors and the (weighted)
// loss itself, counted as a stage counts them. Under bf16 the model runs under autocast and the
// loss takes a float32 copy of the output (stage.cpp casts the outputs before the loss hook).
int64_t loss_bytes(torch::nn::Sequential& model, const torch::Tensor& inputs,
                   const torch::Tensor& targets, const LossFn& loss, Precision precision) {
  torch::Tensor output;
  {
    const AutocastGuard autocast(precision, inputs.device());
    output = model->forward(inputs);
  }
  return loss_saved_bytes(output, targets, loss, precision);
}

}  // namespace

int64_t loss_saved_bytes(const torch::Tensor& model_output, const torch::Tensor& targets,
                         const LossFn& loss, Precision precision) {
  torch::Tensor output = model_output;
  const bool cast_counts = precision != Precision::kFloat32;
  if (!cast_counts && output.is_floating_point() && output.scalar_type() != torch::kFloat)
    output = output.to(torch::kFloat);
  AllocationCounter counter;
  torch::Tensor value;
  {
    CountAllocations guard(counter);
    // The runtime weights each micro-batch's loss. Under bf16 the float32 copy of the output is a
    // temporary: it stays only where the loss saves it.
    value = loss(cast_counts && output.is_floating_point() ? output.to(torch::kFloat) : output,
                 targets) *
            0.5;
  }
  return counter.live_bytes();
}

std::vector<MeasuredRankMemory> measure_memory(StepRunner& runner,
                                               const torch::optim::Optimizer* optimizer,
                                               const ShardedOptimizer* sharded) {
  std::vector<MeasuredRankMemory> ranks;
  for (const StepRunner::RankHoldings& holding : runner.rank_holdings()) {
    MeasuredRankMemory rank;
    rank.rank = holding.rank;
    rank.first_stage = holding.stages.empty() ? 0 : holding.stages.front();
    rank.bytes.parameters = parameter_bytes(holding.parameters);
    if (sharded) {
      // This rank's part (one process may run several ranks over one sharded optimizer).
      const ShardedOptimizer::Holdings held = sharded->holdings(holding.parameters);
      rank.bytes.parameters = held.parameters;
      rank.bytes.gradients = held.gradients;
      // Offloaded, the state is host memory, with the shard's values and gradient.
      rank.bytes.optimizer_state = sharded->offloaded() ? 0 : held.optimizer_state;
      rank.bytes.offloaded += held.host;
      rank.bytes.reduce_buffers = held.reduce_buffers;
      rank.bytes.step_gradients = held.step_gradients;
      if (sharded->stage() == 3) {
        rank.bytes.gathered = sharded->peak_whole_parameter_bytes();
        rank.bytes.gather_buffers = sharded->peak_gather_buffer_bytes();
      }
    } else {
      rank.bytes.reduce_buffers = holding.reduce_buffer_bytes;
      rank.bytes.gradients = gradient_bytes(holding.parameters);
      rank.bytes.optimizer_state =
          optimizer ? optimizer_state_bytes(*optimizer, holding.parameters) : 0;
    }
    rank.bytes.activations = holding.peak_activation_bytes;
    rank.bytes.receive_buffers = holding.peak_receive_buffer_bytes;
    rank.bytes.send_buffers = holding.peak_send_buffer_bytes;
    rank.bytes.offloaded += holding.peak_offloaded_bytes;
    ranks.push_back(rank);
  }
  return ranks;
}

std::vector<MeasuredRankMemory> gather_memory(StepRunner& runner,
                                              const std::vector<MeasuredRankMemory>& mine) {
  const int total = runner.total_ranks();
  if (total == static_cast<int>(mine.size())) return mine;  // every rank is in this process
  // Each rank fills its own row of a (ranks x [first stage, the categories]) table; the sum over
  // ranks then holds every row (exact: byte counts are far below 2^53).
  constexpr int kColumns = 1 + pp::RankMemory::kCategories;
  std::vector<MeasuredRankMemory> all(static_cast<size_t>(total));
  for (int r = 0; r < total; ++r) {
    all[static_cast<size_t>(r)].rank = r;
    for (int c = 0; c < kColumns; ++c) {
      double value = 0;
      for (const MeasuredRankMemory& m : mine) {
        if (m.rank != r) continue;
        value = c == 0 ? m.first_stage : static_cast<double>(m.bytes[c - 1]);
      }
      const auto summed = static_cast<int64_t>(runner.sum_over_ranks(value));
      if (c == 0) {
        all[static_cast<size_t>(r)].first_stage = static_cast<int>(summed);
      } else {
        all[static_cast<size_t>(r)].bytes[c - 1] = summed;
      }
    }
  }
  return runner.is_main() ? all : mine;
}

namespace {

// What the memory model covers.
void check_memory_run(const PipeOptions& pipe, const MemoryRunOptions& run) {
  PIPETRAIN_CHECK_INPUT(pipe.precision() != Precision::kFloat16,
                        "the memory model predicts float32 and bf16 stages; --precision fp16 is "
                        "not covered (use fp32 or bf16)");
  PIPETRAIN_CHECK_INPUT(run.data_parallel >= 1, "data_parallel must be >= 1 (got ",
                        run.data_parallel, ")");
}

// The one device every parameter of `model` is on (the host for a model without parameters).
torch::Device parameters_device(torch::nn::Sequential& model) {
  std::optional<torch::Device> device;
  for (const auto& item : model->named_parameters()) {
    const torch::Device here = item.value().device();
    if (!device) device = here;
    PIPETRAIN_CHECK_INPUT(here == *device,
                          "the memory model profiles the whole model on one device, and its "
                          "parameters are on ",
                          device->str(), " and ", here.str(), " (", item.key(),
                          "); move the model to one device first");
  }
  return device.value_or(torch::Device(torch::kCPU));
}

}  // namespace

TrainingMemoryProfile profile_training_memory(torch::nn::Sequential model,
                                              const torch::Tensor& host_inputs,
                                              const torch::Tensor& host_targets, const LossFn& loss,
                                              const PipeOptions& pipe,
                                              const MemoryRunOptions& run) {
  if (run.device) {
    for (const torch::Tensor& parameter : model->parameters()) {
      if (parameter.device() != *run.device) {
        model->to(*run.device);
        break;
      }
    }
  }
  const torch::Device device = parameters_device(model);
  const torch::Tensor inputs = host_inputs.to(device);
  const torch::Tensor targets = host_targets.to(device);
  check_memory_run(pipe, run);
  const int64_t layers = static_cast<int64_t>(model->size());
  std::vector<int> balance;
  for (int64_t count : stage_balance(pipe, layers)) balance.push_back(static_cast<int>(count));

  // The rows one replica runs, cut into micro-batches as the runtime cuts them.
  const int64_t share = microbatch_sizes(inputs.size(0), run.data_parallel).front();
  const std::vector<int64_t> sizes = microbatch_sizes(share, pipe.chunks());
  TrainingMemoryProfile measured;
  measured.microbatches = static_cast<int>(sizes.size());
  measured.microbatch_size = *std::max_element(sizes.begin(), sizes.end());
  const int64_t m = measured.microbatch_size;
  pp::ModelProfile& profile = measured.profile;
  profile = pp::profile_sequential(model, inputs.narrow(0, 0, m),
                                   pp::ProfileOptions()
                                       .microbatch_sizes({m})
                                       .warmup(0)
                                       .repeats(1)
                                       .min_trial_seconds(0)
                                       .measure_transfer(false)
                                       .intra_op_threads(static_cast<int>(pipe.threads_per_stage()))
                                       .precision(pipe.precision()));
  measured.loss_bytes =
      loss_bytes(model, inputs.narrow(0, 0, m), targets.narrow(0, 0, m), loss, pipe.precision());
  if (pipe.precision() != Precision::kFloat32) {
    // Each stage's layers as the stage runs them: from its input in the wire dtype, not from what
    // the previous layer made under autocast (pp::profile_stage_chain). Skips crossing a stage
    // boundary keep the whole-model figures.
    std::vector<std::pair<int64_t, pp::StageChain>> chains;
    torch::Tensor input = inputs.narrow(0, 0, m);
    int64_t first = 0;
    bool skips = false;
    for (int count : balance) {
      pp::StageChain chain =
          pp::profile_stage_chain(model, first, first + count, input, pipe.precision());
      skips = skips || chain.skips_in_flight;
      input = chain.output;
      chains.emplace_back(first, std::move(chain));
      first += count;
    }
    if (!skips) {
      for (const auto& [start, chain] : chains) {
        for (size_t k = 0; k < chain.activation_bytes.size(); ++k) {
          pp::LayerCost& cost = profile.layers[static_cast<size_t>(start) + k].costs.at(0);
          cost.activation_bytes = chain.activation_bytes[k];
          cost.split_activation_bytes = chain.split_activation_bytes[k];
          // The chain starts at the stage's first layer, which begins a segment there.
          if (k == 0) cost.split_first_activation_bytes = chain.split_activation_bytes[0];
        }
      }
    }
  }
  if (run.adjust_profile) run.adjust_profile(profile);
  return measured;
}

MemoryPrediction predict_from_profile(const TrainingMemoryProfile& measured,
                                      const PipeOptions& pipe, const MemoryRunOptions& run) {
  check_memory_run(pipe, run);
  std::vector<int> balance;
  for (int64_t count : stage_balance(pipe, measured.profile.num_layers())) {
    balance.push_back(static_cast<int>(count));
  }
  const int stages = static_cast<int>(balance.size());
  const int ranks = stages / static_cast<int>(pipe.virtual_stages());
  const schedule::Schedule schedule =
      training_schedule_for(pipe, ranks, stages, measured.microbatches);
  MemoryPrediction prediction;
  prediction.microbatch_size = measured.microbatch_size;
  prediction.loss_bytes = measured.loss_bytes;
  prediction.stage_rank = schedule.stage_rank;
  pp::MemoryModelOptions options;
  options.checkpoint = pipe.checkpoint();
  options.optimizer_state_multiple = pp::optimizer_state_multiple(run.optimizer, run.momentum);
  options.zero = run.zero;
  options.reshard_after_forward = run.reshard_after_forward;
  options.zero_policy = zero_memory_policy(run.zero_options, pipe);
  options.offload_optimizer = run.offload_optimizer;
  options.optimizer_state_in_files = run.offload_optimizer && run.zero_options.offload_to_nvme();
  options.parameters_in_files =
      options.optimizer_state_in_files && run.zero_options.offload_params_to_nvme();
  // On CPU stages the shard's gradient goes to the files with the values (ShardedOptimizer: not
  // staged); from a GPU it is staged in host memory.
  const bool on_gpu = (run.device && run.device->is_cuda()) ||
                      std::any_of(pipe.devices().begin(), pipe.devices().end(),
                                  [](const torch::Device& d) { return d.is_cuda(); });
  options.gradients_in_files = options.parameters_in_files && !on_gpu;
  if (options.optimizer_state_in_files) {
    options.offload_buffer_bytes = pool_bytes(run.zero_options.nvme());
  }
  options.async_checkpoint = run.async_checkpoint;
  options.cast_gathers = gathers_narrowed(
      ZeroOptions().stage(run.zero).cast_gather(run.cast_gather), pipe.precision());
  if (options.cast_gathers) {
    options.narrowed_element_bytes =
        static_cast<int64_t>(c10::elementSize(compute_dtype(pipe.precision())));
  }
  options.data_parallel = run.data_parallel;
  options.expert_parallel = run.expert_parallel;
  options.processes = run.processes;
  options.loss_bytes = prediction.loss_bytes;
  options.offload = pipe.offload_activations();
  // A GPU rank's offloaded inputs leave its memory; a CPU rank's stay (its memory is the host's).
  for (const torch::Device& device : pipe.devices()) {
    options.offload_frees_stash.push_back(device.is_cuda());
  }
  prediction.ranks =
      pp::predict_memory(measured.profile, balance, measured.microbatch_size, schedule, options);
  return prediction;
}

MemoryPrediction predict_training_memory(torch::nn::Sequential model, const torch::Tensor& inputs,
                                         const torch::Tensor& targets, const LossFn& loss,
                                         const PipeOptions& pipe, const MemoryRunOptions& run) {
  return predict_from_profile(profile_training_memory(model, inputs, targets, loss, pipe, run),
                              pipe, run);
}

std::string offload_report_text(const std::vector<StepRunner::RankHoldings>& ranks,
                                bool cpu_stages) {
  std::ostringstream text;
  text << "activation offload, last step: checkpointed micro-batches' inputs in host memory at "
          "most\n";
  for (const auto& rank : ranks) {
    char line[96];
    std::snprintf(line, sizeof line, "  rank %d: %.2f MiB\n", rank.rank,
                  static_cast<double>(rank.peak_offloaded_bytes) / (1 << 20));
    text << line;
  }
  if (cpu_stages) {
    text << "  (CPU stages: host memory is the stages' own, so nothing moved and nothing was "
            "freed; the activations above are still counted as stashed)\n";
  }
  return text.str();
}

std::string memory_report_text(const MemoryPrediction& predicted,
                               const std::vector<MeasuredRankMemory>& measured) {
  std::ostringstream out;
  char line[200];
  std::snprintf(line, sizeof line, "memory: %4s %5s  %-17s %12s %12s %9s\n", "rank", "stage",
                "category", "predicted", "measured", "meas/pred");
  out << line;
  for (const MeasuredRankMemory& rank : measured) {
    const int stage = rank.first_stage;
    const int pipeline_rank = stage >= 0 && stage < static_cast<int>(predicted.stage_rank.size())
                                  ? predicted.stage_rank[static_cast<size_t>(stage)]
                                  : -1;
    if (pipeline_rank < 0 || pipeline_rank >= static_cast<int>(predicted.ranks.size())) continue;
    const pp::RankMemory& expected = predicted.ranks[static_cast<size_t>(pipeline_rank)];
    for (int c = 0; c < pp::RankMemory::kCategories; ++c) {
      const int64_t p = expected[c];
      const int64_t got = rank.bytes[c];
      char ratio[32];
      if (p > 0) {
        std::snprintf(ratio, sizeof ratio, "%.3f", static_cast<double>(got) / p);
      } else {
        std::snprintf(ratio, sizeof ratio, "%s", got == 0 ? "=" : "-");
      }
      std::snprintf(line, sizeof line, "memory: %4d %5d  %-17s %12s %12s %9s\n", rank.rank, stage,
                    pp::memory_category_name(c), pp::format_bytes(p).c_str(),
                    pp::format_bytes(got).c_str(), ratio);
      out << line;
    }
  }
  return out.str();
}

}  // namespace pipetrain::train
