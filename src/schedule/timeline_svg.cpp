// SVG Gantt writer.
//
//   +---------------------------------------------------------------+
//   | title                                                         |
//   | rank 0 [F0][F1]      [B0 ][B1 ]                               |
//   | rank 1     [F0][F1][B0 ][B1 ]                                 |
//   |        |----|----|----|----| time axis (units)                |
//   |        [F] forward [B] backward [I] ... legend                |
//   +---------------------------------------------------------------+
#include "pipetrain/schedule/timeline_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "pipetrain/base/atomic_file.h"

namespace pipetrain::schedule {
namespace {

const char* fill_of(Op op) {
  switch (op) {
    case Op::kForward:
      return "#4e79a7";
    case Op::kBackward:
      return "#59a14f";
    case Op::kBackwardInput:
      return "#f28e2b";
    case Op::kBackwardWeight:
      return "#b07aa1";
    default:
      return "#bab0ac";
  }
}

const char* legend_of(Op op) {
  switch (op) {
    case Op::kForward:
      return "F forward";
    case Op::kBackward:
      return "B backward";
    case Op::kBackwardInput:
      return "I input grad";
    case Op::kBackwardWeight:
      return "W weight grad";
    default:
      return "send / recv";
  }
}

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string num(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.2f", value);
  std::string text = buffer;
  while (text.back() == '0') text.pop_back();
  if (text.back() == '.') text.pop_back();
  return text;
}

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `target` ticks.
double tick_step(double span, int target) {
  if (span <= 0) return 1;
  const double raw = span / target;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * power) return m * power;
  }
  return 10 * power;
}

}  // namespace

std::string render_svg(const Timeline& timeline) {
  const int rows = std::max(timeline.rows(), 1);
  const double makespan = timeline.makespan() > 0 ? timeline.makespan() : 1.0;
  const double left = 70;
  const double top = 40;
  const double row_height = 26;
  const double plot_width = std::clamp(40.0 * timeline.events.size() / rows, 600.0, 4000.0);
  const double scale = plot_width / makespan;
  const double axis_y = top + rows * row_height + 6;
  const double legend_y = axis_y + 40;
  // Wide enough for the title too: 14 px bold sans-serif averages under 9 px a character.
  const double title_width = 9.0 * static_cast<double>(timeline.title.size());
  const double width = left + std::max(plot_width, title_width) + 20;
  const double height = legend_y + 30;

  std::string svg;
  svg += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width) + "\" height=\"" +
         num(height) + "\" viewBox=\"0 0 " + num(width) + " " + num(height) +
         "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += "<text x=\"" + num(left) + "\" y=\"22\" font-size=\"14\" font-weight=\"bold\">" +
         escape(timeline.title) + "</text>\n";
  for (int r = 0; r < rows; ++r) {
    const double y = top + r * row_height;
    svg += "<text x=\"8\" y=\"" + num(y + row_height * 0.65) + "\">rank " + std::to_string(r) +
           "</text>\n";
    svg += "<rect x=\"" + num(left) + "\" y=\"" + num(y) + "\" width=\"" + num(plot_width) +
           "\" height=\"" + num(row_height - 4) + "\" fill=\"#f4f4f4\"/>\n";
  }
  std::set<Op> used;
  for (const auto& event : timeline.events) {
    used.insert(event.op);
    const double x = left + event.start * scale;
    const double w = std::max((event.end - event.start) * scale, 0.5);
    const double y = top + event.rank * row_height;
    svg += "<g><title>" + escape(event.label) + " " + num(event.start) + "-" + num(event.end) +
           " " + escape(timeline.time_unit) + "</title><rect x=\"" + num(x) + "\" y=\"" + num(y) +
           "\" width=\"" + num(w) + "\" height=\"" + num(row_height - 4) + "\" fill=\"" +
           fill_of(event.op) + "\" stroke=\"white\" stroke-width=\"0.5\"/>";
    // Micro-batch number inside the box when it fits (about 7 px per digit).
    const std::string text = std::to_string(event.microbatch);
    if (w >= 7.0 * text.size() + 2) {
      svg += "<text x=\"" + num(x + w / 2) + "\" y=\"" + num(y + row_height * 0.6) +
             "\" text-anchor=\"middle\" fill=\"white\">" + text + "</text>";
    }
    svg += "</g>\n";
  }
  // Time axis.
  svg += "<line x1=\"" + num(left) + "\" y1=\"" + num(axis_y) + "\" x2=\"" +
         num(left + plot_width) + "\" y2=\"" + num(axis_y) + "\" stroke=\"black\"/>\n";
  const double step = tick_step(makespan, 10);
  for (double t = 0; t <= makespan + 1e-9; t += step) {
    const double x = left + t * scale;
    svg += "<line x1=\"" + num(x) + "\" y1=\"" + num(axis_y) + "\" x2=\"" + num(x) + "\" y2=\"" +
           num(axis_y + 4) + "\" stroke=\"black\"/><text x=\"" + num(x) + "\" y=\"" +
           num(axis_y + 16) + "\" text-anchor=\"middle\">" + num(t) + "</text>\n";
  }
  svg += "<text x=\"" + num(left + plot_width) + "\" y=\"" + num(axis_y + 30) +
         "\" text-anchor=\"end\">time (" + escape(timeline.time_unit) + ")</text>\n";
  // Legend: the ops that occur (communication ops share one entry).
  double x = left;
  bool comm_done = false;
  for (Op op : used) {
    if (is_communication(op)) {
      if (comm_done) continue;
      comm_done = true;
    }
    svg += "<rect x=\"" + num(x) + "\" y=\"" + num(legend_y) +
           "\" width=\"12\" height=\"12\" fill=\"" + fill_of(op) + "\"/><text x=\"" + num(x + 16) +
           "\" y=\"" + num(legend_y + 10) + "\">" + legend_of(op) + "</text>\n";
    x += 110;
  }
  svg += "</svg>\n";
  return svg;
}

void save_svg(const Timeline& timeline, const std::string& path) {
  write_file_atomically(path, render_svg(timeline));
}

}  // namespace pipetrain::schedule
