// Progress bar and log lines (pipetrain/train/progress.h).
#include "pipetrain/train/progress.h"
#include "pipetrain/base/check.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include <c10/util/Exception.h>

namespace pipetrain::train {

SecondsClock steady_clock_seconds() {
  return [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
}

bool stderr_is_terminal() {
  return ::isatty(STDERR_FILENO) == 1;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto total = static_cast<int64_t>(std::llround(seconds));
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", static_cast<long long>(total / 3600),
                  static_cast<long long>(total / 60 % 60), static_cast<long long>(total % 60));
  } else {
    std::snprintf(text, sizeof text, "%lld:%02lld", static_cast<long long>(total / 60),
                  static_cast<long long>(total % 60));
  }
  return text;
}

ProgressReporter::ProgressReporter(std::ostream& out, bool is_terminal, ProgressOptions options,
                                   SecondsClock clock)
    : out_(out), is_terminal_(is_terminal), options_(options), clock_(std::move(clock)) {
  PIPETRAIN_CHECK_INPUT(options_.total_steps() > 0, "progress: total steps must be positive, got ",
                        options_.total_steps());
  PIPETRAIN_CHECK_INPUT(options_.smoothing() > 0.0 && options_.smoothing() <= 1.0,
                        "progress: smoothing must be in (0, 1], got ", options_.smoothing());
  start_ = clock_();
  step_ = last_logged_step_ = options_.first_step();
}

TrainingRate training_rate(const TrainingWork& work, const ProgressOptions& options) {
  TrainingRate rate;
  rate.tokens = work.tokens > 0 ? work.tokens : work.samples * options.tokens_per_sample();
  if (work.seconds <= 0) return rate;
  const auto samples = static_cast<double>(work.samples);
  const auto tokens = static_cast<double>(rate.tokens);
  rate.samples_per_second = samples / work.seconds;
  rate.tokens_per_second = tokens / work.seconds;
  rate.targets_per_second = static_cast<double>(work.counted_targets) / work.seconds;
  if (options.flops_per_token() > 0 && options.peak_flops() > 0) {
    rate.mfu = rate.tokens_per_second * options.flops_per_token() / options.peak_flops();
  }
  return rate;
}

double ProgressReporter::samples_per_second() const {
  double elapsed = clock_() - start_;
  return elapsed > 0 ? static_cast<double>(samples_) / elapsed : 0.0;
}

std::string ProgressReporter::status(bool terminal) const {
  const double elapsed = clock_() - start_;
  const int64_t done = step_ - options_.first_step();
  const double eta = done > 0 ? elapsed / static_cast<double>(done) *
                                    static_cast<double>(options_.total_steps() - step_)
                              : -1.0;
  // Tokens per second and MFU after the sample rate, where known.
  std::string rates;
  const TrainingRate rate = training_rate({elapsed, samples_, tokens_, counted_targets_}, options_);
  const double per_second = rate.samples_per_second;
  if (options_.tokens_per_sample() > 0 || tokens_ > 0) {
    rates += " tokens/s " + std::to_string(std::llround(rate.tokens_per_second));
  }
  if (counted_targets_ > 0) {
    rates += " targets/s " + std::to_string(std::llround(rate.targets_per_second));
  }
  if (rate.mfu > 0) {
    char mfu[32];
    std::snprintf(mfu, sizeof mfu, " MFU %.1f%%", 100.0 * rate.mfu);
    rates += mfu;
  }
  char numbers[200];
  std::string out = "epoch " + std::to_string(epoch_ + 1) + "/" + std::to_string(options_.epochs());
  if (terminal) {
    const int width = options_.bar_width();
    const int filled = static_cast<int>(static_cast<double>(width) * static_cast<double>(step_) /
                                        static_cast<double>(options_.total_steps()));
    std::string bar(static_cast<size_t>(width), ' ');
    for (int c = 0; c < filled && c < width; ++c) bar[static_cast<size_t>(c)] = '=';
    if (filled < width) bar[static_cast<size_t>(filled)] = '>';
    std::snprintf(numbers, sizeof numbers, " [%s] %lld/%lld  %.0f samples/s%s  loss %.4f  ETA %s",
                  bar.c_str(), static_cast<long long>(step_),
                  static_cast<long long>(options_.total_steps()), per_second, rates.c_str(),
                  smoothed_loss_, format_duration(eta).c_str());
  } else {
    std::snprintf(numbers, sizeof numbers, " step %lld/%lld samples/s %.1f%s loss %.4f eta %s",
                  static_cast<long long>(step_), static_cast<long long>(options_.total_steps()),
                  per_second, rates.c_str(), smoothed_loss_, format_duration(eta).c_str());
  }
  return out + numbers + (note_.empty() ? "" : "  " + note_);
}

void ProgressReporter::set_note(std::string note) {
  note_ = std::move(note);
}

void ProgressReporter::draw(const std::string& text) {
  // Pad with spaces so a shorter line fully covers the previous one.
  std::string line = "\r" + text;
  if (text.size() < bar_length_) line += std::string(bar_length_ - text.size(), ' ');
  out_ << line << std::flush;
  bar_length_ = text.size();
  bar_open_ = true;
}

void ProgressReporter::update(int64_t step, int64_t epoch, int64_t samples, double loss,
                              int64_t tokens, int64_t counted_targets) {
  step_ = step;
  epoch_ = epoch;
  samples_ += samples;
  tokens_ += tokens;
  counted_targets_ += counted_targets;
  if (std::isfinite(loss)) {
    smoothed_loss_ =
        has_loss_ ? (1.0 - options_.smoothing()) * smoothed_loss_ + options_.smoothing() * loss
                  : loss;
    has_loss_ = true;
  }
  const double now = clock_();
  const bool last = step >= options_.total_steps();
  if (is_terminal_) {
    if (last || now - last_output_ >= options_.redraw_seconds()) {
      draw(status(true));
      last_output_ = now;
    }
    return;
  }
  const bool by_steps =
      options_.log_every_steps() > 0 && step - last_logged_step_ >= options_.log_every_steps();
  const bool by_time = options_.log_every_seconds() > 0 &&
                       now - std::max(last_output_, start_) >= options_.log_every_seconds();
  if (last || by_steps || by_time) {
    out_ << status(false) << "\n" << std::flush;
    last_output_ = now;
    last_logged_step_ = step;
  }
}

void ProgressReporter::message(const std::string& line) {
  if (is_terminal_ && bar_open_) {
    out_ << "\r" << line;
    if (line.size() < bar_length_) out_ << std::string(bar_length_ - line.size(), ' ');
    out_ << "\n";
    draw(status(true));  // put the bar back below the message
    return;
  }
  out_ << line << "\n" << std::flush;
}

void ProgressReporter::finish() {
  if (is_terminal_ && bar_open_) out_ << "\n" << std::flush;
  bar_open_ = false;
}

}  // namespace pipetrain::train
