// EventLog: the measured actions of a training run, written as a Chrome trace of every step
// (`pipetrain train --trace FILE.json`) or as the SVG timeline of one step (`--timeline FILE.svg`:
// rows = ranks, boxes = actions). The Trainer (train/trainer.h) keeps one when asked to trace.
//
// Each rank records its own events in microseconds on the machine's monotonic clock (the same
// clock in every process of one machine), so the ranks' events line up without any clock
// exchange. In a multi-process run each rank serializes its log, the logs are gathered to rank 0
// and merged there (merge_event_logs), which writes the files.
//
//   step k of rank r: events of Pipe::last_events() / DistributedPipe::last_events(), which are
//   relative to the step's start; add(k, step_start_us, events) makes them absolute.
//
// Thread-safety: none; the training loop's thread owns the log.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/runtime/collective_log.h"
#include "pipetrain/runtime/step.h"

namespace pipetrain::train {

struct StepEvent {
  int64_t step = 0;   // k
  ActionEvent event;  // start_us/end_us absolute (monotonic clock, microseconds)
};

struct StepCollective {
  int64_t step = 0;       // k
  CollectiveEvent event;  // absolute, as StepEvent's
};

// Counts a rank reports at the end of step k: a mixture's MoE layer `layer`'s tokens per expert
// (models/routing.h). A Chrome trace counter ("ph": "C") named "rank r layer l tokens per expert".
struct StepCounts {
  int64_t step = 0;
  int rank = 0;
  double time_us = 0;  // absolute, as StepEvent's
  int64_t layer = 0;
  std::vector<int64_t> values;
};

class EventLog {
 public:
  // Microseconds on the monotonic clock now.
  static double now_us();

  // Appends the events of step k, which started (by the caller's clock) at step_start_us.
  // `rank` >= 0 replaces each event's rank (a process's world rank in a multi-process run).
  void add(int64_t step, double step_start_us, const std::vector<ActionEvent>& events,
           int rank = -1);

  // Appends the data-parallel collectives of step k (times relative to its start, as add's),
  // filed under `rank`.
  void add_collectives(int64_t step, double step_start_us,
                       const std::vector<CollectiveEvent>& events, int rank);

  // Appends counts of step k taken at time_us on `rank`.
  void add_counts(StepCounts counts) { counts_.push_back(std::move(counts)); }

  const std::vector<StepEvent>& events() const { return events_; }
  const std::vector<StepCollective>& collectives() const { return collectives_; }
  const std::vector<StepCounts>& counts() const { return counts_; }

  std::vector<char> serialize() const;
  static EventLog deserialize(const std::vector<char>& bytes);
  void merge(const EventLog& other);

  // Chrome trace of every step; times from the first event. With collectives, a row
  // "rank r collectives" per rank follows the ranks' rows.
  void write_chrome_trace(const std::string& path, int ranks) const;
  // SVG of step k (the last recorded full step when k < 0): times from that step's first event,
  // compute actions only (a receive's box would paint the waiting as work). Returns the step drawn.
  int64_t write_timeline_svg(const std::string& path, int ranks, const std::string& title,
                             int64_t k = -1) const;

 private:
  std::vector<StepEvent> events_;
  std::vector<StepCollective> collectives_;
  std::vector<StepCounts> counts_;
};

}  // namespace pipetrain::train
