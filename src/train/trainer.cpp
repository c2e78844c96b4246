// The training loop over a StepRunner (pipetrain/train/trainer.h). [n] cite the header's steps.
#include "pipetrain/train/trainer.h"
#include "pipetrain/train/memory_fit.h"

#include "pipetrain/runtime/distributed.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <optional>
#include <thread>

#include <c10/util/StringUtil.h>

#include "pipetrain/base/atomic_file.h"
#include "pipetrain/base/check.h"
#include "pipetrain/base/error.h"
#include "pipetrain/base/message_of.h"
#include "pipetrain/stage/batchnorm.h"
#include "pipetrain/train/finite_loss.h"
#include "pipetrain/train/grad_clip.h"
#include "pipetrain/train/lr_schedule.h"
#include "pipetrain/train/optimizer.h"
#include "pipetrain/train/sharded_checkpoint.h"

namespace pipetrain::train {
namespace {

void check_options(const TrainerOptions& o) {
  if (o.total_steps() < 1) {
    throw BadInput("Trainer: total_steps must be >= 1 (got " + std::to_string(o.total_steps()) +
                   ")");
  }
  check_trainer_settings(o);
}

}  // namespace

Trainer::Trainer(torch::nn::Sequential model, StepRunner& runner, const BatchSource& batches,
                 TrainerOptions options)
    : model_(std::move(model)), runner_(runner), batches_(batches), options_(std::move(options)) {
  check_options(options_);
  parameters_ = runner_.parameters();
  const OptimizerOptions optimizer_options = OptimizerOptions()
                                                 .lr(options_.lr())
                                                 .momentum(options_.momentum())
                                                 .weight_decay(options_.weight_decay())
                                                 .beta1(options_.beta1())
                                                 .beta2(options_.beta2())
                                                 .eps(options_.eps());
  if (options_.loss_scaling()) scaler_.emplace(options_.loss_scaler());
  if (options_.zero() > 0) {
    sharded_ =
        runner_.make_sharded_optimizer(options_.optimizer(), optimizer_options,
                                       ZeroOptions(options_.zero_options())
                                           .stage(options_.zero())
                                           .reshard_after_forward(options_.reshard_after_forward())
                                           .offload(options_.offload_optimizer()));
  } else {
    optimizer_ = make_optimizer(options_.optimizer(), parameters_, optimizer_options);
  }
}

torch::optim::Optimizer& Trainer::optimizer() {
  return sharded_ ? sharded_->shard_optimizer() : *optimizer_;
}

void Trainer::set_learning_rate(double lr) {
  if (sharded_) {
    sharded_->set_learning_rate(lr);
  } else {
    train::set_learning_rate(*optimizer_, lr);
  }
}

void Trainer::zero_grad() {
  if (sharded_) {
    sharded_->zero_grad();
  } else {
    optimizer_->zero_grad();
  }
}

void Trainer::resume(const Checkpoint& checkpoint) {
  if (sharded_) {
    sharded_->restore(checkpoint, runner_.named_parameters());
  } else {
    restore_optimizer(checkpoint, *optimizer_, runner_.named_parameters());
  }
  if (checkpoint.torch_rng_state.defined()) restore_torch_rng(checkpoint);
  runner_.restore_stage_rng_states(checkpoint.stage_rng_states);
  const auto saved = checkpoint.metadata.find("loss_scaler");
  if (scaler_ && saved != checkpoint.metadata.end()) {
    scaler_->restore(saved->at("scale").get<double>(), saved->at("good_steps").get<int64_t>(),
                     saved->value("hysteresis", int64_t{-1}));
  }
  first_step_ = checkpoint.step;
}

double Trainer::learning_rate(int64_t k) const {
  LrScheduleOptions lr(options_.lr());
  lr.warmup_steps(options_.warmup_steps())
      .min_lr(options_.min_lr())
      .schedule(options_.lr_schedule())
      .warmup_type(options_.warmup_type())
      .warmup_min_lr(options_.warmup_min_lr());
  const int64_t total =
      options_.lr_total_steps() > 0 ? options_.lr_total_steps() : options_.total_steps();
  if (options_.lr_schedule() == "cosine") {
    lr.total_steps(std::max(total, options_.warmup_steps()));
  } else if (is_deepspeed_lr_schedule(options_.lr_schedule())) {
    lr.total_steps(total);
  }
  return learning_rate_at(lr, k);
}

// [2] and [3] of step k; returns the loss.
double Trainer::run_step(int64_t k, const data::Batch& batch) {
  double loss = 0;
  try {
    loss = runner_.step(batch);
  } catch (const std::exception& error) {
    const auto* cause = dynamic_cast<const Error*>(&error);
    throw Error(cause ? cause->kind() : ErrorKind::Runtime,
                "step " + std::to_string(k) + " failed: " + message_of(error));
  }
  const int64_t per_epoch = batches_.per_epoch();
  check_finite_loss(loss, k, per_epoch > 0 ? batches_.epoch_of(k) : -1,
                    per_epoch > 0 ? k % per_epoch : -1);
  // Replicas each tracked their share of the mini-batch: sum it. Fewer micro-batches than
  // chunks (a short last batch, or data-parallel replicas) leave the statistics uncommitted.
  // Over the replicas' group, after the reduce-scatters the step started there (in one order on
  // every replica).
  if (sharded_) sharded_->post_started_collectives();
  runner_.sum_batch_norm_statistics();
  commit_deferred_batch_norms(*model_);
  last_step_skipped_ = !update_parameters();
  return loss;
}

std::vector<int64_t> Trainer::gather_peak_resident() {
  std::vector<double> peaks(static_cast<size_t>(runner_.processes()), 0.0);
  peaks[static_cast<size_t>(runner_.process_index())] = static_cast<double>(peak_resident_bytes());
  std::vector<int64_t> all;
  for (double bytes : runner_.sum_over_ranks(std::move(peaks))) {
    all.push_back(static_cast<int64_t>(bytes));
  }
  return runner_.is_main() ? all : std::vector<int64_t>{};
}

bool Trainer::update_parameters() {
  double unscale = 1.0;
  // ZeRO's gradients are in its shard once reduced (streamed ones are nowhere else).
  if (sharded_) sharded_->reduce_gradients();
  if (scaler_) {
    // A non-finite gradient on any rank skips the step on every rank.
    const double used = scaler_->scale();
    const bool local =
        sharded_ ? sharded_->has_non_finite_gradient() : has_non_finite_gradient(parameters_);
    const bool found = runner_.sum_over_ranks(local ? 1.0 : 0.0) > 0;  // collective
    scaler_->update(found);
    if (found) return false;
    unscale = 1.0 / used;
  }
  const double max_norm = options_.clip_grad_norm();
  if (!sharded_) {
    if (unscale != 1.0) scale_gradients(parameters_, unscale);
    if (max_norm > 0) {
      const double norm = std::sqrt(runner_.grad_norm_squared());
      if (std::isfinite(norm)) scale_gradients(parameters_, clip_factor(norm, max_norm));
    }
    optimizer_->step();
    return true;
  }
  if (unscale != 1.0) sharded_->scale_gradients(unscale);
  if (max_norm > 0) {
    const double norm = std::sqrt(runner_.sum_over_ranks(sharded_->local_grad_norm_squared()));
    if (std::isfinite(norm)) sharded_->scale_gradients(clip_factor(norm, max_norm));
  }
  sharded_->step();
  return true;
}

TrainSummary Trainer::fit() {
  const int64_t total = options_.total_steps();
  const bool tracing = !options_.trace_path().empty() || !options_.timeline_path().empty();
  TrainSummary summary;
  model_->train();
  const auto start = std::chrono::steady_clock::now();
  const int64_t bytes_before = runner_.transport_bytes_sent();
  double exposed_reduce = 0;  // this rank's, summed over the steps
  for (int64_t k = first_step_; k < total; ++k) {
    const data::Batch batch = batches_.batch(k);  // [1]
    const int64_t rows = batch.rows();
    const double lr = learning_rate(k);
    set_learning_rate(lr);
    zero_grad();
    const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
    runner_.set_loss_scale(loss_scale);
    const double step_start = EventLog::now_us();
    const double loss = run_step(k, batch);  // [2] [3]
    summary.step_seconds.push_back((EventLog::now_us() - step_start) * 1e-6);
    exposed_reduce += runner_.last_exposed_reduce_seconds();
    if (tracing) {
      events_.add(k, step_start, runner_.last_events(), runner_.event_rank());
      events_.add_collectives(k, step_start, runner_.last_collectives(),
                              std::max(runner_.event_rank(), 0));
    }
    if (step_counts) {
      const double now = EventLog::now_us();
      for (auto& [series, values] : step_counts()) {
        if (tracing) {
          events_.add_counts({k, std::max(runner_.event_rank(), 0), now, series, values});
        }
      }
    }
    if (options_.report_memory() && k + 1 == total) {
      // Right after the last step: its stash peaks, the gradients and the state it left.
      summary.memory = measure_memory(runner_, optimizer_.get(), sharded_.get());
    }
    if (k == first_step_) summary.first_loss = loss;
    summary.last_loss = loss;
    summary.steps = k + 1 - first_step_;
    summary.samples += rows;
    const data::BatchTokens tokens = data::batch_tokens(batch);
    summary.tokens += tokens.tokens;
    summary.counted_targets += tokens.counted_targets;
    if (on_step) {  // [4]
      StepReport report;
      report.step = k;
      report.epoch = batches_.epoch_of(k);
      report.samples = rows;
      report.tokens = tokens.tokens;
      report.counted_targets = tokens.counted_targets;
      report.loss = loss;
      report.lr = lr;
      report.main = runner_.is_main();
      report.skipped = last_step_skipped_;
      report.loss_scale = loss_scale;
      const int64_t every = options_.memory_every();
      if (every > 0 && ((k + 1 - first_step_) % every == 0 || k + 1 == total)) {
        try {
          report.process_peak_bytes = gather_peak_resident();  // collective
        } catch (const std::exception& error) {
          // A rank lost here names the step it was in, as one lost during the step does.
          const auto* cause = dynamic_cast<const Error*>(&error);
          throw Error(cause ? cause->kind() : ErrorKind::Runtime,
                      "step " + std::to_string(k) +
                          " failed: summing the processes' peak memory: " + message_of(error));
        }
      }
      on_step(report);
    }
    if (pending_save_) finish_sharded_save(/*wait=*/false);  // an async save, done everywhere?
    if (options_.save_every() > 0 && (k + 1) % options_.save_every() == 0 && k + 1 < total &&
        !options_.checkpoint_dir().empty()) {
      write_checkpoint(k + 1);  // [5]
    }
    const bool last_of_short_epoch =
        k + 1 == total && batches_.per_epoch() > 0 && !batches_.ends_epoch(k);
    if ((batches_.ends_epoch(k) || last_of_short_epoch) && on_epoch_end) {
      // ZeRO-3: an evaluation gathers what it reads (gather_model()); a run without one
      // gathers nothing (every rank's stages whole at once is what ZeRO-3 exists not to hold).
      on_epoch_end(batches_.epoch_of(k));  // [6]
      model_->train();
    }
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  summary.process_peak_bytes = gather_peak_resident();  // collective
  summary.skipped_steps = scaler_ ? scaler_->skipped_steps() : 0;
  summary.optimizer_state_bytes =
      sharded_ ? sharded_->state_bytes() : optimizer_state_bytes(*optimizer_);
  summary.gradient_bytes = sharded_ ? sharded_->gradient_bytes() : gradient_bytes(parameters_);
  summary.transport_bytes_sent = static_cast<int64_t>(runner_.sum_over_ranks(
      static_cast<double>(runner_.transport_bytes_sent() - bytes_before)));  // collective
  if (summary.steps > 0) {
    summary.exposed_reduce_seconds = runner_.sum_over_ranks(exposed_reduce) /  // collective
                                     static_cast<double>(summary.steps * runner_.total_ranks());
  }
  if (options_.report_memory()) {
    // The largest snapshot of the saves during the run, on the process's first rank (a process
    // running several ranks takes one snapshot of all of them).
    if (!summary.memory.empty()) summary.memory.front().bytes.checkpoint_snapshot = peak_snapshot_;
    summary.memory = gather_memory(runner_, summary.memory);
  }
  // ZeRO-3 leaves the parameters sharded (whole, every rank's would be what ZeRO-3 exists not
  // to hold): gather_weights(), evaluate() and the checkpoint gather them.
  if (!options_.checkpoint_dir().empty()) {
    summary.checkpoint_path = write_checkpoint(total);
  }
  finish_sharded_save(/*wait=*/true);  // the end of training waits for the last save
  if (tracing) write_trace(summary);
  return summary;
}

std::optional<Checkpoint> Trainer::gather_weights() {
  gather_parameters();
  Checkpoint part;
  capture_model(part, runner_.named_parameters(), runner_.named_buffers());
  return runner_.gather(part);
}

void Trainer::gather_parameters() {
  if (sharded_) sharded_->gather_all();
}

bool Trainer::gather_model() {
  std::optional<Checkpoint> whole = gather_weights();
  if (!whole) return false;
  restore_model(*whole, *model_, NameMatch::kExact);
  return true;
}

void Trainer::save_checkpoint(const std::string& path, int64_t steps_done) {
  gather_parameters();  // ZeRO-3: whole until the next step frees them
  Checkpoint part;
  capture_model(part, runner_.named_parameters(), runner_.named_buffers());
  if (sharded_) {
    sharded_->capture(part, runner_.named_parameters());
  } else {
    capture_optimizer(part, *optimizer_, runner_.named_parameters());
  }
  part.stage_rng_states = runner_.stage_rng_states();
  std::optional<Checkpoint> whole = runner_.gather(part);
  if (!whole) return;
  const int64_t per_epoch = batches_.per_epoch();
  whole->step = steps_done;
  whole->epoch = batches_.epoch_of(steps_done);
  whole->batch = per_epoch > 0 ? steps_done % per_epoch : steps_done;
  capture_torch_rng(*whole);
  whole->metadata = options_.metadata();
  if (scaler_) {
    whole->metadata["loss_scaler"] = {{"scale", scaler_->scale()},
                                      {"good_steps", scaler_->good_steps()},
                                      {"hysteresis", scaler_->hysteresis_left()}};
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  train::save_checkpoint(path, *whole);
}

std::string Trainer::write_checkpoint(int64_t steps_done) {
  if (options_.checkpoint_format() == "sharded") {
    return save_sharded_checkpoint(options_.checkpoint_dir(), steps_done,
                                   options_.keep_checkpoints());
  }
  const std::string path = checkpoint_path(options_.checkpoint_dir());
  save_checkpoint(path, steps_done);
  return path;
}

// A sharded save between its start (every rank's pieces chosen, and with async_checkpoint copied
// into host memory) and its commit (every rank's file written, the index, `latest`).
struct Trainer::PendingSave {
  std::string directory, partial, step_directory, file;
  int64_t steps = 0;
  int keep = 0;
  std::chrono::steady_clock::time_point start;
  nlohmann::json state, layout;  // the main rank's, taken when the save began
  std::future<ShardFileWritten> written;
  int64_t snapshot_bytes = 0;
  int64_t resident_before = -1;  // at the save's start (-1: no peak window here)
  int64_t excess = -1;           // the peak over it while saving (async: until the snapshot)
};

std::string Trainer::save_sharded_checkpoint(const std::string& directory, int64_t steps_done,
                                             int keep) {
  return save_sharded(directory, steps_done, keep, /*parameters_only=*/false,
                      options_.async_checkpoint());
}

std::string Trainer::save_sharded(const std::string& directory, int64_t steps_done, int keep,
                                  bool parameters_only, bool async) {
  if (pending_save_) finish_sharded_save(/*wait=*/true);  // one save at a time
  auto pending = std::make_shared<PendingSave>();
  pending->start = std::chrono::steady_clock::now();
  pending->resident_before = reset_peak_resident();  // the save's own peak, from here
  pending->directory = directory;
  pending->steps = steps_done;
  pending->keep = keep;
  pending->partial = sharded_step_directory(directory, steps_done) + ".tmp";
  pending->step_directory = sharded_step_directory(directory, steps_done);
  if (runner_.is_main()) {
    std::filesystem::create_directories(directory);
    std::filesystem::remove_all(pending->partial);
    std::filesystem::create_directories(pending->partial);
  }
  runner_.barrier();  // the directory is there
  // This rank's tensors where they live: no copy, nothing gathered (ZeRO-3's shards stay shards).
  Checkpoint part;
  for (const auto& item : runner_.named_parameters()) part.parameters[item.key()] = item.value();
  std::vector<OwnedElements> owned;
  if (sharded_) owned = sharded_->owned_slices(runner_.named_parameters());
  if (parameters_only) {
    for (OwnedElements& slice : owned) slice.state.clear();  // the parameters' shards alone
  } else {
    for (const auto& item : runner_.named_buffers()) part.buffers[item.key()] = item.value();
    if (sharded_) {
      part.optimizer = sharded_->optimizer_name();
    } else {
      capture_optimizer_views(part, *optimizer_, runner_.named_parameters());
    }
    part.stage_rng_states = runner_.stage_rng_states();
    if (runner_.is_main()) capture_torch_rng(part);
  }
  const ShardPlacement placement = runner_.shard_placement();
  std::vector<ShardPieceSource> pieces = rank_pieces(part, owned, placement, runner_.is_main());
  char file_name[64];
  std::snprintf(file_name, sizeof file_name, "rank-%05d.safetensors", runner_.process_index());
  pending->file = file_name;
  if (runner_.is_main()) {
    const int64_t per_epoch = batches_.per_epoch();
    pending->state = {
        {"step", steps_done},
        {"epoch", batches_.epoch_of(steps_done)},
        {"batch", per_epoch > 0 ? steps_done % per_epoch : steps_done},
        {"optimizer", sharded_ ? sharded_->optimizer_name() : optimizer_name(*optimizer_)},
        {"metadata", options_.metadata()}};
    if (scaler_) {
      pending->state["metadata"]["loss_scaler"] = {{"scale", scaler_->scale()},
                                                   {"good_steps", scaler_->good_steps()},
                                                   {"hysteresis", scaler_->hysteresis_left()}};
    }
    pending->layout = {{"processes", runner_.processes()},
                       {"tp", placement.tensor_parallel.size},
                       {"dp", placement.replicas},
                       {"zero", options_.zero()},
                       {"runner", runner_.description()}};
  }
  // Fault tests: PIPETRAIN_TEST_STALL_SAVE=RANK:STEP stops that rank halfway through writing its
  // file at that step (first attempt only), after saying so, until something kills it.
  std::function<void(size_t, uint64_t)> stall;
  if (const char* spec = std::getenv("PIPETRAIN_TEST_STALL_SAVE")) {
    const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
    int rank = -1;
    long long step = -1;
    if (std::sscanf(spec, "%d:%lld", &rank, &step) == 2 && rank == runner_.process_index() &&
        step == steps_done && (restarts == nullptr || std::string(restarts) == "0")) {
      const size_t half = std::max<size_t>(pieces.size() / 2, 1);
      const std::string partial = pending->partial;
      stall = [half, rank, partial](size_t written, uint64_t bytes) {
        if (written + 1 != half) return;
        std::printf("test stall: rank %d stopped after %llu bytes of its file in %s\n", rank,
                    static_cast<unsigned long long>(bytes), partial.c_str());
        std::fflush(stdout);
        while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
      };
    }
  }
  const std::string path = (std::filesystem::path(pending->partial) / pending->file).string();
  if (async) {
    // The snapshot: every piece copied into host memory (pinned for a GPU's), then written by a
    // thread of its own while training goes on.
    for (ShardPieceSource& piece : pieces) {
      const torch::Tensor& live = piece.values;
      torch::Tensor copy = torch::empty(live.sizes(), live.options()
                                                          .device(torch::kCPU)
                                                          .requires_grad(false)
                                                          .pinned_memory(!live.device().is_cpu()));
      copy.copy_(live.detach());
      pending->snapshot_bytes += static_cast<int64_t>(copy.nbytes());
      piece.values = copy;
    }
    // Counted when taken: the copy is held from here, whether or not its write has finished by
    // the time the report is made.
    peak_snapshot_ = std::max(peak_snapshot_, pending->snapshot_bytes);
    if (pending->resident_before >= 0) {
      pending->excess = window_peak_resident_bytes() - pending->resident_before;
    }
    pending->written = std::async(std::launch::async, [path, pieces = std::move(pieces), stall] {
      return write_shard_file(path, pieces, stall);
    });
    pending_save_ = std::move(pending);
  } else {
    std::promise<ShardFileWritten> done;
    done.set_value(write_shard_file(path, pieces, stall));
    pending->written = done.get_future();
    pending_save_ = std::move(pending);
    finish_sharded_save(/*wait=*/true);
  }
  return sharded_step_directory(directory, steps_done);
}

std::vector<std::string> Trainer::save_safetensors(
    const std::string& directory, const std::vector<ExportedTensor>& tensors,
    SafetensorsExportOptions options,
    const std::vector<std::pair<std::string, std::string>>& extra_files) {
  const std::string parts = (std::filesystem::path(directory) / ".pipetrain-parameters").string();
  // The parameters' pieces, each rank its own (ZeRO-3's shards stay shards), synchronously.
  const std::string checkpoint =
      save_sharded(parts, 0, /*keep=*/1, /*parameters_only=*/true, /*async=*/false);
  options.part(runner_.process_index()).parts(runner_.processes());
  std::exception_ptr failure;  // a part that cannot write: every rank still reaches the barriers
  try {
    export_safetensors_part(ShardedCheckpoint::open(checkpoint), directory, tensors, options);
  } catch (const std::exception&) {
    failure = std::current_exception();
  }
  const double failed = runner_.sum_over_ranks(failure ? 1.0 : 0.0);
  if (failed == 0 && runner_.is_main()) {
    finish_safetensors_export(directory, tensors, options);
    for (const auto& [name, content] : extra_files) {
      write_file_atomically((std::filesystem::path(directory) / name).string(), content);
    }
  }
  runner_.barrier();
  if (runner_.is_main()) std::filesystem::remove_all(parts);
  if (failure) std::rethrow_exception(failure);
  if (failed > 0) {
    throw FileError("cannot write '" + directory + "': another process could not write its part");
  }
  std::vector<std::string> files = safetensors_export_files(tensors, options);
  for (const auto& item : extra_files) files.push_back(item.first);
  return files;
}

bool Trainer::finish_sharded_save(bool wait) {
  if (!pending_save_) return true;
  PendingSave& pending = *pending_save_;
  if (!wait) {
    // Collective: committed once every rank's writer is done (one sum a step while one writes).
    const bool done =
        pending.written.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    if (runner_.sum_over_ranks(done ? 1.0 : 0.0) < runner_.processes()) return false;
  }
  const ShardFileWritten written = pending.written.get();  // a writer's failure, rethrown here
  if (pending.resident_before >= 0 && pending.excess < 0) {
    pending.excess = window_peak_resident_bytes() - pending.resident_before;
  }
  last_save_.peak_excess_bytes = pending.excess;
  last_save_.bytes = written.bytes;
  last_save_.buffer_bytes = written.buffer_bytes;
  last_save_.snapshot_bytes = pending.snapshot_bytes;
  const nlohmann::json mine = {{"file", pending.file},
                               {"excess", pending.excess},
                               {"tensors", io::shard_tensors_to_json(written.tensors)}};
  const std::vector<std::string> all = runner_.gather_text(mine.dump());
  if (runner_.is_main()) {
    std::vector<std::pair<std::string, std::map<std::string, io::ShardTensor>>> files;
    for (const std::string& text : all) {
      const nlohmann::json j = nlohmann::json::parse(text);
      const std::string name = j.at("file").get<std::string>();
      last_save_.peak_excess_bytes =
          std::max(last_save_.peak_excess_bytes, j.value("excess", int64_t{-1}));
      files.emplace_back(name, io::shard_tensors_from_json(j.at("tensors"), name, 1));
    }
    const io::ShardIndex index = make_shard_index(files, pending.state, pending.layout);
    commit_sharded_checkpoint(pending.directory, pending.steps, pending.partial, index,
                              pending.keep);
    last_save_.bytes = 0;
    for (const auto& [name, tensor] : index.tensors) last_save_.bytes += tensor.bytes();
  }
  runner_.barrier();  // `latest` names it on every rank's return
  last_save_.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - pending.start).count();
  last_save_.main = runner_.is_main();
  last_save_.processes = runner_.processes();
  const std::string step_directory = pending.step_directory;
  pending_save_.reset();
  if (on_checkpoint) on_checkpoint(step_directory, last_save_);
  return true;
}

void Trainer::write_trace(TrainSummary& summary) {
  EventLog all = runner_.gather_events(events_);
  if (!runner_.is_main()) return;
  if (!options_.trace_path().empty()) {
    all.write_chrome_trace(options_.trace_path(), runner_.trace_rows());
    summary.trace_actions = static_cast<int64_t>(all.events().size());
  }
  if (!options_.timeline_path().empty()) {
    summary.timeline_step = all.write_timeline_svg(options_.timeline_path(), runner_.trace_rows(),
                                                   runner_.description());
  }
}

void check_trainer_settings(const TrainerOptions& o) {
  const std::vector<std::string> optimizers = optimizer_names();
  PIPETRAIN_CHECK_INPUT(
      std::find(optimizers.begin(), optimizers.end(), o.optimizer()) != optimizers.end(),
      "unknown --optimizer '", o.optimizer(), "'; valid: ", c10::Join(", ", optimizers));
  const std::vector<std::string> schedules = lr_schedule_names();
  PIPETRAIN_CHECK_INPUT(
      std::find(schedules.begin(), schedules.end(), o.lr_schedule()) != schedules.end(),
      "unknown --lr-schedule '", o.lr_schedule(), "'; valid: ", c10::Join(", ", schedules));
  PIPETRAIN_CHECK_INPUT(o.lr() > 0 && std::isfinite(o.lr()), "--lr must be a positive number, got ",
                        o.lr());
  PIPETRAIN_CHECK_INPUT(o.momentum() >= 0 && std::isfinite(o.momentum()),
                        "--momentum must be >= 0, got ", o.momentum());
  PIPETRAIN_CHECK_INPUT(o.weight_decay() >= 0 && std::isfinite(o.weight_decay()),
                        "--weight-decay must be a finite number >= 0, got ", o.weight_decay());
  PIPETRAIN_CHECK_INPUT(o.min_lr() >= 0 && o.min_lr() <= o.lr(),
                        "--min-lr must be in 0..--lr, got ", o.min_lr());
  PIPETRAIN_CHECK_INPUT(o.clip_grad_norm() >= 0 && std::isfinite(o.clip_grad_norm()),
                        "--clip-grad-norm must be a finite number >= 0 (0: no clipping), got ",
                        o.clip_grad_norm());
  PIPETRAIN_CHECK_INPUT(o.warmup_steps() >= 0, "--warmup-steps must be >= 0, got ",
                        o.warmup_steps());
  PIPETRAIN_CHECK_INPUT(o.warmup_type() == "log" || o.warmup_type() == "linear",
                        "--warmup-type must be log or linear, got '", o.warmup_type(), "'");
  PIPETRAIN_CHECK_INPUT(o.warmup_min_lr() >= 0 && o.warmup_min_lr() <= o.lr(),
                        "--warmup-min-lr must be in 0..--lr, got ", o.warmup_min_lr());
  PIPETRAIN_CHECK_INPUT(o.lr_total_steps() >= 0, "--lr-total-steps must be >= 0, got ",
                        o.lr_total_steps());
  PIPETRAIN_CHECK_INPUT(o.save_every() >= 0, "--save-every must be >= 0, got ", o.save_every());
  for (double beta : {o.beta1(), o.beta2()}) {
    PIPETRAIN_CHECK_INPUT(beta >= 0 && beta < 1, "--adam-betas must be in [0, 1), got ", beta);
  }
  PIPETRAIN_CHECK_INPUT(o.eps() > 0 && std::isfinite(o.eps()),
                        "--adam-eps must be a finite number > 0, got ", o.eps());
  PIPETRAIN_CHECK_INPUT(o.zero() >= 0 && o.zero() <= 3, "--zero must be 0, 1, 2 or 3, got ",
                        o.zero());
  check_offload_optimizer(o.offload_optimizer(), o.zero());
  check_reshard_after_forward(o.reshard_after_forward(), o.zero());
  if (o.zero() > 0) {
    check_zero_options(ZeroOptions(o.zero_options())
                           .stage(o.zero())
                           .reshard_after_forward(o.reshard_after_forward()));
  }
}

void check_offload_optimizer(bool offload, int zero) {
  PIPETRAIN_CHECK_INPUT(!offload || zero > 0,
                        "--offload-optimizer moves ZeRO's optimizer shard to host memory; it needs "
                        "--zero 1, 2 or 3 (got --zero ",
                        zero, ")");
}

void check_restart_options(int max_restarts, int nproc, const std::string& checkpoint_dir) {
  if (max_restarts < 0) {
    throw BadInput("--max-restarts must be >= 0, got " + std::to_string(max_restarts));
  }
  if (max_restarts == 0) return;
  if (DistributedEnvironment::present()) {
    throw BadInput(
        "--max-restarts is the launcher's flag and this rank was started by one; under torchrun "
        "give torchrun --max-restarts N (the ranks resume from --checkpoint-dir on their own)");
  }
  if (nproc < 2) {
    throw BadInput(
        "--max-restarts starts the ranks of --nproc N (N >= 2) again; a one-process run has no "
        "ranks to restart (under torchrun, give torchrun --max-restarts)");
  }
  if (checkpoint_dir.empty()) {
    throw BadInput(
        "--max-restarts needs --checkpoint-dir DIR: the restarted ranks resume from "
        "its last checkpoint (written every --save-every steps)");
  }
}

std::optional<std::string> checkpoint_after_restart(const std::string& directory,
                                                    int restart_count) {
  if (restart_count <= 0 || directory.empty()) return std::nullopt;
  if (std::filesystem::exists(std::filesystem::path(directory) / "latest")) {
    return directory;  // sharded: its latest complete checkpoint
  }
  const std::string file = checkpoint_path(directory);
  if (!std::filesystem::exists(file)) return std::nullopt;
  return file;
}

std::string checkpoint_path(const std::string& directory) {
  return (std::filesystem::path(directory) / "checkpoint.pt").string();
}

}  // namespace pipetrain::train
