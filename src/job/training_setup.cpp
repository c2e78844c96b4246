// A training job resolved and checked (job/training_setup.h).
#include "pipetrain/job/training_setup.h"

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "job_internal.h"
#include "pipetrain/base/atomic_file.h"
#include "pipetrain/job/job_fields.h"
#include "pipetrain/parallel/expert_parallel.h"
#include "pipetrain/partition/memory.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/stage/precision.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain::job {
namespace {

using detail::contains;

[[noreturn]] void fail(const std::string& message) {
  throw BadInput(message);
}

// Runs `load`; an error of the library becomes BadInput("<flag>: <message>").
template <typename Load>
void as_flag_error(const std::string& flag, Load&& load) {
  try {
    load();
  } catch (const pipetrain::Error& error) {
    fail(flag + ": " + error.what());
  }
}

// --balance, --chunks, --virtual, --schedule and --checkpoint as the pipeline runs them, and what
// `auto` leaves to the planner (tune/auto_plan.h). The field checks have run.
void resolve_pipeline(const JobConfig& job, TrainingSetup& s) {
  const PipelineSettings& given = job.pipeline;
  PipelineRequest& p = s.pipeline;
  tune::AutoRequest& request = s.auto_request;
  p.stages = given.stages.value_or(1);
  p.stages_given = given.stages.has_value();
  p.schedule = given.schedule.empty() ? "1f1b" : given.schedule;
  p.schedule_file = given.schedule_file;
  p.checkpoint = given.checkpoint.empty() ? "except_last" : given.checkpoint;
  p.virtual_stages = given.virtual_stages.value_or(1);
  p.offload_activations = given.offload_activations;
  p.timeout = job.parallel.timeout;
  p.threads = static_cast<int>(given.threads);
  p.pp = static_cast<int>(job.parallel.pp);
  p.dp = static_cast<int>(job.parallel.dp);
  p.tp = static_cast<int>(job.parallel.tp);
  p.cp = static_cast<int>(job.parallel.cp);
  p.cp_ulysses = job.parallel.cp_method == "ulysses";
  p.device = given.device;
  p.devices = given.devices;
  p.overlap_grad_reduce = job.parallel.overlap_grad_reduce;
  p.ep_overlap = job.parallel.ep_overlap;
  p.bucket_mb = job.parallel.bucket_size;

  request.balance = given.balance.size() == 1 && given.balance.front() == "auto";
  if (!request.balance) {
    for (const std::string& text : given.balance) p.balance.push_back(std::stoll(text));
  }
  request.chunks = given.chunks == "auto";
  if (!given.chunks.empty() && !request.chunks) p.chunks = std::stoll(given.chunks);
  request.checkpoint = p.checkpoint == "auto";
  request.schedule = p.schedule == "auto";
  if (request.schedule) {
    // --schedule auto: everything the user did not give. An explicit --balance list fixes the
    // stage count K*V, so it fixes V too.
    request.chunks = request.chunks || given.chunks.empty();
    request.checkpoint = request.checkpoint || given.checkpoint.empty();
    request.balance = request.balance || given.balance.empty();
    request.virtual_stages = !given.virtual_stages && given.balance.empty();
  }
  // Each family's own chunk count when --virtual is not given (2 for the V-shaped ones).
  if (!given.virtual_stages && !request.schedule && p.schedule_file.empty() &&
      contains(schedule::schedule_names(), p.schedule)) {
    p.virtual_stages = schedule::default_virtual_stages(p.schedule);
  }
  p.precision = parse_precision(given.precision);
}

}  // namespace

int64_t job_chunks(const JobConfig& job) {
  TrainingSetup s;
  resolve_pipeline(job, s);
  return chunks_of(s.pipeline, layout_of(s.pipeline, static_cast<int>(job.parallel.nproc)));
}

