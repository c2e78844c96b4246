// Schedule text form: parse, format, load, save (format described in text_format.h).
#include "pipetrain/schedule/text_format.h"
#include "pipetrain/base/error.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "pipetrain/base/atomic_file.h"
#include "pipetrain/schedule/csv_format.h"
#include "text_util.h"

namespace pipetrain::schedule {
namespace {

using detail::trim;

[[noreturn]] void fail_at(int line, std::string_view token, const std::string& why) {
  throw BadInput("line " + std::to_string(line) + ", token '" + std::string(token) + "': " + why);
}

}  // namespace

Schedule parse_schedule(std::string_view text, const std::string& name) {
  Schedule schedule;
  schedule.name = name;
  // Where each stage was first seen: rank and line, to name both when it shows up elsewhere.
  std::vector<int> stage_rank;
  std::vector<int> stage_line;
  int max_microbatch = -1;
  int line_number = 0;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    auto newline = text.find('\n', pos);
    if (newline == std::string_view::npos) newline = text.size();
    std::string_view line = text.substr(pos, newline - pos);
    pos = newline + 1;
    ++line_number;
    if (auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty()) continue;
    const int r = static_cast<int>(schedule.actions.size());
    schedule.actions.emplace_back();
    if (line == "-") continue;  // a rank with no actions
    std::size_t start = 0;
    while (start <= line.size()) {
      auto comma = line.find(',', start);
      if (comma == std::string_view::npos) comma = line.size();
      std::string_view token = trim(line.substr(start, comma - start));
      start = comma + 1;
      if (token.empty()) fail_at(line_number, token, "empty action (two commas in a row?)");
      Action action;
      try {
        action = parse_action(token);
      } catch (const BadInput& e) {
        fail_at(line_number, token, e.message());
      }
      const int j = action.stage;
      if (j >= kMaxScheduleStages || action.microbatch >= kMaxScheduleMicrobatches) {
        fail_at(line_number, token,
                "stage and micro-batch indices must be below " +
                    std::to_string(kMaxScheduleStages) + " and " +
                    std::to_string(kMaxScheduleMicrobatches));
      }
      if (j >= static_cast<int>(stage_rank.size())) {
        stage_rank.resize(j + 1, -1);
        stage_line.resize(j + 1, 0);
      }
      if (stage_rank[j] == -1) {
        stage_rank[j] = r;
        stage_line[j] = line_number;
      } else if (stage_rank[j] != r) {
        fail_at(line_number, token,
                "stage " + std::to_string(j) + " is already on rank " +
                    std::to_string(stage_rank[j]) + " (line " + std::to_string(stage_line[j]) +
                    "); a stage runs on exactly one rank, so move all of stage " +
                    std::to_string(j) + "'s actions to one line");
      }
      max_microbatch = std::max(max_microbatch, action.microbatch);
      schedule.actions[r].push_back(action);
    }
  }
  if (schedule.actions.empty()) {
    throw BadInput(
        "schedule text has no rank lines (only blank lines or comments); "
        "write one line of comma-separated actions per rank, e.g. "
        "0F0,0B0");
  }
  for (std::size_t j = 0; j < stage_rank.size(); ++j) {
    if (stage_rank[j] == -1) {
      throw BadInput("stage " + std::to_string(j) + " never appears, but stage " +
                     std::to_string(stage_rank.size() - 1) + " does; stages must be numbered 0.." +
                     std::to_string(stage_rank.size() - 1) + " without gaps");
    }
  }
  const long long cells = static_cast<long long>(stage_rank.size()) * (max_microbatch + 1);
  if (cells > kMaxScheduleCells) {
    throw BadInput("schedule of " + std::to_string(stage_rank.size()) + " stages x " +
                   std::to_string(max_microbatch + 1) + " micro-batches is past the limit of " +
                   std::to_string(kMaxScheduleCells) + " stage micro-batches");
  }
  schedule.num_ranks = static_cast<int>(schedule.actions.size());
  schedule.num_stages = static_cast<int>(stage_rank.size());
  schedule.num_microbatches = max_microbatch + 1;
  schedule.stage_rank = std::move(stage_rank);
  return schedule;
}

std::string format_schedule(const Schedule& schedule) {
  std::string text;
  for (const auto& list : schedule.actions) {
    if (list.empty()) text += "-";
    for (std::size_t k = 0; k < list.size(); ++k) {
      if (k > 0) text += ',';
      text += to_string(list[k]);
    }
    text += '\n';
  }
  return text;
}

Schedule load_schedule(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error("cannot read schedule file '" + path +
                             "'; check the path and permissions");
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    if (is_csv_path(path)) return parse_csv_schedule(buffer.str(), "custom");
    return parse_schedule(buffer.str(), "custom");
  } catch (const BadInput& e) {
    throw BadInput("schedule file '" + path + "', " + e.message());
  }
}

void save_schedule(const Schedule& schedule, const std::string& path, const std::string& comment) {
  if (is_csv_path(path)) {
    write_file_atomically(path, format_csv_schedule(schedule));  // CSV has no comments
    return;
  }
  std::string text;
  std::stringstream lines(comment);
  for (std::string line; std::getline(lines, line);) text += "# " + line + "\n";
  text += format_schedule(schedule);
  write_file_atomically(path, text);
}

}  // namespace pipetrain::schedule
