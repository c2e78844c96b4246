// Text grids: rank x step (render_grid) and rank x time slot (render_time_grid).
#include "pipetrain/schedule/grid.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace pipetrain::schedule {
namespace {

std::string pad(const std::string& text, std::size_t width) {
  return text.size() >= width ? text : text + std::string(width - text.size(), ' ');
}

std::string pad_left(const std::string& text, std::size_t width) {
  return text.size() >= width ? text : std::string(width - text.size(), ' ') + text;
}

}  // namespace

std::string render_grid(const Schedule& schedule, const std::vector<GridCell>& marks,
                        int max_columns) {
  const int ranks = static_cast<int>(schedule.actions.size());
  int steps = 0;
  std::size_t width = 3;
  for (const auto& list : schedule.actions) {
    steps = std::max(steps, static_cast<int>(list.size()));
    for (const auto& action : list) width = std::max(width, to_string(action).size());
  }
  // Which columns to draw: all, or a window around the marks.
  int first = 0;
  int last = steps - 1;
  if (max_columns > 0 && steps > max_columns) {
    int low = steps;
    int high = -1;
    for (const auto& cell : marks) {
      low = std::min(low, cell.step);
      high = std::max(high, cell.step);
    }
    if (high < 0) low = high = 0;
    const int margin = std::max(2, (max_columns - (high - low + 1)) / 2);
    first = std::max(0, low - margin);
    last = std::min(steps - 1, std::max(high + margin, first + max_columns - 1));
  }
  std::set<std::pair<int, int>> marked;
  for (const auto& cell : marks) marked.insert({cell.rank, cell.step});
  const std::size_t cell_width = width + 3;  // room for ">...<" and a space
  const std::string row_head = "rank " + std::to_string(std::max(ranks - 1, 0));
  const std::size_t head_width = row_head.size() + 1;
  std::string out = pad("step", head_width);
  if (first > 0) out += "... ";
  for (int k = first; k <= last; ++k) out += pad(" " + std::to_string(k), cell_width);
  if (last < steps - 1) out += "...";
  while (!out.empty() && out.back() == ' ') out.pop_back();
  out += '\n';
  for (int r = 0; r < ranks; ++r) {
    std::string line = pad("rank " + std::to_string(r), head_width);
    if (first > 0) line += "... ";
    const auto& list = schedule.actions[r];
    for (int k = first; k <= last; ++k) {
      std::string cell = k < static_cast<int>(list.size()) ? to_string(list[k]) : "";
      cell = marked.count({r, k}) ? ">" + cell + "<" : " " + cell;
      line += pad(cell, cell_width);
    }
    if (last < steps - 1) line += "...";
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + '\n';
  }
  return out;
}

std::string render_time_grid(const Timeline& timeline, double slot, int max_columns) {
  const int rows = timeline.rows();
  const double makespan = timeline.makespan();
  if (slot <= 0) {
    slot = makespan > 0 ? makespan : 1;
    for (const auto& event : timeline.events) {
      if (event.end > event.start) slot = std::min(slot, event.end - event.start);
    }
  }
  int columns = static_cast<int>(std::ceil(makespan / slot - 1e-9));
  if (max_columns > 0 && columns > max_columns) {
    slot = makespan / max_columns;
    columns = max_columns;
  }
  columns = std::max(columns, 0);
  std::vector<std::vector<std::string>> cells(rows, std::vector<std::string>(columns, "."));
  std::size_t width = 3;
  for (const auto& event : timeline.events) {
    // A slot shows the event running at its midpoint.
    const int from = static_cast<int>(std::ceil(event.start / slot - 0.5 - 1e-9));
    const int to = static_cast<int>(std::ceil(event.end / slot - 0.5 - 1e-9));
    for (int c = std::max(from, 0); c < std::min(to, columns); ++c) {
      cells[event.rank][c] = event.label;
      width = std::max(width, event.label.size());
    }
  }
  const std::string row_head = "rank " + std::to_string(std::max(rows - 1, 0));
  const std::size_t head_width = row_head.size() + 1;
  char slot_text[64];
  std::snprintf(slot_text, sizeof slot_text, "%g", slot);
  std::string out = "one column = " + std::string(slot_text) + " " + timeline.time_unit + "\n";
  for (int r = 0; r < rows; ++r) {
    std::string line = pad("rank " + std::to_string(r), head_width);
    for (int c = 0; c < columns; ++c) line += pad_left(cells[r][c], width) + " ";
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + '\n';
  }
  return out;
}

}  // namespace pipetrain::schedule
