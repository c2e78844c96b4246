// `pipetrain train --data indexed --data-path PREFIX`: a Megatron indexed dataset of documents
// (io/indexed_dataset.h) read as its documents' ids in order, cut into samples as a token file
// is. The fixture's token stream cut into documents of uneven lengths trains exactly as the token
// file itself, in one process and across processes; a dataset it cannot read that way is an error
// naming it. `eval` reads it the same way.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../helpers/cli_run.h"
#include "../helpers/hf_models.h"
#include "pipetrain/io/indexed_dataset.h"
#include "pipetrain/io/token_file.h"

namespace pipetrain::train_indexed_data_test {
namespace {

std::string scratch(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::path(PIPETRAIN_BINARY_DIR) / "test-scratch" / "train_indexed";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

// The fixture's token file cut into documents of 1, 2, ... 40 ids, then again, as an indexed
// dataset of uint16 ids.
std::string documents_of_the_token_file() {
  const io::TokenFile tokens(testing::hf_fixtures() + "/tokens.bin", 2);
  std::vector<std::vector<int64_t>> documents;
  int64_t at = 0;
  for (int64_t length = 1; at < tokens.tokens(); length = length % 40 + 1) {
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < length && at < tokens.tokens(); ++i) ids.push_back(tokens.at(at++));
    documents.push_back(ids);
  }
  const std::string prefix = scratch("documents");
  io::write_indexed_dataset(prefix, documents, io::IndexedDtype::kUint16);
  return prefix;
}

// What a run prints that must match: its step lines and its last line's losses.
std::vector<std::string> losses(const std::string& output) {
  std::vector<std::string> lines;
  size_t at = 0;
  while ((at = output.find(" loss ", at)) != std::string::npos) {
    const size_t end = output.find_first_of(" \n", at + 6);
    lines.push_back(output.substr(at, end - at));
    at = end;
  }
  const size_t done = output.find("done: ");
  if (done != std::string::npos) {
    const size_t loss = output.find("loss ", done);
    lines.push_back(output.substr(loss, output.find('\n', loss) - loss));
  }
  return lines;
}

TEST(TrainIndexedData, DocumentsInOrderTrainExactlyAsTheirTokenFile) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string prefix = documents_of_the_token_file();
  const std::string fixtures = testing::hf_fixtures();
  for (const std::string layout : {"--stages 2 --schedule zb-h1", "--nproc 2 --schedule 1f1b"}) {
    const std::string common = "train --model " + fixtures +
                               "/llama --seq-len 16 --batch-size 8 --steps 4 --log-every 1 "
                               "--optimizer adamw --lr 0.01 --shuffle --seed 3 " +
                               layout;
    const testing::CliRun tokens =
        testing::run_pipetrain(common + " --data tokens --token-file " + fixtures + "/tokens.bin");
    ASSERT_EQ(tokens.exit_code, 0) << tokens.output;
    const testing::CliRun indexed =
        testing::run_pipetrain(common + " --data indexed --data-path " + prefix);
    ASSERT_EQ(indexed.exit_code, 0) << indexed.output;
    EXPECT_NE(indexed.output.find(" documents, "), std::string::npos) << indexed.output;
    EXPECT_NE(indexed.output.find(" tokens/s "), std::string::npos) << indexed.output;
    const std::vector<std::string> expected = losses(tokens.output);
    ASSERT_GE(expected.size(), 5u) << tokens.output;
    EXPECT_EQ(losses(indexed.output), expected) << layout << "\n" << indexed.output;
  }
  // eval reads it the same way: the same loss over the same samples.
  const std::string eval = "eval --model " + fixtures + "/llama --seq-len 16 ";
  const testing::CliRun tokens =
      testing::run_pipetrain(eval + "--data tokens --token-file " + fixtures + "/tokens.bin");
  const testing::CliRun indexed =
      testing::run_pipetrain(eval + "--data indexed --data-path " + prefix);
  ASSERT_EQ(indexed.exit_code, 0) << indexed.output;
  const size_t at = tokens.output.find("eval loss");
  ASSERT_NE(at, std::string::npos) << tokens.output;
  EXPECT_NE(indexed.output.find(tokens.output.substr(at)), std::string::npos)
      << tokens.output << "\n"
      << indexed.output;
}

// A blend (--data-path W1 A W2 B) draws the same batches in one process and across processes:
// the same losses at --stages 2 and --nproc 2; eval, which reads one dataset, refuses it.
TEST(TrainIndexedData, ABlendTrainsTheSameInOneProcessAndAcrossProcesses) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string documents = documents_of_the_token_file();
  const io::TokenFile tokens(testing::hf_fixtures() + "/tokens.bin", 2);
  std::vector<int64_t> reversed;
  for (int64_t i = tokens.tokens() - 1; i >= 0; --i) reversed.push_back(tokens.at(i));
  const std::string other = scratch("reversed");
  io::write_indexed_dataset(other, {reversed});
  const std::string blend = " --data indexed --data-path 0.7 " + documents + " 0.3 " + other;
  const std::string common = "train --model " + testing::hf_fixtures() +
                             "/llama --seq-len 16 --batch-size 8 --steps 4 --log-every 1 "
                             "--optimizer adamw --lr 0.01 --shuffle --seed 3" +
                             blend;
  const testing::CliRun one = testing::run_pipetrain(common + " --stages 2");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("in a blend of 2"), std::string::npos) << one.output;
  const testing::CliRun two = testing::run_pipetrain(common + " --nproc 2");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  // (Two processes sum the loss in another order: the same to 1e-6, not always to the last digit
  // printed.)
  const std::vector<std::string> a = losses(one.output), b = losses(two.output);
  ASSERT_GE(a.size(), 5u) << one.output;
  ASSERT_EQ(b.size(), a.size()) << two.output;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = std::stod(a[i].substr(a[i].find("loss ") + 5));
    const double y = std::stod(b[i].substr(b[i].find("loss ") + 5));
    EXPECT_NEAR(x, y, 1e-5) << a[i] << " vs " << b[i];
  }
  // Not the unblended run's batches.
  const testing::CliRun alone = testing::run_pipetrain(
      "train --model " + testing::hf_fixtures() +
      "/llama --seq-len 16 --batch-size 8 --steps 4 --log-every 1 --optimizer adamw --lr 0.01 "
      "--shuffle --seed 3 --stages 2 --data indexed --data-path " +
      documents);
  EXPECT_NE(losses(alone.output), losses(one.output)) << alone.output;
  const testing::CliRun eval = testing::run_pipetrain("eval --model " + testing::hf_fixtures() +
                                                      "/llama --seq-len 16" + blend);
  EXPECT_EQ(eval.exit_code, 2) << eval.output;
  EXPECT_NE(eval.output.find("eval reads one dataset"), std::string::npos) << eval.output;
}

