// `pipetrain train --data indexed --data-path PREFIX`: a Megatron indexed dataset of documents
// (io/indexed_dataset.h) packed into rows (train/document_batches.h). The fixture's token stream
// cut into documents of uneven lengths trains the same in one process and across processes, a blend
// too, and bad data exits 2 naming the file and what is wrong. `eval` reads every row once.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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
  // The progress lines' losses in order, then the done line's (which a process may print before
  // another's last progress line, so it is looked for apart).
  std::vector<std::string> lines;
  std::string done;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find(" loss ");
    if (at == std::string::npos) continue;
    const std::string loss = line.substr(at, line.find(' ', at + 6) - at);
    if (line.find("done: ") != std::string::npos) {
      if (done.empty()) done = line.substr(line.find("loss ", line.find("done: ")));
    } else {
      lines.push_back(loss);
    }
  }
  if (!done.empty()) lines.push_back(done);
  return lines;
}

// Documents in order train the same whatever runs them: one process, two stages, two processes
// (transformers' side: train_documents_test.cpp). The progress and done lines count tokens and
// counted targets; eval over the dataset reads every row once.
TEST(TrainIndexedData, DocumentsTrainTheSameInOneProcessAndAcrossProcesses) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string prefix = documents_of_the_token_file();
  const std::string fixtures = testing::hf_fixtures();
  const std::string common = "train --model " + fixtures +
                             "/llama --seq-len 16 --batch-size 8 --steps 4 --log-every 1 "
                             "--optimizer adamw --lr 0.01 --shuffle --seed 3 --data indexed "
                             "--data-path " +
                             prefix;
  std::vector<std::vector<std::string>> runs;
  const std::string summary = scratch("summary.json");
  std::filesystem::remove(summary);
  for (const std::string& layout : {"--stages 1 --summary-json " + summary,
                                    std::string("--stages 2 --schedule zb-h1 --chunks 4"),
                                    std::string("--nproc 2 --schedule 1f1b")}) {
    const testing::CliRun run = testing::run_pipetrain(common + " " + layout);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find(" documents, "), std::string::npos) << run.output;
    EXPECT_NE(run.output.find(" tokens/s "), std::string::npos) << run.output;
    EXPECT_NE(run.output.find(" targets/s "), std::string::npos) << run.output;
    runs.push_back(losses(run.output));
  }
  ASSERT_GE(runs[0].size(), 5u);
  // The summary: the done line's figures, and MFU over the CPU's measured peak.
  std::ifstream in(summary);
  ASSERT_TRUE(in.good()) << summary;
  const nlohmann::json json = nlohmann::json::parse(in);
  EXPECT_EQ(json["steps"], 4);
  EXPECT_EQ(json["samples"], 32);
  EXPECT_GT(json["tokens"].get<int64_t>(), json["counted_targets"].get<int64_t>());
  EXPECT_GT(json["counted_targets"].get<int64_t>(), 0);
  EXPECT_GT(json["mfu"].get<double>(), 0);
  EXPECT_LT(json["mfu"].get<double>(), 1);
  EXPECT_NE(json["peak_source"].get<std::string>().find("measured: fp32"), std::string::npos);
  for (size_t r = 1; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].size(), runs[0].size());
    for (size_t i = 0; i < runs[0].size(); ++i) {
      const double x = std::stod(runs[0][i].substr(runs[0][i].find("loss ") + 5));
      const double y = std::stod(runs[r][i].substr(runs[r][i].find("loss ") + 5));
      EXPECT_NEAR(x, y, 1e-5) << runs[0][i] << " vs " << runs[r][i];
    }
  }
  const testing::CliRun eval = testing::run_pipetrain(
      "eval --model " + fixtures + "/llama --seq-len 16 --data indexed --data-path " + prefix);
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_NE(eval.output.find("counted targets)"), std::string::npos) << eval.output;
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

