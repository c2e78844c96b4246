// Chrome trace JSON writer.
#include "pipetrain/schedule/chrome_trace.h"

#include <nlohmann/json.hpp>

#include "pipetrain/base/atomic_file.h"

namespace pipetrain::schedule {

std::string render_chrome_trace(const Timeline& timeline) {
  nlohmann::json events = nlohmann::json::array();
  for (int r = 0; r < timeline.rows(); ++r) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", r},
                      {"args",
                       {{"name", static_cast<size_t>(r) < timeline.row_names.size()
                                     ? timeline.row_names[static_cast<size_t>(r)]
                                     : "rank " + std::to_string(r)}}}});
  }
  const double scale = timeline.microseconds_per_unit;
  for (const auto& event : timeline.events) {
    if (!event.category.empty()) {
      nlohmann::json args = {{"stage", event.stage}};
      if (event.bytes >= 0) args["bytes"] = event.bytes;
      events.push_back({{"name", event.label},
                        {"cat", event.category},
                        {"ph", "X"},
                        {"pid", 0},
                        {"tid", event.rank},
                        {"ts", event.start * scale},
                        {"dur", (event.end - event.start) * scale},
                        {"args", args}});
      continue;
    }
    events.push_back({{"name", event.label},
                      {"cat", std::string(op_name(event.op))},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", event.rank},
                      {"ts", event.start * scale},
                      {"dur", (event.end - event.start) * scale},
                      {"args",
                       {{"stage", event.stage},
                        {"microbatch", event.microbatch},
                        {"op", std::string(op_name(event.op))}}}});
  }
  for (const TimelineCounter& counter : timeline.counters) {
    nlohmann::json args = nlohmann::json::object();
    for (const auto& [series, value] : counter.values) args[series] = value;
    events.push_back({{"name", counter.name},
                      {"ph", "C"},
                      {"pid", 0},
                      {"ts", counter.time * scale},
                      {"args", args}});
  }
  nlohmann::json trace = {{"traceEvents", events},
                          {"displayTimeUnit", "ms"},
                          {"otherData", {{"title", timeline.title}}}};
  return trace.dump(1) + "\n";
}

void save_chrome_trace(const Timeline& timeline, const std::string& path) {
  write_file_atomically(path, render_chrome_trace(timeline));
}

}  // namespace pipetrain::schedule
