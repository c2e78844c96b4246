// Measured action events -> Chrome trace and SVG timeline (pipetrain/train/event_log.h).
#include "pipetrain/train/event_log.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>

#include "pipetrain/base/error.h"
#include "pipetrain/schedule/chrome_trace.h"
#include "pipetrain/schedule/timeline.h"
#include "pipetrain/schedule/timeline_svg.h"

namespace pipetrain::train {
namespace {

// One event on the wire: step, rank, stage, op, micro-batch, start, end.
struct PackedEvent {
  int64_t step;
  int32_t rank, stage, op, microbatch;
  double start_us, end_us;
  int32_t lane, unused;
};

// One StepCounts' head on the wire (its values follow).
struct PackedCounts {
  int64_t step;
  int32_t rank, unused;
  int64_t layer;
  double time_us;
  int64_t values;
};

// One collective on the wire: step, rank, kind, stage, start, end, bytes.
struct PackedCollective {
  int64_t step;
  int32_t rank, kind, stage, unused;
  double start_us, end_us;
  int64_t bytes;
};

// `compute_only` leaves out sends and receives: in a picture a receive's box paints the waiting
// for a peer as work.
schedule::Timeline timeline_of(const std::vector<const StepEvent*>& events, int ranks,
                               const std::string& title, bool compute_only,
                               const std::vector<StepCollective>& collectives = {},
                               const std::vector<StepCounts>& counts = {}) {
  schedule::Timeline timeline;
  timeline.title = title;
  timeline.num_ranks = ranks;
  timeline.time_unit = "ms";
  timeline.microseconds_per_unit = 1000.0;
  double origin = std::numeric_limits<double>::infinity();
  for (const StepEvent* e : events) origin = std::min(origin, e->event.start_us);
  // A backward run beside a forward (--ep-overlap, parallel/lane.h) goes on a row of its own,
  // "rank r lane 1", after the ranks' (and their collectives') rows.
  bool lanes = false;
  for (const StepEvent* e : events) lanes = lanes || e->event.lane != 0;
  const int lane_row = collectives.empty() ? ranks : 2 * ranks;
  for (const StepEvent* e : events) {
    if (compute_only && !schedule::is_compute(e->event.action.op)) continue;
    timeline.events.push_back(schedule::make_event(
        e->event.lane != 0 ? lane_row + e->event.rank : e->event.rank, e->event.action,
        (e->event.start_us - origin) / 1000.0, (e->event.end_us - origin) / 1000.0));
  }
  if (lanes || !collectives.empty()) {
    auto add_rows = [&](const std::string& suffix) {
      for (int r = 0; r < ranks; ++r) {
        timeline.row_names.push_back("rank " + std::to_string(r) + suffix);
      }
    };
    add_rows("");
    if (!collectives.empty()) add_rows(" collectives");
    if (lanes) add_rows(" lane 1");
    timeline.num_ranks = static_cast<int>(timeline.row_names.size());
  }
  for (const StepCounts& c : counts) {
    schedule::TimelineCounter counter;
    counter.name = "rank " + std::to_string(c.rank) + " layer " + std::to_string(c.layer) +
                   " tokens per expert";
    counter.time = (c.time_us - origin) / 1000.0;
    for (size_t e = 0; e < c.values.size(); ++e) {
      counter.values.emplace_back("expert " + std::to_string(e), static_cast<double>(c.values[e]));
    }
    timeline.counters.push_back(std::move(counter));
  }
  if (collectives.empty()) return timeline;
  // Rank r's collectives on row ranks + r, under the ranks' rows.
  for (const StepCollective& c : collectives) {
    schedule::TimelineEvent event;
    event.rank = ranks + c.event.rank;
    event.stage = c.event.stage;
    event.label = std::string(collective_name(c.event.kind)) +
                  (c.event.stage >= 0 ? " s" + std::to_string(c.event.stage) : "");
    event.category = "collective";
    event.start = (c.event.start_us - origin) / 1000.0;
    event.end = (c.event.end_us - origin) / 1000.0;
    event.bytes = c.event.bytes;
    timeline.events.push_back(event);
  }
  return timeline;
}

}  // namespace

double EventLog::now_us() {
  return CollectiveLog::now_us();  // one monotonic clock for actions and collectives
}

void EventLog::add(int64_t step, double step_start_us, const std::vector<ActionEvent>& events,
                   int rank) {
  for (const ActionEvent& event : events) {
    StepEvent e{step, event};
    if (rank >= 0) e.event.rank = rank;
    e.event.start_us += step_start_us;
    e.event.end_us += step_start_us;
    events_.push_back(e);
  }
}

void EventLog::add_collectives(int64_t step, double step_start_us,
                               const std::vector<CollectiveEvent>& events, int rank) {
  for (const CollectiveEvent& event : events) {
    StepCollective c{step, event};
    c.event.rank = rank;
    c.event.start_us += step_start_us;
    c.event.end_us += step_start_us;
    collectives_.push_back(c);
  }
}

// [number of actions (int64)] [the actions] [number of collectives (int64)] [the collectives]
// [the counts: each its step, rank, layer, time and number of values (PackedCounts), then the
// values (int64)], to the end.
std::vector<char> EventLog::serialize() const {
  std::vector<char> bytes;
  auto put = [&bytes](const void* data, size_t size) {
    const char* from = static_cast<const char*>(data);
    bytes.insert(bytes.end(), from, from + size);
  };
  const auto count = static_cast<int64_t>(events_.size());
  put(&count, sizeof count);
  for (const StepEvent& e : events_) {
    const PackedEvent packed{e.step,
                             e.event.rank,
                             e.event.action.stage,
                             static_cast<int32_t>(e.event.action.op),
                             e.event.action.microbatch,
                             e.event.start_us,
                             e.event.end_us,
                             e.event.lane,
                             0};
    put(&packed, sizeof packed);
  }
  const auto collectives = static_cast<int64_t>(collectives_.size());
  put(&collectives, sizeof collectives);
  for (const StepCollective& c : collectives_) {
    const PackedCollective packed{c.step,
                                  c.event.rank,
                                  static_cast<int32_t>(c.event.kind),
                                  c.event.stage,
                                  0,
                                  c.event.start_us,
                                  c.event.end_us,
                                  c.event.bytes};
    put(&packed, sizeof packed);
  }
  for (const StepCounts& c : counts_) {
    const PackedCounts packed{c.step,  c.rank,    0,
                              c.layer, c.time_us, static_cast<int64_t>(c.values.size())};
    put(&packed, sizeof packed);
    put(c.values.data(), c.values.size() * sizeof(int64_t));
  }
  return bytes;
}

EventLog EventLog::deserialize(const std::vector<char>& bytes) {
  size_t at = 0;
  auto bad = [&bytes]() {
    return TransportFailure("a rank's event log has " + std::to_string(bytes.size()) +
                            " bytes, not counts and whole numbers of events, collectives and "
                            "counts");
  };
  // n records of `size` bytes from `at` (checked against the bytes left, without overflow).
  auto take_count = [&](size_t size) {
    int64_t n = 0;
    if (bytes.size() - at < sizeof n) throw bad();
    std::memcpy(&n, bytes.data() + at, sizeof n);
    at += sizeof n;
    if (n < 0 || static_cast<uint64_t>(n) > (bytes.size() - at) / size) throw bad();
    return static_cast<size_t>(n);
  };
  EventLog log;
  for (size_t n = take_count(sizeof(PackedEvent)); n > 0; --n, at += sizeof(PackedEvent)) {
    PackedEvent packed;
    std::memcpy(&packed, bytes.data() + at, sizeof(PackedEvent));
    if (packed.op < 0 || packed.op > static_cast<int32_t>(schedule::Op::kRecvGradient)) {
      throw TransportFailure("a rank's event log holds an action of unknown kind " +
                             std::to_string(packed.op));
    }
    StepEvent e;
    e.step = packed.step;
    e.event.rank = packed.rank;
    e.event.action.stage = packed.stage;
    e.event.action.op = static_cast<schedule::Op>(packed.op);
    e.event.action.microbatch = packed.microbatch;
    e.event.start_us = packed.start_us;
    e.event.end_us = packed.end_us;
    e.event.lane = packed.lane;
    log.events_.push_back(e);
  }
  for (size_t n = take_count(sizeof(PackedCollective)); n > 0;
       --n, at += sizeof(PackedCollective)) {
    PackedCollective packed;
    std::memcpy(&packed, bytes.data() + at, sizeof(PackedCollective));
    if (packed.kind < 0 || packed.kind > static_cast<int32_t>(CollectiveKind::kAllGather)) {
      throw TransportFailure("a rank's event log holds a collective of unknown kind " +
                             std::to_string(packed.kind));
    }
    StepCollective c;
    c.step = packed.step;
    c.event.rank = packed.rank;
    c.event.kind = static_cast<CollectiveKind>(packed.kind);
    c.event.stage = packed.stage;
    c.event.start_us = packed.start_us;
    c.event.end_us = packed.end_us;
    c.event.bytes = packed.bytes;
    log.collectives_.push_back(c);
  }
  while (at < bytes.size()) {
    PackedCounts packed;
    if (bytes.size() - at < sizeof packed) throw bad();
    std::memcpy(&packed, bytes.data() + at, sizeof packed);
    at += sizeof packed;
    if (packed.values < 0 ||
        static_cast<uint64_t>(packed.values) > (bytes.size() - at) / sizeof(int64_t)) {
      throw bad();
    }
    StepCounts c;
    c.step = packed.step;
    c.rank = packed.rank;
    c.layer = packed.layer;
    c.time_us = packed.time_us;
    c.values.resize(static_cast<size_t>(packed.values));
    std::memcpy(c.values.data(), bytes.data() + at, c.values.size() * sizeof(int64_t));
    at += c.values.size() * sizeof(int64_t);
    log.counts_.push_back(std::move(c));
  }
  return log;
}

void EventLog::merge(const EventLog& other) {
  events_.insert(events_.end(), other.events_.begin(), other.events_.end());
  collectives_.insert(collectives_.end(), other.collectives_.begin(), other.collectives_.end());
  counts_.insert(counts_.end(), other.counts_.begin(), other.counts_.end());
}

void EventLog::write_chrome_trace(const std::string& path, int ranks) const {
  std::vector<const StepEvent*> all;
  for (const StepEvent& e : events_) all.push_back(&e);
  schedule::save_chrome_trace(
      timeline_of(all, ranks, "pipetrain train", false, collectives_, counts_), path);
}

int64_t EventLog::write_timeline_svg(const std::string& path, int ranks, const std::string& title,
                                     int64_t k) const {
  if (k < 0) {
    // The last step whose event count is the largest: a short last batch (fewer micro-batches)
    // is not what a reader wants to see.
    std::map<int64_t, size_t> per_step;
    for (const StepEvent& e : events_) ++per_step[e.step];
    size_t most = 0;
    for (const auto& [step, count] : per_step) most = std::max(most, count);
    for (const auto& [step, count] : per_step) {
      if (count == most) k = step;
    }
  }
  std::vector<const StepEvent*> chosen;
  for (const StepEvent& e : events_) {
    if (e.step == k) chosen.push_back(&e);
  }
  schedule::save_svg(
      timeline_of(chosen, ranks, title + " (measured, step " + std::to_string(k) + ")", true),
      path);
  return k;
}

}  // namespace pipetrain::train