// A resumed run reads on where the saved one stood (the loader's position is the step): --pack none
// with --shuffle over more than an epoch, resumed at the same layout, ends bit for bit with the
// weights of the uninterrupted run, and at another layout within rounding.
TEST(TrainIndexedData, AResumedRunOfDocumentsEndsWithTheUninterruptedRunsWeights) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string dir = testing::scratch_dir("train_indexed/resume");
  const std::string prefix = documents_of_the_token_file();
  auto run = [&](int steps, const std::string& layout, const std::string& extra) {
    return testing::run_pipetrain("train --model " + testing::hf_fixtures() +
                                  "/llama --seq-len 32 --batch-size 16 --optimizer adamw "
                                  "--adam-eps 1e-6 --lr 0.01 --shuffle --seed 5 "
                                  "--data indexed --pack none --group-by-length --data-path " +
                                  prefix + " --steps " + std::to_string(steps) + " " + layout +
                                  " " + extra);
  };
  // 198 documents of 1 to 40 ids, 193 of which hold a target: 13 steps an epoch of 16 rows.
  const testing::CliRun whole = run(16, "--stages 2 --chunks 4", "--save-hf " + dir + "/whole");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const testing::CliRun first =
      run(9, "--stages 2 --chunks 4", "--checkpoint-format file --checkpoint-dir " + dir + "/ck");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const testing::CliRun second =
      run(16, "--nproc 2 --chunks 4 --schedule 1f1b",
          "--resume " + dir + "/ck/checkpoint.pt --save-hf " + dir + "/resumed");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  // Another layout sums in another order: within AdamW's amplification of that (1e-4).
  const testing::CliRun compare =
      testing::hf_reference("compare " + dir + "/resumed " + dir + "/whole --rtol 1e-4");
  EXPECT_EQ(compare.exit_code, 0) << compare.output;
  // The same layout: bit for bit.
  const testing::CliRun same =
      run(16, "--stages 2 --chunks 4",
          "--resume " + dir + "/ck/checkpoint.pt --save-hf " + dir + "/same");
  ASSERT_EQ(same.exit_code, 0) << same.output;
  std::string why;
  EXPECT_TRUE(testing::same_checkpoints(dir + "/whole", dir + "/same", why)) << why;
}

TEST(TrainIndexedData, BadDataIsAnErrorNamingTheFileAndWhatIsWrong) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string model =
      "train --model " + testing::hf_fixtures() +
      "/llama --seq-len 16 --batch-size 8 --steps 1 --stages 2 --data indexed";
  auto expect_refused = [&](const std::string& flags, const std::string& message) {
    const testing::CliRun run = testing::run_pipetrain(model + " " + flags);
    EXPECT_EQ(run.exit_code, 2) << flags << "\n" << run.output;
    EXPECT_NE(run.output.find(message), std::string::npos) << flags << "\n" << run.output;
  };
  expect_refused("", "--data indexed needs --data-path PREFIX");
  expect_refused("--data-path " + scratch("absent"), "absent.idx");
  const std::string empty = scratch("empty");
  io::write_indexed_dataset(empty, {});
  expect_refused("--data-path " + empty, "holds no document");
  const std::string big = scratch("big_ids");  // the fixture's vocabulary is 64
  io::write_indexed_dataset(big, {{1, 2, 3}, {4, 64, 5}});
  expect_refused("--data-path " + big,
                 "document 1 has id 64 at offset 1, outside the model's vocabulary of 64");
  const std::string documents = documents_of_the_token_file();
  const std::string short_mask = scratch("short_mask");
  io::write_indexed_dataset(short_mask, {{1, 1}}, io::IndexedDtype::kUint8);
  expect_refused("--data-path " + documents + " --loss-mask-path " + short_mask,
                 "holds 1 documents but its dataset");
  const std::string prompts = scratch("prompts");  // nothing learned
  io::write_indexed_dataset(prompts, {{1, 2, 3, 4}, {5, 6, 7}});
  const std::string unlearned = scratch("prompts_mask");
  io::write_indexed_dataset(unlearned, {{0, 0, 0, 0}, {0, 0, 0}}, io::IndexedDtype::kUint8);
  expect_refused("--data-path " + prompts + " --loss-mask-path " + unlearned + " --pack none",
                 "step 0: its mini-batch of 8 rows has no counted target");
  expect_refused("--data-path -0.5 " + documents + " 1 " + prompts, "is not such a weight");
  expect_refused("--data-path " + documents + " --group-by-length", "needs --pack none");
  expect_refused("--data-path " + documents + " --pack tight", "--pack tight is not a packing");
}

// Regression: a token dataset (uint16 ids) given as --loss-mask-path trained without a word,
// learning every token whose id is not 0. It is bad input (exit 2) naming the file, its dtype
// and its first value other than 0 or 1 with where it is.
TEST(TrainIndexedData, ATokenDatasetGivenAsTheLossMaskExitsTwoNamingItsFirstValue) {
  PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
  const std::string documents = documents_of_the_token_file();
  const auto first = io::IndexedDataset(documents).first_outside(0, 1);
  ASSERT_TRUE(first.has_value()) << "the token file holds only ids 0 and 1";
  const testing::CliRun run = testing::run_pipetrain(
      "train --model " + testing::hf_fixtures() +
      "/llama --seq-len 16 --batch-size 8 --steps 1 --stages 2 --data indexed --data-path " +
      documents + " --loss-mask-path " + documents);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--data-path/--loss-mask-path: loss mask '" + documents + "' (" +
                            documents + ".idx) holds uint16 values, but a loss mask is uint8"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("its first value other than 0 or 1 is " + std::to_string(first->value) +
                            " at position " + std::to_string(first->offset) + " of document " +
                            std::to_string(first->document)),
            std::string::npos)
      << run.output;
}

}  // namespace
}  // namespace pipetrain::train_indexed_data_test
