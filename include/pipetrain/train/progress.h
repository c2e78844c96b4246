// ProgressReporter: training progress on stderr, as a redrawn bar on a terminal or as plain lines
// in a log.
//
// Terminal (is_terminal = true): one line redrawn in place with '\r', at most every 0.1 s:
//   epoch 1/2 [=========>          ] 234/938  1530 samples/s  loss 0.4312  ETA 0:42
// Not a terminal (a file, a pipe, CI): a plain line every `log_every_steps` steps or every
// `log_every_seconds`, whichever comes first, and at the last step:
//   epoch 1/2 step 234/938 samples/s 1530.2 loss 0.4312 eta 0:42
// With tokens (tokens_per_sample, or each step's own count of documents' tokens) the rate reads
//   samples/s 12.0 tokens/s 6144 MFU 41.2% loss ...
// (MFU with flops_per_token and peak_flops), and with counted targets (documents: the targets the
// loss counts) "targets/s 5900" after tokens/s.
// The loss shown is an exponential moving average (`smoothing` = weight of the newest loss).
// Rates and ETA count only the steps of this run (a resumed run passes its first step).
//
// The stream, the terminal flag and the clock are injected, so tests drive it deterministically.
//
// Ownership: keeps a reference to the stream, which must outlive the reporter. Thread-safety:
// none; call from one thread (the training loop).
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

#include <torch/arg.h>

namespace pipetrain::train {

struct ProgressOptions {
  /// Total optimizer steps of the run (all epochs), for the bar and the ETA. REQUIRES > 0.
  TORCH_ARG(int64_t, total_steps) = 1;
  /// Epochs of the run, for "epoch e/E". Default 1.
  TORCH_ARG(int64_t, epochs) = 1;
  /// Steps already done before this run (resume); rates count from here. Default 0.
  TORCH_ARG(int64_t, first_step) = 0;
  /// Plain mode: a line every this many steps (0 = only by time). Default 100.
  TORCH_ARG(int64_t, log_every_steps) = 100;
  /// Plain mode: a line at least this often, in seconds (0 = only by steps). Default 10.
  TORCH_ARG(double, log_every_seconds) = 10.0;
  /// Terminal mode: minimum seconds between redraws. Default 0.1.
  TORCH_ARG(double, redraw_seconds) = 0.1;
  /// Weight of the newest loss in the moving average, in (0, 1]. Default 0.1.
  TORCH_ARG(double, smoothing) = 0.1;
  /// Width of the bar in characters. Default 20.
  TORCH_ARG(int, bar_width) = 20;
  /// Tokens in a sample (a language model's sequence length): adds "tokens/s" for steps that do
  /// not count their own tokens. 0: not shown.
  TORCH_ARG(int64_t, tokens_per_sample) = 0;
  /// Model FLOPs of training on one token, and the peak FLOP/s of all the hardware the run uses:
  /// adds "MFU" (model FLOPs utilization, PaLM's definition) when both are > 0 and tokens are
  /// known.
  TORCH_ARG(double, flops_per_token) = 0;
  TORCH_ARG(double, peak_flops) = 0;
};

// What a run's work was: its samples and, where counted, its tokens (0: samples times
// tokens_per_sample) and its counted targets (0: none counted).
struct TrainingWork {
  double seconds = 0;
  int64_t samples = 0;
  int64_t tokens = 0;
  int64_t counted_targets = 0;
};

// Samples, tokens and counted targets per second, and MFU (a fraction; 0 where unknown), of
// `work` under `options`' tokens_per_sample, flops_per_token and peak_flops: what the status line
// shows, and what a caller printing its own summary should show.
struct TrainingRate {
  // The tokens the rates count: work.tokens where the steps counted them (documents, padded
  // batches), else samples x tokens_per_sample (fixed windows).
  int64_t tokens = 0;
  double samples_per_second = 0;
  double tokens_per_second = 0;
  double targets_per_second = 0;
  double mfu = 0;
};
TrainingRate training_rate(const TrainingWork& work, const ProgressOptions& options);

// Seconds on a monotonic clock.
using SecondsClock = std::function<double()>;
SecondsClock steady_clock_seconds();

// isatty(STDERR_FILENO).
bool stderr_is_terminal();

class ProgressReporter {
 public:
  ProgressReporter(std::ostream& out, bool is_terminal, ProgressOptions options,
                   SecondsClock clock = steady_clock_seconds());
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // After optimizer step `step` (1-based count of steps done, first_step < step <= total_steps)
  // of epoch `epoch` (0-based), which consumed `samples` samples (`tokens` tokens and
  // `counted_targets` counted targets where the step counts them, else 0) and had loss `loss`.
  void update(int64_t step, int64_t epoch, int64_t samples, double loss, int64_t tokens = 0,
              int64_t counted_targets = 0);
  // Text shown at the end of every status line from now on ("" for none): e.g. the processes'
  // peak memory against the prediction.
  void set_note(std::string note);
  // Prints a line of its own (e.g. "epoch 1: test accuracy 0.89") without garbling the bar.
  void message(const std::string& line);
  // Ends the bar's line on a terminal. Idempotent.
  void finish();

  double smoothed_loss() const { return smoothed_loss_; }
  double samples_per_second() const;

 private:
  std::string status(bool terminal) const;
  void draw(const std::string& text);

  std::ostream& out_;
  bool is_terminal_;
  ProgressOptions options_;
  SecondsClock clock_;
  double start_ = 0.0;
  double last_output_ = -1e300;
  int64_t last_logged_step_ = 0;
  int64_t step_ = 0;
  int64_t epoch_ = 0;
  int64_t samples_ = 0;
  int64_t tokens_ = 0;  // counted by the steps (0 when they count none)
  int64_t counted_targets_ = 0;
  double smoothed_loss_ = 0.0;
  bool has_loss_ = false;
  bool bar_open_ = false;  // a bar line is on screen without its newline
  std::string note_;
  size_t bar_length_ = 0;
};

// "m:ss" or "h:mm:ss"; "?" for a negative or non-finite time.
std::string format_duration(double seconds);

}  // namespace pipetrain::train