TEST(TrainIndexedData, ADatasetItCannotReadIsAnErrorNamingIt) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string model =
      "train --model " + testing::hf_fixtures() +
      "/llama --seq-len 16 --batch-size 8 --steps 1 --stages 2 --data indexed";
  testing::CliRun run = testing::run_pipetrain(model);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--data indexed needs --data-path PREFIX"), std::string::npos)
      << run.output;
  run = testing::run_pipetrain(model + " --data-path " + scratch("absent"));
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("absent.idx"), std::string::npos) << run.output;
  // Two documents whose sequences the index places in the other order in the .bin.
  const std::string swapped = scratch("swapped");
  io::write_indexed_dataset(swapped, {{1, 2, 3}, {4, 5, 6}});
  std::string index;
  {
    std::ifstream in(swapped + ".idx", std::ios::binary);
    index.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t pointers = 34 + 2 * 4;
  std::string first = index.substr(pointers, 8), second = index.substr(pointers + 8, 8);
  index.replace(pointers, 8, second);
  index.replace(pointers + 8, 8, first);
  std::ofstream(swapped + ".idx", std::ios::binary).write(index.data(), index.size());
  run = testing::run_pipetrain(model + " --data-path " + swapped);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("do not lie back to back"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace pipetrain::train_indexed_data_test