namespace {

// The ZeRO options of --zero-gradients, --zero3-unit and the --zero3-* sizes.
train::ZeroOptions zero_options_of(const ZeroSettings& zero) {
  auto size = [](const std::string& text) { return partition::parse_bytes(text); };
  return train::ZeroOptions()
      .gradients(train::parse_zero_gradients(zero.gradients))
      .unit(train::parse_zero_unit(zero.unit))
      .prefetch_bytes(size(zero.prefetch))
      .max_live_bytes(size(zero.max_live))
      .max_reuse_distance(zero.max_reuse_distance == "-1" ? -1 : size(zero.max_reuse_distance))
      .persistence_threshold(size(zero.persistence_threshold))
      .return_freed_memory(!zero.keep_freed_memory)
      .quantized_weights(zero.quantized_weights)
      .hpz_partition_size(static_cast<int>(zero.hpz_partition_size))
      .quantized_gradients(zero.quantized_gradients)
      .offload_to_nvme(zero.offload_optimizer == "nvme")
      .offload_params_to_nvme(zero.offload_params == "nvme")
      .nvme(train::NvmeOptions()
                .dir(zero.offload_dir)
                .buffer_bytes(size(zero.offload_buffer_bytes))
                .buffer_count(static_cast<int>(zero.offload_buffer_count))
                .sub_group_size(zero.sub_group_size)
                .io(train::parse_offload_io(zero.offload_io)));
}

// The rows' widths that --sequence-parallel and --cp cut into equal parts: --seq-len and
// --pad-multiple (0: sequence_multiple itself) divisible by sequence_multiple. `what`: the flags
// that cut, for the message.
void check_sequence_cut(const TrainingSetup& s, const std::string& what) {
  const int64_t multiple = sequence_multiple(s);
  if (s.data.pad_multiple > 0 && s.data.pad_multiple % multiple != 0) {
    fail(what + " cuts each row into " + std::to_string(multiple) +
         " parts: give a --pad-multiple divisible by it (got " +
         std::to_string(s.data.pad_multiple) + "), or 0 for " + std::to_string(multiple));
  }
  if (s.data.seq_len % multiple != 0) {
    fail(what + " cuts each sample's --seq-len " + std::to_string(s.data.seq_len) + " ids into " +
         std::to_string(multiple) + " parts; give a --seq-len divisible by it");
  }
}

// What tensor parallelism covers so far: refused with the flag's name rather than run wrong.
void check_tensor_parallel(const TrainingSetup& s) {
  const int tp = s.pipeline.tp;
  const bool sequence_parallel = s.job.parallel.sequence_parallel;
  if (sequence_parallel && tp <= 1) {
    fail(
        "--sequence-parallel splits the sequence over the tensor-parallel ranks: give --tp 2 or "
        "more");
  }
  if (tp <= 1) return;
  if (sequence_parallel && s.pipeline.cp == 1)
    check_sequence_cut(s, "--sequence-parallel with --tp " + std::to_string(tp));
  if (!is_hf_model(s.data.model)) {
    fail(
        "--tp splits the layers of a Llama-family model: give --model DIR (a Hugging Face "
        "checkpoint directory); '" +
        s.data.model + "' has no tensor-parallel form");
  }
}

// --report-routing needs experts; a mixture's load-balancing term (output_router_logits) enters
// the backward inside the pipeline, where fp16's loss scale does not reach it
// (stage/auxiliary_loss.h).
// `config`: the Hugging Face --model's (nullopt for another model).
void check_auxiliary_loss(const TrainingSetup& s,
                          const std::optional<models::LlamaConfig>& config) {
  const bool fp16 = s.pipeline.precision == Precision::kFloat16;
  const bool sequence_parallel = s.job.parallel.sequence_parallel;
  if (s.job.output.report_routing && !(config && models::is_moe(config->architecture))) {
    fail("--report-routing reports a mixture of experts' routing, and --model " + s.data.model +
         " has no experts (a Qwen2-MoE, Qwen3-MoE or Mixtral directory has)");
  }
  if (sequence_parallel && config && config->aux_loss) {
    fail(
        "--sequence-parallel with a mixture whose config.json sets output_router_logits: each "
        "tensor-parallel rank would take the load-balancing term over its slice of the sequence, "
        "not over the micro-batch; drop --sequence-parallel, or set output_router_logits false");
  }
  if (fp16 && config && config->aux_loss) {
    fail(
        "--precision fp16 with a mixture whose config.json sets output_router_logits: the "
        "load-balancing term's gradient is not loss-scaled yet; use --precision bf16, or set "
        "output_router_logits false");
  }
}

// --ep: a mixture's experts over groups of data-parallel replicas, in a multi-process run.
void check_expert_parallel(const TrainingSetup& s,
                           const std::optional<models::LlamaConfig>& config) {
  const int ep = static_cast<int>(s.job.parallel.ep);
  if (s.job.parallel.ep_overlap) {
    // PipeOptions::overlap_expert_exchanges says why each of these.
    if (ep <= 1) {
      fail("--ep-overlap hides the expert all-to-alls of --ep 2 or more, and --ep is " +
           std::to_string(ep));
    }
    if (s.pipeline.checkpoint != "never") {
      fail("--ep-overlap needs --checkpoint never (got " + s.pipeline.checkpoint +
           "): a recompute beside a forward would wait for the random-number state the forward "
           "holds");
    }
    if (s.pipeline.tp > 1) {
      fail("--ep-overlap with --tp " + std::to_string(s.pipeline.tp) +
           ": both lanes would post the tensor-parallel group's collectives; give --tp 1");
    }
    if (s.job.zero.stage >= 2) {
      fail("--ep-overlap with --zero " + std::to_string(s.job.zero.stage) +
           ": ZeRO 2/3's gradient hooks and gathers would run on both lanes at once; give --zero "
           "0 or 1");
    }
    if (s.pipeline.device != "cpu") {
      fail("--ep-overlap runs on CPU stages (--device " + s.pipeline.device +
           "): CUDA runs a backward on its own threads, outside the second lane");
    }
  }
  const bool mixture = config && models::is_moe(config->architecture);
  parallel::check_routing_imbalance(s.job.parallel.routing_imbalance, mixture,
                                    mixture ? config->num_experts : 0,
                                    mixture ? config->num_experts_per_tok : 1, ep);
  if (ep <= 1) return;
  if (!(config && models::is_moe(config->architecture))) {
    fail("--ep " + std::to_string(ep) + " splits a mixture's experts, and --model " + s.data.model +
         " has none (a Qwen2-MoE, Qwen3-MoE or Mixtral directory has)");
  }
  if (s.pipeline.dp < 2) {
    fail("--ep " + std::to_string(ep) +
         " splits the experts over data-parallel replicas, and --dp " +
         std::to_string(s.pipeline.dp) + " has one: give --nproc and --dp (ep divides dp)");
  }
  parallel::check_expert_parallel(config->num_experts, ep, s.pipeline.dp);
  if (s.job.zero.plus_plus() || s.job.zero.ladder) {
    fail(std::string("--ep with ") + (s.job.zero.ladder ? "--zero-ladder" : "ZeRO++") +
         ": not built yet for experts sharded over their own replicas; give --zero 1, 2 or 3");
  }
}

// --cp: a Llama-family model's sequences split over context-parallel ranks. `config`: the
// Hugging Face --model's (nullopt for another model).
void check_context_parallel(const TrainingSetup& s,
                            const std::optional<models::LlamaConfig>& config) {
  const int cp = s.pipeline.cp;
  const std::string& method = s.job.parallel.cp_method;
  if (s.job.parallel.cp_serial_passes && (cp <= 1 || s.pipeline.cp_ulysses)) {
    fail("--cp-serial-passes waits for the passes of --cp's ring, and this run has " +
         (cp <= 1 ? std::string("--cp ") + std::to_string(cp) : std::string("Ulysses")) +
         ": give --cp 2 or more with --cp-method ring");
  }
  if (cp <= 1) {
    if (method != "ring") {
      fail("--cp-method " + method + " says how --cp splits attention, and --cp is " +
           std::to_string(cp) + ": give --cp 2 or more, or drop --cp-method");
    }
    return;
  }
  const std::string flag = "--cp " + std::to_string(cp) + " (" + method + ")";
  if (!config) {
    fail("--cp " + std::to_string(cp) +
         " splits the attention of a Llama-family model, and --model " + s.data.model +
         " has none that can be split: give --model DIR (a Hugging Face checkpoint directory)");
  }
  check_sequence_cut(s,
                     s.job.parallel.sequence_parallel
                         ? flag + " with --sequence-parallel --tp " + std::to_string(s.pipeline.tp)
                         : flag);
  if (s.pipeline.cp_ulysses) {
    const int64_t heads = config->num_attention_heads / std::max(1, s.pipeline.tp);
    if (heads % cp != 0) {
      const std::string which =
          s.pipeline.tp > 1 ? "each tensor-parallel rank's " + std::to_string(heads) + " heads do"
                            : "num_attention_heads (" + std::to_string(heads) + ") does";
      fail(flag + " gives each rank the whole sequence for 1/" + std::to_string(cp) +
           " of the attention heads, and " + which + " not divide by it; use --cp-method ring");
    }
  }
  if (!s.pipeline.cp_ulysses && on_cuda(s.pipeline)) {
    fail(flag +
         " on CUDA stages: the ring runs LibTorch's flash attention for the CPU (its per-row "
         "log-sum-exp); give --cp-method ulysses, or CPU stages");
  }
  if (s.job.parallel.ep > 1) {
    fail("--cp with --ep " + std::to_string(s.job.parallel.ep) +
         ": not built yet; give one of them");
  }
  if (config->aux_loss) {
    fail(flag +
         " with a mixture whose config.json sets output_router_logits: each rank would take "
         "the load-balancing term over its part of the sequence, not over the micro-batch; set "
         "output_router_logits false");
  }
}

// Names (schedule, schedule file) and flags that exclude each other.
void check_choices(const TrainingSetup& s) {
  check_tensor_parallel(s);
  // The model's config.json, read once for the checks that need it.
  const bool needs_config = s.job.parallel.ep > 1 || s.job.output.report_routing ||
                            s.job.parallel.routing_imbalance != 1.0 ||
                            s.pipeline.precision == Precision::kFloat16 ||
                            s.job.parallel.sequence_parallel || s.pipeline.cp > 1;
  const std::optional<models::LlamaConfig> config =
      needs_config && is_hf_model(s.data.model)
          ? std::optional<models::LlamaConfig>(hf_config(s.data))
          : std::nullopt;
  check_expert_parallel(s, config);
  check_context_parallel(s, config);
  check_auxiliary_loss(s, config);
  const PipelineRequest& p = s.pipeline;
  if (s.auto_request.any() && !p.schedule_file.empty()) {
    fail(
        "--schedule-file fixes the schedule, micro-batches and stages, so there is nothing for "
        "auto to plan; drop the auto flags or --schedule-file");
  }
  if (p.schedule_file.empty() && p.schedule == "custom") {
    fail("unknown --schedule 'custom'; valid: " + [] {
      std::string names;
      for (const auto& name : schedule::schedule_names())
        names += (names.empty() ? "" : ", ") + name;
      return names;
    }() + ", auto (or give --schedule-file for a custom one)");
  }
  if (!p.schedule_file.empty() && !s.job.pipeline.schedule.empty() && p.schedule != "custom") {
    fail("--schedule " + p.schedule + " and --schedule-file both say which schedule to run; " +
         "give only --schedule-file (or --schedule custom)");
  }
}

// The ranges that involve several flags, and the library's own checks of the trainer's options.
void check_ranges(const TrainingSetup& s) {
  const JobConfig& job = s.job;
  if (job.training.steps == -1 && s.data.data == "text") {
    fail("--data text has no epochs: give --steps N (N >= 1)");
  }
  train::check_restart_options(static_cast<int>(job.parallel.max_restarts),
                               static_cast<int>(job.parallel.nproc), job.checkpoint.dir);
  if (job.checkpoint.async && job.checkpoint.format != "sharded") {
    fail("--async-checkpoint writes sharded checkpoints; give --checkpoint-format sharded");
  }
  if (job.checkpoint.save_every > 0 && job.checkpoint.dir.empty()) {
    fail("--save-every needs --checkpoint-dir DIR (where the checkpoints are written)");
  }
  if (job.zero.offload_params != "none" && job.zero.stage != 3) {
    fail("--offload-params moves ZeRO-3's parameter shards; it needs --zero 3, got --zero " +
         std::to_string(job.zero.stage));
  }
  {
    const OptimizerSettings defaults;
    const OptimizerSettings& o = job.optimizer;
    if (s.pipeline.precision != Precision::kFloat16 &&
        (o.loss_scaler != defaults.loss_scaler ||
         o.initial_loss_scale != defaults.initial_loss_scale ||
         o.loss_scale_window != defaults.loss_scale_window ||
         o.loss_scale_hysteresis != defaults.loss_scale_hysteresis ||
         o.min_loss_scale != defaults.min_loss_scale ||
         o.loss_scale_consecutive_hysteresis != defaults.loss_scale_consecutive_hysteresis)) {
      fail("--loss-scaler and its settings scale the loss of --precision fp16, and this run is " +
           job.pipeline.precision + ": give --precision fp16, or drop them");
    }
    if (o.loss_scaler == "deepspeed" && o.min_loss_scale > o.initial_loss_scale) {
      fail("--min-loss-scale " + std::to_string(o.min_loss_scale) +
           " is above --initial-loss-scale " + std::to_string(o.initial_loss_scale));
    }
  }
  if (job.zero.plus_plus()) {
    if (job.zero.ladder) {
      fail(
          "--zero-ladder picks the ZeRO stage, and ZeRO++ (--zero-quantized-weights, "
          "--zero-hpz-partition-size, --zero-quantized-gradients) asks for one: give --zero "
          "instead of the ladder");
    }
    const std::string flag = job.zero.quantized_weights         ? "--zero-quantized-weights"
                             : job.zero.hpz_partition_size != 1 ? "--zero-hpz-partition-size"
                                                                : "--zero-quantized-gradients";
    if (job.zero.stage == 0) {
      fail(flag +
           " is part of ZeRO++, which shards over data-parallel replicas: give --zero 3 "
           "(--zero 1-3 for --zero-quantized-gradients)");
    }
    if (s.pipeline.dp < 2) {
      fail(flag + " changes what data-parallel replicas send each other, and --dp " +
           std::to_string(s.pipeline.dp) + " has none to send to: give --dp 2 or more");
    }
    train::check_zero_plus_plus(
        train::ZeroOptions(s.zero_options).stage(static_cast<int>(job.zero.stage)),
        static_cast<int>(s.pipeline.dp));
    if (job.zero.quantized_gradients && job.parallel.ranks_per_host > 0 && job.parallel.nproc > 1) {
      // Every data-parallel group's hosts, as the ranks will find them (the launcher checks; a
      // rank's optimizer checks its own group).
      const RunLayout run = layout_of(s.pipeline, static_cast<int>(job.parallel.nproc));
      const ParallelLayout grid{run.pipeline_ranks, run.replicas, run.tensor_parallel};
      for (int p = 0; p < grid.pipeline_ranks; ++p) {
        for (int t = 0; t < grid.tensor_parallel; ++t) {
          train::hosts_of_replicas(grid.data_parallel_ranks(p, t),
                                   static_cast<int>(job.parallel.ranks_per_host),
                                   "of pipeline rank " + std::to_string(p));
        }
      }
    }
  }
  if (job.zero.offload_params == "nvme" && job.zero.offload_optimizer != "nvme") {
    fail(
        "--offload-params nvme keeps the parameter shards in the optimizer's offload files; give "
        "--offload-optimizer nvme too");
  }
  if (job.zero.offload_params == "cpu" && on_cuda(s.pipeline)) {
    fail(
        "--offload-params cpu (CUDA stages' parameter shards in host memory) is not built yet; "
        "--offload-params nvme is");
  }
  if (job.zero.offload_optimizer == "nvme") {
    train::check_nvme_options(s.zero_options.nvme());
    train::check_nvme_directory(s.zero_options.nvme(), 0, "--offload-optimizer nvme");
    const int64_t fields = offload_file_fields(s);
    if (job.zero.offload_buffer_count < fields) {
      fail("--offload-buffer-count " + std::to_string(job.zero.offload_buffer_count) +
           " is fewer than the " + std::to_string(fields) +
           " buffers one sub-group of the offload file takes (one per field; " +
           std::to_string(3 * fields) + " keep its reads and writes in flight while it steps)");
    }
  } else if (!job.zero.offload_dir.empty()) {
    fail(
        "--offload-dir is where --offload-optimizer nvme puts its files; give "
        "--offload-optimizer nvme, or drop --offload-dir");
  }
  train::check_trainer_settings(trainer_settings(s, 1));
  if (!job.output.save_hf.empty() && !is_hf_model(s.data.model)) {
    fail("--save-hf writes a Hugging Face --model DIR; --model " + s.data.model + " is not one");
  }
  // Context parallelism's ranks are replicas too: ZeRO and the gradient sum span dp x cp.
  const int replicas = s.pipeline.dp * std::max(1, s.pipeline.cp);
  if (job.zero.stage > 0 && replicas < 2 && !job.zero.offloads_optimizer()) {
    fail("--zero " + std::to_string(job.zero.stage) +
         " shards the optimizer over data-parallel replicas and needs --dp 2 or more (with "
         "--nproc pp x dp), got --dp " +
         std::to_string(s.pipeline.dp));
  }
  if (s.pipeline.overlap_grad_reduce && replicas < 2) {
    fail(
        "--overlap-grad-reduce overlaps the gradient sum over data-parallel replicas: it needs "
        "--dp 2 or more (with --nproc pp x dp), got --dp " +
        std::to_string(s.pipeline.dp));
  }
}

// Every file and directory the run will write, checked now rather than after hours of training.
void check_outputs(const JobConfig& job) {
  const std::tuple<const char*, std::string, bool> outputs[] = {
      {"--save-params", job.output.save_params, false},
      {"--save-hf", job.output.save_hf, true},
      {"--trace", job.output.trace, false},
      {"--timeline", job.output.timeline, false},
      {"--summary-json", job.output.summary_json, false},
      {"--checkpoint-dir", job.checkpoint.dir, true}};
  for (const auto& [flag, path, directory] : outputs) {
    if (!path.empty()) as_flag_error(flag, [&] { check_writable(path, directory); });
  }
}

}  // namespace

