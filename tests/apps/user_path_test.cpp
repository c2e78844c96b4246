// The user's path as the docs show it: the commands of the block a page marks with
// "<!-- user-path: ... -->" (docs/DATA.md's "Start to finish", and the README's) run here one by
// one -- prepare data with scripts/prepare-data, train, eval, generate, write it back -- on a tiny
// Hugging Face model with a word-level tokenizer, with the numbers made small (the table below).
// A page's commands that stop working fail this test, so the docs cannot rot.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "../helpers/cli_run.h"
#include "../helpers/hf_models.h"
#include "../helpers/python.h"
#include "../helpers/word_tokenizer.h"

namespace pipetrain::user_path_test {
namespace {

namespace fs = std::filesystem;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The commands of the fenced block after the page's user-path marker: continuation lines joined,
// comments dropped. Empty when the page has no marker.
std::vector<std::string> marked_commands(const std::string& page) {
  const std::string text = read_text(page);
  const size_t marker = text.find("<!-- user-path:");
  if (marker == std::string::npos) return {};
  const size_t open = text.find("```", marker);
  const size_t begin = text.find('\n', open) + 1;
  const size_t end = text.find("```", begin);
  std::vector<std::string> commands;
  std::string command;
  size_t at = begin;
  while (at < end) {
    const size_t eol = text.find('\n', at);
    std::string line = text.substr(at, eol - at);
    at = eol + 1;
    const size_t comment = line.find(" #");
    if (!line.empty() && line[0] == '#') line.clear();
    if (comment != std::string::npos) line = line.substr(0, comment);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    const bool continued = !line.empty() && line.back() == '\\';
    if (continued) line.pop_back();
    command += line;
    if (!continued) {
      if (command.find_first_not_of(' ') != std::string::npos) commands.push_back(command);
      command.clear();
    }
  }
  return commands;
}

void replace_all(std::string& text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
}

// A copy of the fixture Llama (vocabulary 64, EOS 2) with a word-level tokenizer: "<bos>" 0,
// "<eos>" 1, "w0".."w59" 2..61.
std::string tiny_model(const std::string& dir) {
  const std::string model = dir + "/model";
  fs::create_directories(model);
  for (const auto& entry : fs::directory_iterator(testing::hf_fixtures() + "/llama")) {
    fs::copy_file(entry.path(), model + "/" + entry.path().filename().string(),
                  fs::copy_options::overwrite_existing);
  }
  EXPECT_TRUE(testing::write_word_tokenizer(model)) << model;
  return model;
}

// `records` prompt/completion pairs of 2 to 12 words each.
void write_pairs(const std::string& path, int records, int seed) {
  std::ofstream out(path);
  for (int r = 0; r < records; ++r) {
    std::string prompt, completion;
    for (int w = 0; w < 2 + (r * 5 + seed) % 11; ++w) {
      prompt += (w ? " w" : "w") + std::to_string((r * 7 + w * 3 + seed) % 60);
    }
    for (int w = 0; w < 2 + (r * 3 + seed) % 9; ++w) {
      completion += (w ? " w" : "w") + std::to_string((r * 11 + w * 5 + seed) % 60);
    }
    out << "{\"prompt\": \"" << prompt << "\", \"completion\": \"" << completion << "\"}\n";
  }
}

// The numbers of the pages' commands, made small enough for the tiny model and a test.
const std::vector<std::pair<std::string, std::string>> kSmaller = {
    {"--seq-len 1024", "--seq-len 32"}, {"--batch-size 16", "--batch-size 8"},
    {"--steps 500", "--steps 4"},       {"--save-every 100", "--save-every 2"},
    {"--lr 2e-5", "--lr 1e-2"},         {"--max-new-tokens 32", "--max-new-tokens 5"}};

void run_user_path(const std::string& page, const std::string& name) {
  const std::vector<std::string> commands = marked_commands(page);
  ASSERT_GE(commands.size(), 4u) << page << " has no user-path block of commands";
  const std::string dir = testing::scratch_dir("user_path/" + name);
  const std::string model = tiny_model(dir);
  write_pairs(dir + "/pairs.jsonl", 64, 0);
  write_pairs(dir + "/heldout.jsonl", 16, 1);
  std::string outputs;
  for (std::string command : commands) {
    replace_all(command, "MODEL_DIR", model);
    replace_all(command, "scripts/prepare-data",
                std::string(PIPETRAIN_SOURCE_DIR) + "/scripts/prepare-data");
    replace_all(command, "build/pipetrain", std::string(PIPETRAIN_BINARY_DIR) + "/pipetrain");
    for (const auto& [from, to] : kSmaller) replace_all(command, from, to);
    const testing::CliRun run = testing::run_command("cd " + dir + " && " + command);
    ASSERT_EQ(run.exit_code, 0) << page << ": " << command << "\n" << run.output;
    outputs += run.output;
  }
  // What the path promised: a model transformers loads, evaluated over counted targets.
  EXPECT_NE(outputs.find("counted targets)"), std::string::npos) << outputs;
  EXPECT_TRUE(fs::exists(dir + "/tuned/config.json")) << outputs;
  EXPECT_TRUE(fs::exists(dir + "/run/latest")) << outputs;  // a sharded checkpoint
  const testing::CliRun loads =
      testing::hf_reference("compare " + dir + "/tuned " + dir + "/tuned --rtol 0");
  EXPECT_EQ(loads.exit_code, 0) << loads.output;
}

TEST(UserPath, DataPagesStartToFinishCommandsRun) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  run_user_path(std::string(PIPETRAIN_SOURCE_DIR) + "/docs/DATA.md", "data");
}

TEST(UserPath, TheReadmesCommandsRun) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  run_user_path(std::string(PIPETRAIN_SOURCE_DIR) + "/README.md", "readme");
}

}  // namespace
}  // namespace pipetrain::user_path_test
