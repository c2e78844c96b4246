// The CLI's observer (job/console_observer.h).
#include "pipetrain/job/console_observer.h"

#include <cstdio>
#include <iostream>

#include "pipetrain/train/memory_fit.h"

namespace pipetrain::job {
namespace {

void print_line(std::FILE* out, const std::string& text) {
  if (text.empty()) return;
  std::fprintf(out, "%s%s", text.c_str(), text.back() == '\n' ? "" : "\n");
  std::fflush(out);
}

}  // namespace

void ConsoleObserver::on_note(const Note& note) {
  print_line(note.kind == Note::Kind::kInfo ? stdout : stderr, note.text);
}

void ConsoleObserver::on_start(const TrainingStart& start) {
  print_line(stdout, start.text);
  step_lines_ = start.step_lines;
  predicted_memory_ = start.predicted_memory;
  stepped_ = false;
  // Made before the first step, so that its rate counts the first step's time too.
  progress_.reset();
  if (!step_lines_) progress_.emplace(std::cerr, train::stderr_is_terminal(), start.progress);
}

void ConsoleObserver::on_step(const train::StepReport& r) {
  if (!r.main) return;
  stepped_ = true;
  if (step_lines_ || !progress_) {
    std::printf("step %lld loss %.6f\n", static_cast<long long>(r.step), r.loss);
    std::fflush(stdout);
    return;
  }
  if (!r.process_peak_bytes.empty()) {
    progress_->set_note(train::peak_memory_text(r.process_peak_bytes, predicted_memory_));
  }
  progress_->update(r.step + 1, r.epoch, r.samples, r.loss, r.tokens, r.counted_targets);
}

void ConsoleObserver::finish_progress() {
  if (progress_ && stepped_) progress_->finish();
}

void ConsoleObserver::on_epoch_end(int64_t) {
  finish_progress();
}

void ConsoleObserver::on_evaluation(const EvaluationDone& done) {
  print_line(stdout, done.text);
}

void ConsoleObserver::on_checkpoint(const CheckpointWritten& written) {
  finish_progress();
  print_line(stdout, written.text);
}

void ConsoleObserver::on_done(const TrainingDone& done) {
  finish_progress();
  print_line(stdout, done.text);
}

void ConsoleObserver::on_result(const std::string& text) {
  if (text.empty()) return;
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace pipetrain::job