ModelDataSpec model_data_spec(const JobConfig& job) {
  ModelDataSpec spec;
  spec.model = job.model.name;
  spec.model_options = job.model.options;
  spec.init = job.model.init;
  spec.loss = job.model.loss;
  spec.seed = job.training.seed;
  spec.data = job.data.name;
  spec.data_dir = job.data.dir;
  spec.text_file = job.data.text_file;
  spec.inputs_path = job.data.inputs;
  spec.targets_path = job.data.targets;
  spec.synthetic_samples = job.data.synthetic_samples;
  spec.token_file = job.data.token_file;
  spec.data_path = job.data.path;
  spec.seq_len = job.data.seq_len;
  spec.token_bytes = static_cast<int>(job.data.token_bytes);
  spec.shuffle = job.data.shuffle;
  spec.packing = job.data.pack;
  spec.loss_mask_path = job.data.loss_mask_path;
  spec.cross_document_attention = job.data.cross_document_attention;
  spec.pad_multiple = job.data.pad_multiple;
  spec.group_by_length = job.data.group_by_length;
  return spec;
}

int64_t sequence_multiple(const TrainingSetup& s) {
  const PipelineRequest& p = s.pipeline;
  const int64_t context = p.cp > 1 ? (p.cp_ulysses ? p.cp : 2 * p.cp) : 1;
  return context * (s.job.parallel.sequence_parallel ? std::max(1, p.tp) : 1);
}

