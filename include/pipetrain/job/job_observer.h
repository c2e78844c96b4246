// What a running job tells its caller (job/run_job.h): the lines `pipetrain` prints, each with the
// figures behind it, so a program may print them as they are (ConsoleObserver,
// job/console_observer.h), differently, or not at all.
//
//   run_training:   [on_note: planning, launch, memory check, auto plan, restart]
//                   on_start -> on_step ... [on_epoch_end, on_evaluation, on_checkpoint] ...
//                   -> on_done
//   run_evaluation, run_generation, run_export, run_model_plan: on_note, then on_done's text
//
// Which process hears what: one process hears everything. In a multi-process run the launching
// parent hears the memory check and the launch; each rank hears its own restart and, on rank 0,
// the auto plan; the main rank (the one whose losses are the run's) hears the start, the steps,
// evaluations, checkpoints and the end.
//
// Thread-safety: called on the thread that runs the job, one call at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/partition/planner.h"
#include "pipetrain/train/evaluate.h"
#include "pipetrain/train/progress.h"
#include "pipetrain/train/trainer.h"

namespace pipetrain::job {

// A line about the run: planning's progress, "launching 4 processes", the memory check, the auto
// plan, a restart. The CLI prints kInfo on stdout; kWarning, and kProgress (the progress of a
// command whose result goes to stdout, as `plan`'s JSON), on stderr.
struct Note {
  enum class Kind { kInfo, kWarning, kProgress };
  Kind kind = Kind::kInfo;
  std::string text;  // one or more lines, without the last newline
};

// Training is about to take its first step.
struct TrainingStart {
  std::string text;  // "training cnn (...) on fashion-mnist: ..." and the lines after it
  train::ProgressOptions progress;  // rates, steps and epochs for a progress line
  bool step_lines = false;  // tensor data: a "step k loss x" line per step, not a progress line
  std::vector<int64_t> predicted_memory;  // each process's predicted peak (empty: not checked)
};

// A checkpoint was committed.
struct CheckpointWritten {
  std::string directory;
  train::Trainer::SaveFigures figures;
  std::string text;  // "checkpoint DIR: 12.3 MiB by 4 processes in 0.2 s (...)"
};

// An evaluation of the whole model: per epoch ("epoch 1"), at the end of a corpus ("final").
struct EvaluationDone {
  std::string when;
  train::Evaluation evaluation;
  std::string text;  // "epoch 1: test loss 0.4, test accuracy 85.1% (10000 images)"
};

// The run ended: what it measured and wrote.
struct TrainingDone {
  train::TrainSummary summary;
  train::TrainingRate rate;
  std::string text;  // the report after training: files, memory, the "done:" line, what was saved
};

class JobObserver {
 public:
  virtual ~JobObserver() = default;
  virtual void on_note(const Note&) {}
  virtual void on_start(const TrainingStart&) {}
  virtual void on_step(const train::StepReport&) {}
  virtual void on_epoch_end(int64_t /*epoch*/) {}
  virtual void on_evaluation(const EvaluationDone&) {}
  virtual void on_checkpoint(const CheckpointWritten&) {}
  // The result of any command: training's report, an evaluation, generated ids, a plan.
  virtual void on_done(const TrainingDone&) {}
  virtual void on_result(const std::string& /*text*/) {}
};

}  // namespace pipetrain::job
