// What a training run reports (training_parts.h): the start, the result and --report-memory's
// table, as the lines the CLI prints.
#include <cmath>
#include <cstdio>

#include "pipetrain/base/format_text.h"

#include "pipetrain/base/atomic_file.h"
#include "pipetrain/examples/model_registry.h"
#include "pipetrain/models/llama.h"
#include "pipetrain/models/llama_profile.h"
#include "pipetrain/partition/memory.h"
#include "pipetrain/train/document_batches.h"
#include "pipetrain/train/memory_fit.h"
#include "pipetrain/train/memory_report.h"
#include "pipetrain/train/run_summary.h"
#include "training_parts.h"

namespace pipetrain::job::detail {
namespace {

// The data flags with --pad-multiple 0 resolved: sequence and context parallelism cut every row
// into parts.
ModelDataSpec with_pad_multiple(const TrainingSetup& s) {
  ModelDataSpec spec = s.data;
  if (spec.pad_multiple == 0) spec.pad_multiple = sequence_multiple(s);
  return spec;
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> modelled_batch(const Batches& batches,
                                                       const RunLayout& layout) {
  auto [inputs, targets] = batches.source().largest();
  const int64_t c = layout.context_parallel;
  if (c > 1) {
    inputs = inputs.reshape({-1, inputs.size(1) / c});
    targets = targets.reshape({-1, targets.size(1) / c});
  }
  return {inputs, targets};
}

namespace {

int64_t token_ids(const BuiltData& data) {
  int64_t ids = data.tokens ? data.tokens->tokens() : 0;
  for (const train::DocumentSource& source : data.document_sources) ids += source.dataset->tokens();
  return ids;
}

// The files written and what the last step left, on the main rank.
std::string files_text(const TrainingSetup& s, const train::TrainSummary& summary,
                       int64_t total_steps, int trace_rows) {
  const JobConfig& job = s.job;
  std::string out;
  if (!summary.checkpoint_path.empty()) {
    out += format_text("checkpoint: %s (step %lld)\n", summary.checkpoint_path.c_str(),
                       static_cast<long long>(total_steps));
  }
  if (!job.output.trace.empty()) {
    out += format_text(
        "trace: %s (%lld actions of %d ranks; open in chrome://tracing or ui.perfetto.dev)\n",
        job.output.trace.c_str(), static_cast<long long>(summary.trace_actions), trace_rows);
  }
  if (!job.output.timeline.empty()) {
    out += format_text("timeline: %s (measured step %lld)\n", job.output.timeline.c_str(),
                       static_cast<long long>(summary.timeline_step));
  }
  const std::string zero =
      job.zero.stage > 0
          ? ", ZeRO stage " + std::to_string(job.zero.stage) +
                (job.zero.offload_optimizer == "cpu"    ? ", the optimizer state in host memory"
                 : job.zero.offload_optimizer == "nvme" ? ", the optimizer state in files"
                                                        : "")
          : "";
  out += format_text(
      "memory: optimizer state %lld bytes, gradients %lld bytes held after the last step "
      "(rank 0%s)\n",
      static_cast<long long>(summary.optimizer_state_bytes),
      static_cast<long long>(summary.gradient_bytes), zero.c_str());
  if (summary.exposed_reduce_seconds > 0) {
    out += format_text(
        "data-parallel gradient sum: %.2f ms per step left after the schedule's last action "
        "(mean over ranks; %s)\n",
        summary.exposed_reduce_seconds * 1e3,
        s.pipeline.overlap_grad_reduce ? "overlapped with the pipeline in buckets"
                                       : "one blocking all-reduce");
  }
  if (summary.transport_bytes_sent > 0) {
    out += format_text(
        "transport: %lld tensor bytes sent between ranks over %lld steps (every rank, %s)\n",
        static_cast<long long>(summary.transport_bytes_sent), static_cast<long long>(summary.steps),
        to_string(s.pipeline.precision));
  }
  return out;
}

}  // namespace

Batches::Batches(const TrainingSetup& setup, const BuiltModel& model, const BuiltData& data)
    : setup_(setup),
      source_(make_batches(with_pad_multiple(setup), model, data, setup.job.training.batch_size)) {}

int64_t Batches::total_steps() const {
  const TrainingSettings& t = setup_.job.training;
  return t.steps > 0 ? t.steps : source_->steps_in_epochs(t.epochs);
}

int64_t Batches::epochs() const {
  return source_->epochs_begun(total_steps());
}

train::ProgressOptions rate_options(const TrainingSetup& s, const BuiltModel& model,
                                    const BuiltData& data) {
  const SampleCost cost = sample_cost(model, data);
  return train::ProgressOptions()
      .tokens_per_sample(cost.tokens)
      .flops_per_token(cost.flops_per_token)
      .peak_flops(s.peak.flops);
}

// The whole model's parameters: a Hugging Face model's from its config (a rank holds its
// tensor-parallel slices and expert-parallel experts only), another's as built.
int64_t model_parameters(const BuiltModel& model) {
  if (!model.llama) return examples::count_parameters(*model.sequential);
  int64_t total = 0;
  for (const models::HfTensorName& tensor : models::llama_hf_tensors(*model.llama)) {
    int64_t n = 1;
    for (int64_t d : tensor.shape) n *= d;
    total += n;
  }
  return total;
}

std::string start_text(const TrainingSetup& s, const Prepared& p, const Batches& batches,
                       train::StepRunner& runner, int threads) {
  const BuiltData& data = p.data;
  const std::string rows =
      data.corpus ? std::to_string(data.corpus->text().size()) + " characters"
      : data.documents > 0
          ? std::to_string(data.documents) + " documents, " + std::to_string(token_ids(data)) +
                " token ids" +
                (data.document_sources.size() < 2
                     ? ""
                     : " in a blend of " + std::to_string(data.document_sources.size()))
      : data.tokens ? std::to_string(data.tokens->tokens()) + " token ids"
                    : std::to_string(data.train_inputs.size(0)) + " rows";
  std::string out = format_text(
      "training %s (%zu layers, %lld parameters) on %s: %s, batch %lld, %s, %s lr %g, "
      "%d threads per rank\n",
      p.model.name.c_str(), p.model.sequential->size(),
      static_cast<long long>(model_parameters(p.model)), data.name.c_str(), rows.c_str(),
      static_cast<long long>(s.job.training.batch_size), runner.description().c_str(),
      s.job.optimizer.name.c_str(), s.job.optimizer.lr, threads);
  if (p.model.llama && s.peak.flops > 0) {
    out += format_text(
        "MFU: model FLOPs (6N + attention per token, recomputation not counted) over a peak of "
        "%s\n",
        train::describe_peak(s.peak).c_str());
  }
  if (const auto* documents = dynamic_cast<const train::DocumentBatches*>(&batches.source())) {
    out += "documents: " + documents->describe() + "\n";
  }
  if (data.corpus) {
    out += format_text(
        "corpus %s: vocabulary %lld, unigram entropy %.4f nats\n", data.corpus->source().c_str(),
        static_cast<long long>(data.corpus->vocab_size()), data.corpus->unigram_entropy());
  }
  if (p.resume) {
    out += format_text("resumed from %s at step %lld\n", s.resume.c_str(),
                       static_cast<long long>(p.resume->step));
  }
  return out;
}

std::string memory_report_text(const TrainingSetup& s, Prepared& p, const Batches& batches,
                               const train::TrainSummary& summary, const PipeOptions& pipe,
                               const RunLayout& layout) {
  if (summary.memory.empty()) return "";
  auto [inputs, targets] = modelled_batch(batches, layout);
  train::MemoryRunOptions run = memory_run_options(s, layout);
  BuiltModel mirrored;
  const BuiltModel* profiled = &p.model;
  // A context-parallel model attends over its group: the mirror attends alone.
  if (layout.tensor_parallel > 1 || s.job.parallel.ep > 1 || layout.context_parallel > 1) {
    mirrored = build_mirror_model(
        s.data, p.data, layout.tensor_parallel, s.job.parallel.sequence_parallel,
        static_cast<int>(s.job.parallel.ep), layout.context_parallel, s.pipeline.cp_ulysses);
    profiled = &mirrored;
  }
  // Profiled on the device this rank's first stage trained on.
  const std::vector<torch::Tensor> trained = p.model.sequential->parameters();
  if (!trained.empty()) run.device = trained.front().device();
  if (s.job.parallel.routing_imbalance != 1.0 && p.model.llama) {
    // The MoE layers' routed rows at the planned imbalance, as the memory check planned them.
    const int64_t sequence =
        inputs.size(1) / (s.job.parallel.sequence_parallel ? layout.tensor_parallel : 1);
    run.adjust_profile = [&, sequence](partition::ModelProfile& profile) {
      models::apply_routing_imbalance(profile, *p.model.llama, sequence,
                                      static_cast<int>(s.job.parallel.ep),
                                      s.job.parallel.routing_imbalance, pipe.precision());
    };
  }
  train::MemoryPrediction predicted;
  try {
    predicted = train::predict_training_memory(profiled->sequential, inputs, targets,
                                               profiled->loss, pipe, run);
  } catch (const pipetrain::Error& error) {
    throw BadInput(std::string("--report-memory: ") + error.what());
  }
  return format_text(
             "memory per rank after the last step (micro-batch %lld; activations and transport: "
             "peaks during that step):\n",
             static_cast<long long>(predicted.microbatch_size)) +
         train::memory_report_text(predicted, summary.memory);
}

std::string result_text(const TrainingSetup& s, const Prepared& p, const Batches& batches,
                        train::StepRunner& runner, const train::TrainSummary& result,
                        train::TrainingRate& rate) {
  std::string out = files_text(s, result, batches.total_steps(), runner.trace_rows());
  out += "memory: " + train::peak_memory_text(result.process_peak_bytes, p.predicted_memory) +
         "; every process:";
  for (int64_t peak : result.process_peak_bytes) out += " " + partition::format_bytes(peak);
  out += "\n";
  const train::ProgressOptions costs = rate_options(s, p.model, p.data);
  rate = train::training_rate(
      {result.seconds, result.samples, result.tokens, result.counted_targets}, costs);
  std::string rates;
  if (costs.tokens_per_sample() > 0 || result.tokens > 0) {
    rates += ", " + std::to_string(std::llround(rate.tokens_per_second)) + " tokens/s";
  }
  if (result.counted_targets > 0) {
    rates += ", " + std::to_string(std::llround(rate.targets_per_second)) + " targets/s";
  }
  if (rate.mfu > 0) rates += format_text(", MFU %.1f%%", 100.0 * rate.mfu);
  const std::string& summary_json = s.job.output.summary_json;
  if (!summary_json.empty()) {  // written atomically
    const std::string json = train::run_summary_json(result, rate, s.peak).dump(2) + "\n";
    try {
      write_file_atomically(summary_json, json);
    } catch (const pipetrain::Error& error) {
      throw BadInput("--summary-json: " + std::string(error.what()));
    }
  }
  out += format_text(
      "done: %lld steps in %.3f s (%.1f steps/s, %.1f samples/s%s), loss %.6f -> %.6f\n",
      static_cast<long long>(result.steps), result.seconds,
      result.seconds > 0 ? result.steps / result.seconds : 0.0, rate.samples_per_second,
      rates.c_str(), result.first_loss, result.last_loss);
  if (p.auto_plan && result.steps > 0) {
    // Measured over every step (the first one warms up): compare with the prediction.
    out += format_text("auto plan: measured %.3g s/step, predicted %.3g s/step\n",
                       result.seconds / static_cast<double>(result.steps),
                       p.auto_plan->predicted_step_seconds);
  }
  return out;
}

std::string checkpoint_text(const std::string& directory, const train::Trainer::SaveFigures& f) {
  std::string excess;
  if (f.peak_excess_bytes >= 0) {
    excess = ", peak +" + partition::format_bytes(f.peak_excess_bytes) + " (largest process)";
  }
  return format_text(
      "checkpoint %s: %.1f MiB by %d processes in %.3f s (%.1f MiB/s)%s", directory.c_str(),
      static_cast<double>(f.bytes) / (1 << 20), f.processes, f.seconds,
      f.seconds > 0 ? static_cast<double>(f.bytes) / (1 << 20) / f.seconds : 0.0, excess.c_str());
}

}  // namespace pipetrain::job::detail
