// The pieces run_training (run_training.cpp) builds and the texts it reports them with
// (training_report.cpp). Private to src/job/.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/job/job_observer.h"
#include "pipetrain/job/model_data.h"
#include "pipetrain/job/training_setup.h"
#include "pipetrain/partition/planner.h"
#include "pipetrain/runtime/run_layout.h"
#include "pipetrain/train/batch_source.h"
#include "pipetrain/train/checkpoint.h"
#include "pipetrain/train/step_runner.h"
#include "pipetrain/train/trainer.h"

namespace pipetrain::job::detail {

// The model and data of a run, and what it resumes from and plans.
struct Prepared {
  BuiltData data;
  BuiltModel model;
  std::optional<train::Checkpoint> resume;
  std::optional<partition::Plan> auto_plan;  // when an auto flag was given
  std::vector<int64_t> predicted_memory;     // per process, by the memory check (or its parent)
};

// The data set's batch source, and the run's length.
class Batches {
 public:
  Batches(const TrainingSetup& setup, const BuiltModel& model, const BuiltData& data);
  const train::BatchSource& source() const { return *source_; }
  int64_t total_steps() const;  // steps of the whole run
  int64_t epochs() const;       // epochs those steps begin

 private:
  const TrainingSetup& setup_;
  std::unique_ptr<train::BatchSource> source_;
};

// The largest mini-batch as the memory model takes it (inputs, targets): with --cp C each row
// [T] becomes C rows of T / C tokens, so that one replica's share of the dp x C replicas holds as
// many tokens as a context-parallel rank computes, in sequences of its length.
std::pair<torch::Tensor, torch::Tensor> modelled_batch(const Batches& batches,
                                                       const RunLayout& layout);

// The progress line's rates: tokens/s of token data, MFU with a peak.
train::ProgressOptions rate_options(const TrainingSetup& setup, const BuiltModel& model,
                                    const BuiltData& data);

// "training cnn (...) on fashion-mnist: ..." and the lines after it.
std::string start_text(const TrainingSetup& setup, const Prepared& p, const Batches& batches,
                       train::StepRunner& runner, int threads);

// --report-memory's table: the memory model's prediction for this run beside what every rank
// measured ("" when nothing was measured).
std::string memory_report_text(const TrainingSetup& setup, Prepared& p, const Batches& batches,
                               const train::TrainSummary& summary, const PipeOptions& pipe,
                               const RunLayout& layout);

// After the last step: the files written, memory, the data-parallel sum, the transport, the peak,
// and the "done:" line (writing --summary-json). Returns the text; `rate` is filled.
std::string result_text(const TrainingSetup& setup, const Prepared& p, const Batches& batches,
                        train::StepRunner& runner, const train::TrainSummary& summary,
                        train::TrainingRate& rate);

// "checkpoint DIR: 12.3 MiB by 4 processes in 0.210 s (58.6 MiB/s)".
std::string checkpoint_text(const std::string& directory, const train::Trainer::SaveFigures& f);

}  // namespace pipetrain::job::detail
