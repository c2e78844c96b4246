// scripts/prepare-data: a JSONL file tokenized into a Megatron indexed dataset that `pipetrain
// train --data indexed` reads. A word-level tokenizer ("wN" -> id N + 2) makes every expected id
// known here: text records end with the model directory's EOS, prompt/completion records write
// a loss mask of 0 over the prompt and 1 over the completion and its EOS, a bad record is an
// error naming its line, and the result trains.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../helpers/cli_run.h"
#include "../helpers/hf_models.h"
#include "../helpers/python.h"
#include "../helpers/word_tokenizer.h"
#include "pipetrain/io/indexed_dataset.h"

namespace pipetrain::prepare_data_test {
namespace {

const std::string kPrepare = std::string(PIPETRAIN_SOURCE_DIR) + "/scripts/prepare-data";

std::string scratch(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::path(PIPETRAIN_BINARY_DIR) / "test-scratch" / "prepare_data";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A model directory holding a word-level tokenizer of "<bos>", "<eos>", "w0".."w59" and a
// config.json whose eos_token_id is 1.
std::string word_model() {
  const std::string dir = scratch("model");
  std::filesystem::create_directories(dir);
  EXPECT_TRUE(testing::write_word_tokenizer(dir)) << dir;
  write_text(dir + "/config.json", R"({"eos_token_id": 1})");
  return dir;
}

testing::CliRun prepare(const std::string& flags) {
  return testing::run_command(kPrepare + " " + flags);
}

TEST(PrepareData, TextRecordsBecomeDocumentsEndingWithEosThatTrain) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string model = word_model();
  // 300 records of 1 to 20 words, a blank line among them (skipped).
  std::string jsonl;
  std::vector<std::vector<int64_t>> expected;
  for (int r = 0; r < 300; ++r) {
    std::string text;
    std::vector<int64_t> ids;
    for (int w = 0; w <= r % 20; ++w) {
      const int word = (r * 7 + w * 13) % 60;
      text += (w ? " w" : "w") + std::to_string(word);
      ids.push_back(word + 2);
    }
    ids.push_back(1);  // EOS, from config.json
    expected.push_back(ids);
    jsonl += "{\"text\": \"" + text + "\", \"id\": " + std::to_string(r) + "}\n";
    if (r == 150) jsonl += "\n";
  }
  write_text(scratch("text.jsonl"), jsonl);
  const testing::CliRun run = prepare("--input " + scratch("text.jsonl") + " --tokenizer " + model +
                                      " --output-prefix " + scratch("text") + " --workers 2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("300 documents"), std::string::npos) << run.output;
  const io::IndexedDataset data(scratch("text"));
  EXPECT_EQ(data.dtype(), io::IndexedDtype::kUint16);
  ASSERT_EQ(data.documents(), 300);
  for (int64_t d = 0; d < 300; ++d) {
    std::vector<int64_t> ids;
    data.append_document(d, ids);
    ASSERT_EQ(ids, expected[static_cast<size_t>(d)]) << "document " << d;
  }
  EXPECT_FALSE(std::filesystem::exists(scratch("text.bin.tmp")));
  // The fixture Llama's vocabulary (64) holds these ids: it trains on them.
  const testing::CliRun train = testing::run_pipetrain(
      "train --model " + testing::hf_fixtures() + "/llama --data indexed --data-path " +
      scratch("text") + " --seq-len 16 --batch-size 4 --steps 2 --stages 2");
  EXPECT_EQ(train.exit_code, 0) << train.output;
  EXPECT_NE(train.output.find("300 documents"), std::string::npos) << train.output;
}

TEST(PrepareData, PromptCompletionRecordsWriteALossMaskOverTheCompletion) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string model = word_model();
  write_text(scratch("pairs.jsonl"),
             "{\"prompt\": \"w1 w2\", \"completion\": \"w7 w8 w9\"}\n"
             "{\"prompt\": \"w3\", \"completion\": \"w5\"}\n");
  const testing::CliRun run =
      prepare("--input " + scratch("pairs.jsonl") + " --tokenizer " + model + " --output-prefix " +
              scratch("pairs") + " --fields prompt,completion --workers 1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const io::IndexedDataset data(scratch("pairs"));
  std::vector<int64_t> ids;
  data.append_document(0, ids);
  data.append_document(1, ids);
  EXPECT_EQ(ids, (std::vector<int64_t>{3, 4, 9, 10, 11, 1, 5, 7, 1}));
  // The mask: uint8 (code 1), one value per id, in the same layout.
  const std::string mask = read_bytes(scratch("pairs_loss_mask.bin"));
  EXPECT_EQ(mask, std::string("\0\0\1\1\1\1\0\1\1", 9));
  const std::string index = read_bytes(scratch("pairs_loss_mask.idx"));
  ASSERT_GT(index.size(), 17u);
  EXPECT_EQ(static_cast<int>(index[17]), 1);
}

TEST(PrepareData, ABadRecordIsAnErrorNamingItsLine) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string model = word_model();
  write_text(scratch("bad.jsonl"), "{\"text\": \"w1\"}\n{\"txt\": \"w2\"}\n");
  testing::CliRun run = prepare("--input " + scratch("bad.jsonl") + " --tokenizer " + model +
                                " --output-prefix " + scratch("bad") + " --workers 1");
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("line 2: no string field 'text'"), std::string::npos) << run.output;
  EXPECT_FALSE(std::filesystem::exists(scratch("bad.idx")));
  EXPECT_FALSE(std::filesystem::exists(scratch("bad.bin.tmp")));
  write_text(scratch("broken.jsonl"), "{\"text\": \"w1\"\n");
  run = prepare("--input " + scratch("broken.jsonl") + " --tokenizer " + model +
                " --output-prefix " + scratch("broken") + " --workers 1");
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("line 1: not JSON"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace pipetrain::prepare_data_test
