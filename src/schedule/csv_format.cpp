// torch.distributed.pipelining's compute-only CSV (format described in csv_format.h). The rows
// are turned into the text form's rank lines, so placement, counts and their errors are the
// text form's.
#include "pipetrain/schedule/csv_format.h"
#include "pipetrain/base/error.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/text_format.h"
#include "text_util.h"

namespace pipetrain::schedule {
namespace {

// A cell without surrounding space and without the quotes a CSV writer may put around it.
std::string_view trim(std::string_view text) {
  text = detail::trim(text);
  if (text.size() >= 2 && text.front() == '"' && text.back() == '"') {
    text = text.substr(1, text.size() - 2);
  }
  return text;
}

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

[[noreturn]] void fail(int row, std::string_view cell, const std::string& why) {
  throw BadInput("row " + std::to_string(row) + ", cell '" + std::string(cell) + "': " + why);
}

// Appends the compute actions of one cell (text form) to `line`.
void add_cell(int row, std::string_view cell, std::string& line) {
  auto append = [&](std::string_view action) {
    try {
      const Action parsed = parse_action(action);
      if (!is_compute(parsed.op)) {
        fail(row, cell,
             "a send or receive; the CSV schedule is compute-only (F, I, W, B) and pipetrain "
             "adds the communication itself");
      }
      line += (line.empty() ? "" : ",") + to_string(parsed);
    } catch (const BadInput& e) {
      if (std::string_view(e.what()).rfind("row ", 0) == 0) throw;
      fail(row, cell, e.message());
    }
  };
  if (cell.empty()) return;
  if (ends_with(cell, "REDUCE_GRAD") || ends_with(cell, "UNSHARD") || ends_with(cell, "RESHARD")) {
    return;  // torch's parameter-sharding bookkeeping: nothing to compute
  }
  if (cell.front() == '(') {
    const auto close = cell.find(')');
    if (close == std::string_view::npos || cell.substr(close + 1) != "OVERLAP_F_B") {
      fail(row, cell, "a group must read (action;action)OVERLAP_F_B");
    }
    std::string_view inner = cell.substr(1, close - 1);
    while (!inner.empty()) {
      const auto semicolon = std::min(inner.find(';'), inner.size());
      append(trim(inner.substr(0, semicolon)));
      inner = semicolon < inner.size() ? inner.substr(semicolon + 1) : std::string_view();
    }
    return;
  }
  if (cell.find("SEND_") != std::string_view::npos ||
      cell.find("RECV_") != std::string_view::npos) {
    fail(row, cell,
         "a send or receive; the CSV schedule is compute-only (F, I, W, B) and pipetrain adds "
         "the communication itself");
  }
  append(cell);
}

}  // namespace

bool is_csv_path(const std::string& path) {
  if (path.size() < 4) return false;
  std::string tail = path.substr(path.size() - 4);
  std::transform(tail.begin(), tail.end(), tail.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return tail == ".csv";
}

Schedule parse_csv_schedule(std::string_view text, const std::string& name) {
  // One row per rank, as torch's writer makes them and its reader (Python's csv) reads them: a
  // blank row is a rank with no compute (or only FSDP cells); the line ending of the last row
  // starts no row of its own.
  std::string lines;
  int row = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    auto newline = text.find('\n', pos);
    if (newline == std::string_view::npos) newline = text.size();
    const std::string_view record = text.substr(pos, newline - pos);
    pos = newline + 1;
    ++row;
    std::string line;
    std::size_t start = 0;
    while (start <= record.size()) {
      const auto comma = std::min(record.find(',', start), record.size());
      add_cell(row, trim(record.substr(start, comma - start)), line);
      start = comma + 1;
    }
    lines += (line.empty() ? "-" : line) + "\n";
  }
  if (lines.find_first_not_of("-\n") == std::string::npos) {
    throw BadInput("the CSV schedule has no rows; write one row of actions per rank");
  }
  try {
    return parse_schedule(lines, name);
  } catch (const BadInput& e) {
    // The text form counts lines; here they are the non-blank rows.
    throw BadInput(std::string("CSV schedule: ") + e.message());
  }
}

std::string format_csv_schedule(const Schedule& schedule) {
  const Schedule plain = is_lowered(schedule) ? compute_only(schedule) : schedule;
  std::string text;
  for (const auto& list : plain.actions) {
    for (std::size_t k = 0; k < list.size(); ++k) {
      if (k > 0) text += ',';
      text += to_string(list[k]);
    }
    text += "\r\n";  // as Python's csv writer ends rows
  }
  return text;
}

}  // namespace pipetrain::schedule
