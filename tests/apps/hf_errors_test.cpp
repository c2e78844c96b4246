// Bad Hugging Face inputs to `pipetrain train`: each exits 2 before training, naming the file and
// the tensor (or the config key and value, or the token's offset), as docs/ERRORS.md lists them.
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/cli_run.h"
#include "../helpers/hf_models.h"
#include "pipetrain/io/safetensors.h"

namespace pipetrain::hf_errors_test {
namespace {

using testing::CliRun;
using testing::hf_fixtures;
using testing::run_pipetrain;
namespace fs = std::filesystem;

class HfErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS();
    dir_ = testing::scratch_dir(std::string("hf-errors/") +
                                ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::copy(hf_fixtures() + "/llama", model(), fs::copy_options::recursive);
  }

  std::string model() const { return dir_ + "/model"; }
  std::string weights() const { return model() + "/model.safetensors"; }

  // `pipetrain train` on the copied model: must exit 2 and say every one of `needles`.
  void expect_refused(const std::vector<std::string>& needles, const std::string& extra = "",
                      const std::string& tokens = "") {
    const CliRun run = run_pipetrain("train --model " + model() + " --data tokens --token-file " +
                                     (tokens.empty() ? hf_fixtures() + "/tokens.bin" : tokens) +
                                     " --seq-len 16 --batch-size 4 --steps 1 --stages 2 " + extra);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    for (const std::string& needle : needles) {
      EXPECT_NE(run.output.find(needle), std::string::npos) << "no '" << needle << "' in\n"
                                                            << run.output;
    }
    EXPECT_EQ(run.output.find("step 1/1"), std::string::npos) << "it trained:\n" << run.output;
  }

  // The copied weights rewritten with `edit` applied to the tensors.
  template <typename Edit>
  void rewrite_weights(Edit edit) {
    const auto checkpoint = io::SafetensorsCheckpoint::open(model());
    io::NamedTensorList tensors;
    for (const std::string& name : checkpoint.names()) {
      tensors.emplace_back(name, checkpoint.load(name, torch::kFloat32));
    }
    edit(tensors);
    io::write_safetensors_checkpoint(model(), tensors);
  }

  std::string dir_;
};

TEST_F(HfErrors, ATruncatedFileNamesTheFileAndTheTensorCut) {
  fs::resize_file(weights(), fs::file_size(weights()) - 100);
  expect_refused({weights(), "tensor 'model.norm.weight'", "point past the end of the data"});
}

TEST_F(HfErrors, AHeaderLengthPastTheEndNamesTheFile) {
  std::fstream file(weights(), std::ios::in | std::ios::out | std::ios::binary);
  const char length[8] = {0, 0, 16, 0, 0, 0, 0, 0};  // 2^20 bytes of header, in a smaller file
  file.write(length, 8);
  file.close();
  expect_refused({weights(), "header length 1048576 points past the end of the file"});
}

TEST_F(HfErrors, AnUnknownDtypeNamesTheFileTheTensorAndTheDtype) {
  std::ifstream in(weights(), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const auto at = bytes.find("\"F32\"");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 5, "\"Q32\"");  // the same length: the header still fits
  std::ofstream(weights(), std::ios::binary) << bytes;
  expect_refused({weights(), "unknown dtype 'Q32'", "tensor '"});
}

TEST_F(HfErrors, AMissingTensorIsNamed) {
  rewrite_weights([](io::NamedTensorList& tensors) {
    tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                                 [](const auto& t) {
                                   return t.first == "model.layers.1.mlp.down_proj.weight";
                                 }),
                  tensors.end());
  });
  expect_refused({"tensor 'model.layers.1.mlp.down_proj.weight'", "missing"});
}

TEST_F(HfErrors, AnExtraTensorIsNamedWithItsFile) {
  rewrite_weights([](io::NamedTensorList& tensors) {
    tensors.emplace_back("model.layers.5.self_attn.q_proj.weight", torch::zeros({32, 32}));
  });
  expect_refused({weights(), "tensor 'model.layers.5.self_attn.q_proj.weight'", "extra"});
}

TEST_F(HfErrors, AMisShapedTensorNamesBothShapes) {
  rewrite_weights([](io::NamedTensorList& tensors) {
    for (auto& [name, tensor] : tensors) {
      if (name == "model.layers.0.self_attn.k_proj.weight") tensor = torch::zeros({8, 32});
    }
  });
  expect_refused(
      {weights(), "tensor 'model.layers.0.self_attn.k_proj.weight'", "[8, 32]", "[16, 32]"});
}

TEST_F(HfErrors, ATokenIdOutsideTheVocabularyNamesItsOffset) {
  const std::string tokens = dir_ + "/tokens.bin";
  std::vector<uint16_t> ids(200, 1);
  ids[37] = 64;  // the vocabulary is 0..63
  std::ofstream(tokens, std::ios::binary)
      .write(reinterpret_cast<const char*>(ids.data()),
             static_cast<std::streamsize>(ids.size() * 2));
  expect_refused({"--token-file", tokens, "id 64 at offset 37 (byte 74)", "vocabulary size 64"}, "",
                 tokens);
}

// config.json with `key` set to `value` (JSON text).
void set_config_key(const std::string& model, const std::string& key, const std::string& value) {
  const std::string path = model + "/config.json";
  nlohmann::json config = nlohmann::json::parse(std::ifstream(path));
  config[key] = nlohmann::json::parse(value);
  std::ofstream(path) << config.dump(2);
}

TEST_F(HfErrors, AnUnsupportedConfigValueNamesTheKeyAndValue) {
  set_config_key(model(), "hidden_act", "\"gelu\"");
  expect_refused({model() + "/config.json", "key \"hidden_act\" = \"gelu\"", "silu"});
}

TEST_F(HfErrors, AnUnknownConfigKeyIsRefused) {
  set_config_key(model(), "attention_chunk_size", "128");
  expect_refused({"key \"attention_chunk_size\" = 128", "not a key pipetrain's Llama port reads"});
}

TEST_F(HfErrors, AnUnsupportedRopeTypeNamesIt) {
  set_config_key(model(), "rope_parameters",
                 R"({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0})");
  expect_refused({"key \"rope_parameters\"", "rope_type 'yarn' is not supported"});
}

TEST_F(HfErrors, ASlidingWindowShorterThanTheSequenceNamesBoth) {
  fs::remove_all(model());
  fs::copy(hf_fixtures() + "/mistral", model(), fs::copy_options::recursive);
  set_config_key(model(), "sliding_window", "8");
  expect_refused({"--seq-len 16", "key \"sliding_window\" = 8", "use --seq-len 8 or less"});
}

TEST_F(HfErrors, AnUnwritableSaveHfDirectoryIsRefusedBeforeTraining) {
  expect_refused({"--save-hf: cannot write '/proc/nope/out'"}, "--save-hf /proc/nope/out");
}

TEST_F(HfErrors, SaveHfOfAModelThatIsNotAHuggingFaceOneIsRefused) {
  const CliRun run =
      run_pipetrain("train --model mlp --data synthetic --steps 1 --save-hf " + dir_ + "/out");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--save-hf writes a Hugging Face --model DIR"), std::string::npos)
      << run.output;
}

}  // namespace
}  // namespace pipetrain::hf_errors_test
