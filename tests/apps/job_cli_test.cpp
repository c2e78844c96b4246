// The job as the CLI sees it (job/job_file.h, apps/pipetrain/job_flags.cpp): `--print-config`
// writes a file that `--config` runs as the same job, bit for bit (across processes, with ZeRO-3
// and documents: TrainDocuments.PackNoneOfMicroBatchesOfEveryWidthEqualsTransformers); `--resume
// DIR` alone continues the job DIR/job.toml holds; and the three views of the settings --
// `--help`, docs/TRAIN_CLI.md's reference table and the config file's keys -- cannot drift apart.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../helpers/cli_run.h"
#include "../helpers/params_file.h"

namespace pipetrain::job_cli_test {
namespace {

using testing::CliRun;
using testing::run_pipetrain;

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// ---- the three views of the settings ------------------------------------------------------------

constexpr const char* kTableBegin =
    "<!-- job-reference: train (pipetrain train --reference-table) -->";
constexpr const char* kTableEnd = "<!-- job-reference end -->";

struct Row {
  std::string section, flag, key, shown_default;
};

std::string between_backticks(const std::string& cell) {
  const auto open = cell.find('`');
  const auto close = open == std::string::npos ? open : cell.find('`', open + 1);
  return close == std::string::npos ? "" : cell.substr(open + 1, close - open - 1);
}

// The reference table's rows: `| **Title** | `[section]` | | |` heads a section.
std::vector<Row> table_rows(const std::string& table) {
  std::vector<Row> rows;
  std::istringstream in(table);
  std::string section;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| ", 0) != 0) continue;
    std::vector<std::string> cells;
    std::istringstream split(line.substr(1));
    for (std::string cell; std::getline(split, cell, '|');) cells.push_back(cell);
    if (cells.size() < 4) continue;
    if (cells[0].find("**") != std::string::npos) {
      section = between_backticks(cells[1]);
      section = section.substr(1, section.size() - 2);  // [name]
      continue;
    }
    const std::string flag = between_backticks(cells[0]);
    if (flag.empty() || flag == "Flag") continue;
    rows.push_back({section, flag, between_backticks(cells[1]), between_backticks(cells[2])});
  }
  return rows;
}

TEST(JobCli, TrainCliMdHoldsTheReferenceTableTheCommandPrints) {
  const std::string page = read_file(std::string(PIPETRAIN_SOURCE_DIR) + "/docs/TRAIN_CLI.md");
  const auto begin = page.find(kTableBegin);
  const auto end = page.find(kTableEnd);
  ASSERT_NE(begin, std::string::npos) << "docs/TRAIN_CLI.md lost its marker " << kTableBegin;
  ASSERT_NE(end, std::string::npos);
  const std::string documented = page.substr(begin + std::string(kTableBegin).size() + 1,
                                             end - begin - std::string(kTableBegin).size() - 1);
  const CliRun run = run_pipetrain("train --reference-table");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(documented, run.output)
      << "docs/TRAIN_CLI.md's table is not the settings' declaration: paste the output of "
         "`build/pipetrain train --reference-table` between its markers";
}

TEST(JobCli, HelpListsEveryRowOfTheTableUnderItsSectionWithItsDefault) {
  const CliRun table = run_pipetrain("train --reference-table");
  const CliRun help = run_pipetrain("train --help");
  ASSERT_EQ(help.exit_code, 0) << help.output;
  const std::vector<Row> rows = table_rows(table.output);
  ASSERT_GT(rows.size(), 80u);
  // --help: a group heading ("Pipeline: stages, micro-batches, schedule:") then its options,
  // each line "  --flag TYPE=DEFAULT  help" (the help on the next line when the rest is long, or
  // after one space only).
  std::map<std::string, std::string> group_of;  // flag -> the heading above it
  std::map<std::string, std::string> after_of;  // flag -> what follows "TYPE=" on its line
  std::string group;
  std::istringstream in(help.output);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != ' ' && line.back() == ':') {
      group = line.substr(0, line.size() - 1);
    }
    const auto at = line.find_first_not_of(' ');
    if (at == std::string::npos || line.compare(at, 2, "--") != 0) continue;
    const auto flag_end = line.find(' ', at);
    const std::string flag = line.substr(at, flag_end - at);
    group_of[flag] = group;
    if (flag_end == std::string::npos) continue;
    const auto type_end = line.find(' ', flag_end + 1);
    const auto equals = line.find('=', flag_end + 1);
    if (equals != std::string::npos && equals < type_end) after_of[flag] = line.substr(equals + 1);
  }
  std::set<std::string> titles;
  for (const Row& row : rows) {
    ASSERT_TRUE(group_of.count(row.flag)) << row.flag << " is in the table, not in --help";
    titles.insert(group_of[row.flag]);
    // A flag (on/off) shows no default in --help; every other option shows the table's (a
    // list's space-separated).
    if (row.shown_default == "false") {
      EXPECT_FALSE(after_of.count(row.flag)) << row.flag;
    } else if (!row.shown_default.empty()) {
      std::string listed = row.shown_default;
      std::replace(listed.begin(), listed.end(), ',', ' ');
      const std::string& after = after_of[row.flag];
      EXPECT_TRUE(after.rfind(row.shown_default, 0) == 0 || after.rfind(listed, 0) == 0)
          << row.flag << ": --help shows '" << after << "', the table '" << row.shown_default
          << "'";
    }
  }
  // Every section is a group of its own.
  std::set<std::string> sections;
  for (const Row& row : rows) sections.insert(row.section);
  EXPECT_EQ(titles.size(), sections.size());
  for (const auto& [flag, heading] : group_of) {
    if (flag == "--help" || flag == "--config" || flag == "--print-config" ||
        flag == "--deepspeed-config") {
      continue;  // the job files' flags, in the "Job file" group
    }
    const bool listed =
        std::any_of(rows.begin(), rows.end(), [&](const Row& row) { return row.flag == flag; });
    EXPECT_TRUE(listed) << flag << " is in --help, not in the table";
  }
}

