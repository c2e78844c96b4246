// Hugging Face output from a sharded checkpoint (models/llama_export.h): the same bytes as
// save_llama_hf of the gathered parameters, in one part or several, and a checkpoint of another
// model refused naming the tensor.
#include "pipetrain/models/llama_export.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/hf_models.h"
#include "pipetrain/io/safetensors.h"

namespace pipetrain::models {
namespace {
namespace fs = std::filesystem;

std::string bytes_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

LlamaConfig config_of(bool tied) {
  LlamaConfig c = llama_config(96, 32, 64, /*layers=*/2, /*heads=*/4, /*kv_heads=*/2);
  c.tie_word_embeddings = tied;
  return c;
}

std::map<std::string, torch::Tensor> random_parameters(const LlamaConfig& config) {
  torch::manual_seed(5);
  std::map<std::string, torch::Tensor> out;
  LlamaModel model = make_llama(config);
  for (const auto& item : model.sequential->named_parameters()) {
    out[item.key()] = torch::randn(item.value().sizes());
  }
  return out;
}

// The parameters as two data-parallel replicas write them into DIR/step-1 (each half of every
// tensor), committed; `skip`: a parameter left out (a checkpoint of another model).
std::string write_checkpoint(const std::map<std::string, torch::Tensor>& parameters,
                             const std::string& dir, const std::string& skip = "") {
  const std::string partial = train::sharded_step_directory(dir, 1) + ".tmp";
  fs::create_directories(partial);
  std::vector<std::pair<std::string, std::map<std::string, io::ShardTensor>>> files;
  for (int replica = 0; replica < 2; ++replica) {
    train::Checkpoint part;
    for (const auto& [name, tensor] : parameters) {
      if (name != skip) part.parameters[name] = tensor;
    }
    const auto pieces = train::rank_pieces(part, {}, {{}, replica, 2}, replica == 0);
    const std::string name = "rank-0000" + std::to_string(replica) + ".safetensors";
    files.emplace_back(name, train::write_shard_file(partial + "/" + name, pieces).tensors);
  }
  train::commit_sharded_checkpoint(
      dir, 1, partial, train::make_shard_index(files, {{"step", 1}}, nlohmann::json::object()), 0);
  return train::sharded_step_directory(dir, 1);
}

TEST(LlamaExport, FromAShardedCheckpointWritesTheBytesOfTheGatheredSave) {
  for (bool tied : {false, true}) {
    for (const char* dtype : {"float32", "bfloat16"}) {
      const std::string dir =
          testing::scratch_dir(std::string("llama_export_bytes_") + dtype + (tied ? "_tied" : ""));
      const LlamaConfig config = config_of(tied);
      const auto parameters = random_parameters(config);
      const train::ShardedCheckpoint checkpoint =
          train::ShardedCheckpoint::open(write_checkpoint(parameters, dir + "/ck"));
      // Small shards: the sharded layout with its index, as a large model gets.
      const HfSaveOptions options = HfSaveOptions().dtype(dtype).max_shard_bytes(20000);
      const auto gathered = save_llama_hf(dir + "/gathered", config, parameters, options);
      const auto exported = export_llama_hf(checkpoint, dir + "/exported", config, options);
      ASSERT_EQ(exported, gathered) << dtype << (tied ? " tied" : "");
      ASSERT_GT(exported.size(), 3u) << "shards, the index and config.json";
      for (const std::string& file : gathered) {
        EXPECT_EQ(bytes_of(dir + "/exported/" + file), bytes_of(dir + "/gathered/" + file))
            << file << " " << dtype << (tied ? " tied" : "");
      }
    }
  }
}

TEST(LlamaExport, SeveralPartsTogetherWriteEveryTensorOnce) {
  const std::string dir = testing::scratch_dir("llama_export_parts");
  const LlamaConfig config = config_of(false);
  const auto parameters = random_parameters(config);
  const train::ShardedCheckpoint checkpoint =
      train::ShardedCheckpoint::open(write_checkpoint(parameters, dir + "/ck"));
  const auto tensors = llama_hf_export_tensors(config);
  train::SafetensorsExportOptions options = llama_hf_export_options(config, {});
  std::set<std::string> written;
  for (int part = 0; part < 3; ++part) {
    options.part(part).parts(3);
    for (const std::string& file :
         train::export_safetensors_part(checkpoint, dir + "/out", tensors, options)) {
      EXPECT_TRUE(written.insert(file).second) << file << " written by two parts";
    }
  }
  train::finish_safetensors_export(dir + "/out", tensors, options);
  const auto files = train::safetensors_export_files(tensors, options);
  EXPECT_GE(files.size(), 4u) << "at least one shard per part, and the index";
  EXPECT_EQ(written.size() + 1, files.size());
  const io::SafetensorsCheckpoint out = io::SafetensorsCheckpoint::open(dir + "/out");
  EXPECT_EQ(out.names().size(), tensors.size());
  for (const train::ExportedTensor& t : tensors) {
    const torch::Tensor want = parameters.at(t.source.substr(6));
    EXPECT_TRUE(torch::equal(out.load(t.name, torch::kFloat32), want)) << t.name;
  }
}

TEST(LlamaExport, RefusesACheckpointOfAnotherModelNamingTheTensor) {
  const std::string dir = testing::scratch_dir("llama_export_refused");
  const LlamaConfig config = config_of(false);
  const auto parameters = random_parameters(config);
  const std::string missing = parameters.begin()->first;
  const train::ShardedCheckpoint lacking =
      train::ShardedCheckpoint::open(write_checkpoint(parameters, dir + "/a", missing));
  try {
    export_llama_hf(lacking, dir + "/out", config);
    FAIL() << "a checkpoint without param/" << missing << " was exported";
  } catch (const io::ShardIndexError& error) {
    EXPECT_EQ(error.tensor(), "param/" + missing);
    EXPECT_NE(std::string(error.what()).find("missing"), std::string::npos) << error.what();
  }
  // A wider model's checkpoint, read as this config.
  LlamaConfig wider = config_of(false);
  wider.hidden_size = 64;
  const train::ShardedCheckpoint other =
      train::ShardedCheckpoint::open(write_checkpoint(random_parameters(wider), dir + "/b"));
  EXPECT_THROW(export_llama_hf(other, dir + "/out", config), io::ShardIndexError);
  EXPECT_FALSE(fs::exists(dir + "/out/config.json")) << "nothing claims to be a model";
}

}  // namespace
}  // namespace pipetrain::models