int64_t offload_file_fields(const TrainingSetup& s) {
  const bool params = s.job.zero.offload_params == "nvme";
  return static_cast<int64_t>(
             partition::optimizer_state_multiple(s.job.optimizer.name, s.job.optimizer.momentum)) +
         (params ? 1 : 0) + (params && !on_cuda(s.pipeline) ? 1 : 0);
}

TrainingSetup resolve_training(const JobConfig& job) {
  check_fields(job, Command::kTrain);
  TrainingSetup s;
  s.job = job;
  s.resume = job.checkpoint.resume;
  s.data = model_data_spec(job);
  resolve_pipeline(job, s);
  if (!job.memory.limit.empty() && job.memory.limit != "none") {
    s.memory_limit_bytes = partition::parse_bytes(job.memory.limit);
  }
  s.zero_options = zero_options_of(job.zero);
  check_model_data_spec(s.data);
  check_choices(s);
  check_ranges(s);
  check_pipeline_request(s.pipeline);
  check_outputs(job);
  const std::string& backend = job.parallel.backend;
  if (backend != "auto") {
    const CommBackend parsed = parse_comm_backend(backend);
    if (!comm_backend_available(parsed)) {
      fail("--backend " + backend + " is not available (" +
           comm_backend_unavailable_reason(parsed) + "); use --backend gloo or auto");
    }
  }
  return s;
}