TEST(JobCli, PrintConfigWritesEveryKeyOfTheTable) {
  const CliRun table = run_pipetrain("train --reference-table");
  const CliRun printed =
      run_pipetrain("train --print-config", testing::CliOptions().without_stderr());
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  std::set<std::string> keys;  // "section.key", a commented optional too
  std::string section;
  std::istringstream in(printed.output);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("[", 0) == 0) section = line.substr(1, line.find(']') - 1);
    std::string body = line.rfind("# ", 0) == 0 && line.find(" = ...") != std::string::npos
                           ? line.substr(2)
                           : line;
    const auto equals = body.find(" = ");
    if (body.rfind("#", 0) == 0 || equals == std::string::npos) continue;
    keys.insert(section + "." + body.substr(0, equals));
  }
  std::set<std::string> table_keys;
  for (const Row& row : table_rows(table.output)) table_keys.insert(row.section + "." + row.key);
  EXPECT_EQ(keys, table_keys);
}

// ---- the same job from a file -------------------------------------------------------------------

TEST(JobCli, APrintedJobRunsAsTheOriginalBitForBitInOneProcess) {
  const std::string dir = ::testing::TempDir() + "/job-one-process";
  fs::create_directories(dir);
  const std::string flags =
      "train --model mlp --data synthetic --synthetic-samples 64 --batch-size 16 --steps 3 "
      "--stages 2 --schedule zb-h1 --optimizer adamw --lr 0.01 --seed 3";
  const CliRun original = run_pipetrain(flags + " --save-params " + dir + "/original.pt");
  ASSERT_EQ(original.exit_code, 0) << original.output;
  const CliRun printed = run_pipetrain(flags + " --print-config > " + dir + "/job.toml");
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  const CliRun again =
      run_pipetrain("train --config " + dir + "/job.toml --save-params " + dir + "/again.pt");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  const auto a = testing::load_params(dir + "/original.pt");
  const auto b = testing::load_params(dir + "/again.pt");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, tensor] : a) EXPECT_TRUE(torch::equal(tensor, b.at(name))) << name;
  // The file's values are the run's: the same pipeline line.
  EXPECT_NE(again.output.find("schedule zb-h1"), std::string::npos) << again.output;
}

TEST(JobCli, ResumeAloneContinuesTheJobOfItsCheckpointDirectory) {
  const std::string dir = ::testing::TempDir() + "/job-resume";
  fs::create_directories(dir);
  const std::string job =
      "train --model mlp --data synthetic --synthetic-samples 64 --batch-size 16 --steps 4 "
      "--stages 2 --optimizer sgd --lr 0.05 --checkpoint-dir " +
      dir + "/run --save-every 2 --save-params " + dir + "/params.pt";
  const CliRun whole = run_pipetrain(job);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  ASSERT_TRUE(fs::exists(dir + "/run/job.toml")) << whole.output;
  fs::rename(dir + "/params.pt", dir + "/uninterrupted.pt");
  // As if the run had stopped after its checkpoint of step 2.
  fs::remove_all(dir + "/run/step-4");
  std::ofstream(dir + "/run/latest") << "step-2\n";
  const CliRun resumed = run_pipetrain("train --resume " + dir + "/run");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + dir + "/run at step 2"), std::string::npos)
      << resumed.output;
  const auto a = testing::load_params(dir + "/uninterrupted.pt");
  const auto b = testing::load_params(dir + "/params.pt");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, tensor] : a) EXPECT_TRUE(torch::equal(tensor, b.at(name))) << name;
}

TEST(JobCli, AFileProblemExitsTwoNamingTheFileLineAndKey) {
  const std::string dir = ::testing::TempDir() + "/job-bad-file";
  fs::create_directories(dir);
  std::ofstream(dir + "/bad.toml") << "[training]\nsteps = 2\n[optimizer]\nlearning_rate = 0.1\n";
  CliRun run = run_pipetrain("train --config " + dir + "/bad.toml");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find(dir + "/bad.toml:4: unknown key 'learning_rate' in [optimizer]"),
            std::string::npos)
      << run.output;
  std::ofstream(dir + "/range.toml") << "[training]\nbatch_size = -3\n";
  run = run_pipetrain("train --config " + dir + "/range.toml");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find(dir + "/range.toml:2: training.batch_size: --batch-size must be at "
                                  "least 1, got -3"),
            std::string::npos)
      << run.output;
  // A flag given beside the file replaces its value.
  std::ofstream(dir + "/steps.toml")
      << "[model]\nname = \"mlp\"\n[data]\nname = \"synthetic\"\nsynthetic_samples = 64\n"
         "[training]\nbatch_size = 0\n";
  run = run_pipetrain("train --config " + dir + "/steps.toml --batch-size 8 --steps 1");
  EXPECT_EQ(run.exit_code, 2) << run.output;  // the file's 0 is refused as the file is read
  std::ofstream(dir + "/ok.toml")
      << "[model]\nname = \"mlp\"\n[data]\nname = \"synthetic\"\nsynthetic_samples = 64\n"
         "[training]\nbatch_size = 32\nsteps = 5\n";
  run = run_pipetrain("train --config " + dir + "/ok.toml --batch-size 8 --steps 1");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("batch 8,"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("done: 1 steps"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace pipetrain::job_cli_test
