// The JobObserver `pipetrain` uses: every line on stdout as the CLI prints it, warnings and the
// progress line (train/progress.h) on stderr.
//
//   job::ConsoleObserver console;
//   job::run_training(job, console);
//
// Thread-safety: one job at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "pipetrain/job/job_observer.h"
#include "pipetrain/train/progress.h"

namespace pipetrain::job {

class ConsoleObserver : public JobObserver {
 public:
  void on_note(const Note& note) override;
  void on_start(const TrainingStart& start) override;
  void on_step(const train::StepReport& report) override;
  void on_epoch_end(int64_t epoch) override;
  void on_evaluation(const EvaluationDone& done) override;
  void on_checkpoint(const CheckpointWritten& written) override;
  void on_done(const TrainingDone& done) override;
  void on_result(const std::string& text) override;

 private:
  // Ends the progress line before a line of its own.
  void finish_progress();

  std::optional<train::ProgressReporter> progress_;
  bool step_lines_ = false;
  bool stepped_ = false;
  std::vector<int64_t> predicted_memory_;
};

}  // namespace pipetrain::job