train::TrainerOptions trainer_settings(const TrainingSetup& s, int64_t total_steps) {
  const JobConfig& job = s.job;
  return train::TrainerOptions(total_steps)
      .optimizer(job.optimizer.name)
      .lr(job.optimizer.lr)
      .momentum(job.optimizer.momentum)
      .weight_decay(job.optimizer.weight_decay)
      .beta1(job.optimizer.adam_betas.at(0))
      .beta2(job.optimizer.adam_betas.at(1))
      .eps(job.optimizer.adam_eps)
      .loss_scaling(s.pipeline.precision == Precision::kFloat16)
      .loss_scaler(train::LossScalerOptions()
                       .rule(train::parse_loss_scale_rule(job.optimizer.loss_scaler))
                       .initial_scale(job.optimizer.initial_loss_scale)
                       .growth_interval(job.optimizer.loss_scale_window)
                       .hysteresis(job.optimizer.loss_scale_hysteresis)
                       .min_scale(job.optimizer.min_loss_scale)
                       .consecutive_hysteresis(job.optimizer.loss_scale_consecutive_hysteresis))
      .lr_schedule(job.optimizer.lr_schedule)
      .warmup_steps(job.optimizer.warmup_steps)
      .min_lr(job.optimizer.min_lr)
      .warmup_type(job.optimizer.warmup_type)
      .warmup_min_lr(job.optimizer.warmup_min_lr)
      .lr_total_steps(job.optimizer.lr_total_steps)
      .clip_grad_norm(job.optimizer.clip_grad_norm)
      .zero(static_cast<int>(job.zero.stage))
      .reshard_after_forward(job.zero.reshard_after_forward)
      .offload_optimizer(job.zero.offloads_optimizer())
      .zero_options(s.zero_options)
      .checkpoint_dir(job.checkpoint.dir)
      .save_every(job.checkpoint.save_every)
      .checkpoint_format(job.checkpoint.format)
      .keep_checkpoints(static_cast<int>(job.checkpoint.keep))
      .async_checkpoint(job.checkpoint.async)
      .trace_path(job.output.trace)
      .timeline_path(job.output.timeline)
      .report_memory(job.memory.report)
      .memory_every(job.training.log_every);
}

train::MemoryRunOptions memory_run_options(const TrainingSetup& s, const RunLayout& layout) {
  const JobConfig& job = s.job;
  train::MemoryRunOptions run;
  run.optimizer = job.optimizer.name;
  run.momentum = job.optimizer.momentum;
  run.zero = static_cast<int>(job.zero.stage);
  run.reshard_after_forward = job.zero.reshard_after_forward;
  run.zero_options = s.zero_options;
  run.offload_optimizer = job.zero.offloads_optimizer();
  run.async_checkpoint =
      job.checkpoint.async && !job.checkpoint.dir.empty() && job.checkpoint.save_every > 0;
  run.data_parallel = layout.replicas;
  run.expert_parallel = static_cast<int>(job.parallel.ep);
  run.processes = layout.multi_process;
  return run;
}

}  // namespace pipetrain::job
