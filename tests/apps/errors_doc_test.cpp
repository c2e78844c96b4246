// docs/ERRORS.md, "`pipetrain train`: flags", is checked here row by row: each row's flags are
// added to the base command the section gives (a flag of the row replaces the base's), run, and
// the exit code and the message must be the ones the row shows. So the page cannot drift from
// the program: a changed message, a check removed or a new exit code fails this test.
#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../helpers/cli_run.h"

namespace pipetrain::errors_doc_test {

const std::string kPage = std::string(PIPETRAIN_SOURCE_DIR) + "/docs/ERRORS.md";
const std::string kSection = "## `pipetrain train`: flags";

struct Row {
  std::string flags;
  int exit_code = -1;
  std::string message;
};

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string word; in >> word;) out.push_back(word);
  return out;
}

// The text between the first two backticks of `cell`; "" when there are none.
std::string between_backticks(const std::string& cell) {
  const auto open = cell.find('`');
  const auto close = open == std::string::npos ? open : cell.find('`', open + 1);
  return close == std::string::npos ? "" : cell.substr(open + 1, close - open - 1);
}

// The section's base command (its indented line, less "pipetrain") and its rows.
void read_section(std::string& base, std::vector<Row>& rows) {
  std::ifstream in(kPage);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) inside = line == kSection;
    if (!inside) continue;
    if (line.rfind("    pipetrain ", 0) == 0) base = line.substr(14);
    if (line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    std::istringstream split(line.substr(1));
    for (std::string cell; std::getline(split, cell, '|');) cells.push_back(cell);
    if (cells.size() < 3) continue;
    Row row;
    row.flags = between_backticks(cells[0]);
    row.exit_code = std::stoi(cells[1]);
    row.message = between_backticks(cells[2]);
    rows.push_back(row);
  }
}

// `base` with `flags` added; a flag given in `flags` drops the same flag (and its value) of base.
std::string command_line(const std::string& base, const std::string& flags) {
  const std::vector<std::string> given = words(flags);
  const std::vector<std::string> base_words = words(base);
  std::string line;
  for (std::size_t w = 0; w < base_words.size(); ++w) {
    const bool replaced = base_words[w].rfind("--", 0) == 0 &&
                          std::find(given.begin(), given.end(), base_words[w]) != given.end();
    if (replaced) {
      ++w;  // and its value
      continue;
    }
    line += base_words[w] + " ";
  }
  return line + flags;
}

TEST(ErrorsPage, EveryTrainFlagRowGetsItsExitCodeAndMessage) {
  std::string base;
  std::vector<Row> rows;
  read_section(base, rows);
  ASSERT_FALSE(base.empty()) << "no base command in " << kPage;
  ASSERT_GE(rows.size(), 40u) << "the table of " << kPage << " was not found whole";
  for (const Row& row : rows) {
    ASSERT_FALSE(row.flags.empty() || row.message.empty()) << "a row without flags or message";
    const std::string arguments = command_line(base, row.flags);
    const testing::CliRun run = testing::run_pipetrain(arguments);
    EXPECT_EQ(run.exit_code, row.exit_code) << arguments << "\n" << run.output;
    EXPECT_NE(run.output.find(row.message), std::string::npos)
        << arguments << "\nexpected '" << row.message << "' in:\n"
        << run.output;
    EXPECT_EQ(run.output.find("frame #"), std::string::npos) << arguments << "\n" << run.output;
  }
}

}  // namespace pipetrain::errors_doc_test
