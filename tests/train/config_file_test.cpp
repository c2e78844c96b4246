#include "pipetrain/train/config_file.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace pipetrain::train {
namespace {

std::string write_temp(const std::string& content) {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("pipetrain-config-" + std::to_string(::getpid()) + ".json"))
                         .string();
  std::ofstream(path) << content;
  return path;
}

TEST(ConfigFile, ValuesBecomeFlagsAndCommandLineFlagsWin) {
  std::string path = write_temp(R"({"model": "cnn", "lr": 0.001, "epochs": 2})");
  std::vector<std::string> args =
      expand_config_arguments({"train", "--config", path, "--lr", "0.1"});
  std::remove(path.c_str());
  EXPECT_EQ(args, (std::vector<std::string>{"train", "--lr", "0.1", "--epochs=2", "--model=cnn"}));
}

TEST(ConfigFile, EqualsFormOfTheFlagAndOfOverridesAreRecognized) {
  std::string path = write_temp(R"({"lr": 1, "nproc": 2})");
  std::vector<std::string> args = expand_config_arguments({"train", "--config=" + path, "--lr=3"});
  std::remove(path.c_str());
  EXPECT_EQ(args, (std::vector<std::string>{"train", "--lr=3", "--nproc=2"}));
}

TEST(ConfigFile, BooleansArraysAndNulls) {
  nlohmann::json config = {
      {"tie-embeddings", false}, {"widths", {784, 10}}, {"trace", nullptr}, {"verbose", true}};
  EXPECT_EQ(config_to_arguments(config),
            (std::vector<std::string>{"--tie-embeddings=false", "--verbose=true", "--widths=784",
                                      "--widths=10"}));
}

TEST(ConfigFile, WithoutTheFlagArgumentsAreUnchanged) {
  std::vector<std::string> args{"train", "--lr", "1"};
  EXPECT_EQ(expand_config_arguments(args), args);
}

TEST(ConfigFile, MalformedJsonNamesTheFile) {
  std::string path = write_temp(R"({"lr": )");
  try {
    expand_config_arguments({"train", "--config", path});
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
  EXPECT_THROW(read_config_file("/nonexistent/config.json"), ConfigError);
  EXPECT_THROW(config_to_arguments({{"nested", {{"a", 1}}}}), ConfigError);
  EXPECT_THROW(expand_config_arguments({"train", "--config"}), ConfigError);
}

}  // namespace
}  // namespace pipetrain::train
