// The memory check before a run starts (pipetrain/tune/memory_check.h).
#include "pipetrain/tune/memory_check.h"

#include <malloc.h>

#include <algorithm>
#include <functional>

#include <torch/torch.h>

#include "pipetrain/models/llama.h"
#include "pipetrain/models/llama_profile.h"
#include "pipetrain/stage/allocation_counter.h"
#include "pipetrain/stage/microbatch.h"
#include "pipetrain/stage/tensor_bytes.h"
#include "pipetrain/transport/c10d.h"
#include "pipetrain/tune/calibration.h"

namespace pipetrain::tune {
namespace {

// The rows one replica's micro-batches hold: their count and the largest's rows.
std::pair<int, std::int64_t> microbatches_of(const MemoryCheckInput& input) {
  const std::int64_t share =
      microbatch_sizes(input.inputs.size(0), input.run.data_parallel).front();
  const std::vector<std::int64_t> sizes = microbatch_sizes(share, input.pipe.chunks());
  return {static_cast<int>(sizes.size()), *std::max_element(sizes.begin(), sizes.end())};
}

// The vocabulary tables' layers are profiled on tables of this many rows and half as many, their
// bytes extended to the whole vocabulary (models/llama_profile.h): the check, which runs in the
// launching process before the ranks start, does not hold a table of the run's size with its
// gradient (1.78 GiB at Qwen2-1.5B's vocabulary and width).
constexpr std::int64_t kProfiledTableRows = 4096;
// The decoder layer likewise, its MLP profiled at this width and half of it (a Qwen2-1.5B-shaped
// layer, 8960 wide, is profiled at 15.8 M parameters rather than 46.8 M).
constexpr std::int64_t kProfiledMlpWidth = 1024;

// A Llama-family model's memory profile without building it: one decoder layer measured, and the
// loss's saved bytes measured on logits of the run's shape.
train::TrainingMemoryProfile llama_memory_profile(const MemoryCheckInput& input) {
  train::TrainingMemoryProfile measured;
  std::tie(measured.microbatches, measured.microbatch_size) = microbatches_of(input);
  const std::int64_t m = measured.microbatch_size;
  const torch::Tensor ids = input.inputs.narrow(0, 0, m);
  parallel::TensorParallel tp;
  if (input.tensor_parallel > 1) {
    tp =
        parallel::TensorParallel{C10dGroup::mirror(input.tensor_parallel), input.sequence_parallel};
  }
  measured.profile = models::profile_llama(
      *input.llama, ids,
      partition::ProfileOptions()
          .microbatch_sizes({m})
          .warmup(0)
          .repeats(1)
          .min_trial_seconds(0)
          .measure_transfer(false)
          .precision(input.pipe.precision()),
      0, tp, kProfiledTableRows, kProfiledMlpWidth,
      input.expert_parallel > 1
          ? parallel::ExpertParallel{C10dGroup::mirror(input.expert_parallel), nullptr}
          : parallel::ExpertParallel{},
      input.context_parallel > 1
          ? parallel::ContextParallel{C10dGroup::mirror(input.context_parallel), input.ulysses}
          : parallel::ContextParallel{});
  // The sequence a rank's MoE layer sees: its tp slice under sequence parallelism.
  models::apply_routing_imbalance(
      measured.profile, *input.llama,
      ids.size(1) / (input.sequence_parallel ? input.tensor_parallel : 1), input.expert_parallel,
      input.routing_imbalance, input.pipe.precision());
  const std::int64_t vocabulary = input.llama->vocab_size / input.tensor_parallel;
  const torch::Tensor logits = torch::zeros({m, ids.size(1), vocabulary});
  const torch::Tensor targets = input.targets.narrow(0, 0, m);
  measured.loss_bytes = train::loss_saved_bytes(
      logits, targets,
      input.tensor_parallel > 1
          ? LossFn([&tp](const torch::Tensor& out, const torch::Tensor& target) {
              return models::vocab_parallel_causal_lm_loss(out, target, tp);
            })
          : LossFn(models::causal_lm_loss),
      input.pipe.precision());
  return measured;
}

}  // namespace

std::int64_t evaluation_forward_bytes(torch::nn::Sequential model, const torch::Tensor& inputs) {
  const bool training = model->is_training();
  model->eval();  // as the evaluation runs it: no dropout, batch norms on their statistics
  torch::NoGradGuard no_grad;
  AllocationCounter counter;
  std::int64_t most = 0;
  {
    CountAllocations counting(counter);
    torch::Tensor x = inputs.clone();  // counted: the batch the evaluation slices
    for (auto& layer : *model) {
      torch::Tensor y = layer.any_forward(x).get<torch::Tensor>();
      most = std::max(most, counter.live_bytes());  // the input and the output at once
      x = std::move(y);
    }
  }
  model->train(training);
  return most;
}

namespace {

// The model's memory profile for the check: a Llama-family config's from one decoder layer, or
// the built model's, leaving the run's random generator and the model as they were.
train::TrainingMemoryProfile measure(const MemoryCheckInput& input) {
  train::TrainingMemoryProfile measured;
  if (input.llama) {
    // It builds and runs layers of its own (drawing their weights): the random generator is put
    // back, so that the run draws what it would have drawn without the check.
    RandomStateGuard random;
    measured = llama_memory_profile(input);
  } else {
    // The profile runs the model in training mode (batch norms update their statistics, inputs
    // may be drawn at random): the run that follows must not see it.
    torch::nn::Sequential model = input.model;
    ModelStateGuard guard(model, /*copy_parameters=*/false);
    measured = train::profile_training_memory(model, input.inputs, input.targets, input.loss,
                                              input.pipe, input.run);
  }
  return measured;
}

using Predict = std::function<std::vector<partition::RankMemory>(const std::string& settings)>;

// The prediction of the run with `settings` applied ("--zero 3", "--checkpoint always",
// "--offload-optimizer cpu|nvme", "--offload-params nvme"; "" for the run as given).
Predict predictor(const train::TrainingMemoryProfile& measured, const MemoryCheckInput& input) {
  return [&measured, &input](const std::string& settings) {
    PipeOptions pipe = input.pipe;
    train::MemoryRunOptions run = input.run;
    if (settings.find("--checkpoint always") != std::string::npos)
      pipe.checkpoint(Checkpoint::kAlways);
    const std::size_t zero = settings.find("--zero ");
    if (zero != std::string::npos) {
      run.zero = settings[zero + 7] - '0';
      run.reshard_after_forward = false;
    }
    if (settings.find("--offload-optimizer cpu") != std::string::npos) {
      run.offload_optimizer = true;
      run.zero_options.offload_to_nvme(false);
    }
    if (settings.find("--offload-optimizer nvme") != std::string::npos) {
      run.offload_optimizer = true;
      run.zero_options.offload_to_nvme(true);
    }
    if (settings.find("--offload-params nvme") != std::string::npos) {
      run.zero_options.offload_params_to_nvme(true);
    }
    return train::predict_from_profile(measured, pipe, run).ranks;
  };
}

bool on_host(const MemoryCheckInput& input) {
  return std::all_of(input.pipe.devices().begin(), input.pipe.devices().end(),
                     [](const torch::Device& d) { return d.is_cpu(); });
}

// The evaluation between steps, where the run has one (train/memory_fit.h, ProcessExtra).
train::ProcessExtra evaluation_extra(const MemoryCheckInput& input) {
  if (!input.evaluation_inputs.defined() || !input.model) return {};
  const std::int64_t forward = evaluation_forward_bytes(input.model, input.evaluation_inputs);
  std::int64_t whole = 0;
  for (const torch::Tensor& p : input.model->parameters()) whole += tensor_bytes(p);
  return [&input, forward, whole](const std::vector<partition::RankMemory>& ranks, int p) {
    if (p != input.evaluation_process) return std::int64_t{0};
    return train::evaluation_extra_bytes(
        ranks, input.ranks_of_process.at(static_cast<std::size_t>(p)), whole, forward);
  };
}

}  // namespace

train::MemoryFit check_run_memory(const MemoryCheckInput& input) {
  const train::TrainingMemoryProfile measured = measure(input);
  const Predict predict = predictor(measured, input);
  std::vector<std::string> alternatives;
  const bool always = input.pipe.checkpoint() == Checkpoint::kAlways;
  for (int zero = input.run.zero + 1; zero <= 3 && input.run.data_parallel > 1; ++zero) {
    alternatives.push_back("--zero " + std::to_string(zero));
  }
  if (!always) {
    alternatives.push_back("--checkpoint always");
    for (int zero = input.run.zero + 1; zero <= 3 && input.run.data_parallel > 1; ++zero) {
      alternatives.push_back("--zero " + std::to_string(zero) + " --checkpoint always");
    }
  }
  // On CPU stages the model states are the machine's memory: the optimizer state (and at ZeRO 3
  // the parameter shards) in files under --offload-dir is what fits a larger model. The offload
  // shards at one replica too.
  const bool host = on_host(input);
  const bool in_files = input.run.offload_optimizer && input.run.zero_options.offload_to_nvme();
  if (host && !in_files) {
    const std::string dir = " --offload-dir DIR";
    const std::string stage = "--zero " + std::to_string(std::max(input.run.zero, 1));
    std::vector<std::string> offloads = {
        stage + " --offload-optimizer nvme" + dir,
        "--zero 3 --offload-optimizer nvme --offload-params nvme" + dir};
    if (input.run.zero == 3) offloads.erase(offloads.begin());
    for (const std::string& o : offloads) alternatives.push_back(o);
    if (!always) {
      for (const std::string& o : offloads) alternatives.push_back(o + " --checkpoint always");
    }
  } else if (host && input.run.zero == 3 && in_files &&
             !input.run.zero_options.offload_params_to_nvme()) {
    alternatives.push_back("--offload-params nvme");
    if (!always) alternatives.push_back("--offload-params nvme --checkpoint always");
  }
  const train::ProcessExtra evaluation = evaluation_extra(input);
  // What the profile freed goes back to the system first: this process's resident memory then
  // stands for what every process holds before its model (the heap kept freed blocks of the
  // profile's layers: 0.2 GiB over 4 processes at Qwen2-1.5B's width).
  malloc_trim(0);
  return train::check_memory_fit(predict, alternatives, input.ranks_of_process,
                                 train::resident_bytes(), train::host_available_memory(),
                                 input.budget_per_rank, evaluation, host);
}

ZeroLadder walk_memory_ladder(const MemoryCheckInput& input, bool nvme_possible) {
  const train::TrainingMemoryProfile measured = measure(input);
  const Predict predict = predictor(measured, input);
  const bool host = on_host(input);
  const train::ProcessExtra evaluation = evaluation_extra(input);
  malloc_trim(0);
  const std::int64_t process_bytes = train::resident_bytes();
  const train::AvailableMemory available = train::host_available_memory();
  const int replicas = input.run.data_parallel;
  ZeroLadder ladder;
  for (const ZeroRung& rung : zero_ladder()) {
    ZeroLadderStep step;
    step.rung = rung;
    step.why = zero_rung_not_tried(rung, ladder.chosen >= 0, replicas, host);
    if (step.why.empty() && rung.nvme && !nvme_possible) {
      step.why = "skipped: give --offload-dir DIR for the files";
    }
    if (step.why.empty()) {
      step.tried = true;
      try {
        // The rung's own flags, as the predictor reads them (--offload-params cpu and
        // --offload-dir change no prediction).
        const train::MemoryFit fit = train::check_memory_fit(
            [&](const std::string&) { return predict(rung.flags); }, {}, input.ranks_of_process,
            process_bytes, available, input.budget_per_rank, evaluation, host);
        for (std::size_t r = 0; r < fit.run.rank_peaks.size(); ++r) {
          const std::int64_t bytes =
              fit.run.rank_peaks[r] +
              (host && r < fit.run.rank_host.size() ? fit.run.rank_host[r] : std::int64_t{0});
          step.rank_bytes = std::max(step.rank_bytes, bytes);
        }
        step.machine_bytes = fit.run.needed;
        step.fits = fit.fits();
        if (step.fits) {
          step.why = "fits";
          ladder.chosen = static_cast<int>(ladder.steps.size());
        } else if (input.budget_per_rank > 0) {
          step.why =
              "over --memory-limit " + partition::format_bytes(input.budget_per_rank) + " a rank";
        } else {
          step.why = "over the machine's " + partition::format_bytes(available.bytes) + " (" +
                     available.source + ")";
        }
        if (!step.fits && rung.offload_optimizer && !rung.nvme && host) {
          step.why += "; on CPU stages what it offloads stays in the host's memory";
        }
      } catch (const BadInput& error) {
        step.tried = false;
        step.why = std::string("skipped: ") + error.what();
      }
    }
    ladder.steps.push_back(step);
  }
  return ladder;
}

}  // namespace pipetrain::tune
