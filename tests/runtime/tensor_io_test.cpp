// Tests for tensor files shared with Python (include/pipetrain/runtime/tensor_io.h). The Python
// half runs the project's Python (tests/helpers/python.h) and is skipped only when it has no torch.
#include "pipetrain/runtime/tensor_io.h"

#include <dirent.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <typeinfo>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/python.h"

#include "pipetrain/base/error.h"

namespace pipetrain {
namespace {

using testing::kPython;
using testing::no_python_torch_message;
using testing::python_has_torch;

std::string temporary_directory() {
  std::string pattern = ::testing::TempDir() + "pipetrain_tensor_io_XXXXXX";
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

std::vector<std::string> directory_entries(const std::string& directory) {
  std::vector<std::string> names;
  DIR* dir = ::opendir(directory.c_str());
  if (dir == nullptr) return names;
  while (dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  return names;
}

// Runs a Python snippet; returns its stdout.
std::string python(const std::string& code, const std::string& directory) {
  const std::string script = directory + "/snippet.py";
  std::ofstream(script) << code;
  const std::string out = directory + "/snippet.out";
  const int status = std::system((kPython + " " + script + " >" + out + " 2>&1").c_str());
  std::stringstream text;
  text << std::ifstream(out).rdbuf();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << text.str();
  return text.str();
}

// Expects `action` to throw exactly an ErrorType (not a subclass) whose message has `piece`.
template <typename ErrorType>
void expect_error_mentions(const std::function<void()>& action, const std::string& piece) {
  try {
    action();
    ADD_FAILURE() << "expected an error mentioning '" << piece << "'";
  } catch (const ErrorType& error) {
    EXPECT_EQ(typeid(error), typeid(ErrorType)) << error.what();
    EXPECT_NE(std::string(error.what()).find(piece), std::string::npos) << error.what();
  }
}

TEST(LoadTensor, ReadsATensorThatPythonSaved) {
  if (!python_has_torch()) GTEST_SKIP() << no_python_torch_message();
  const std::string directory = temporary_directory();
  python("import torch\ntorch.save(torch.arange(6, dtype=torch.float64).view(2, 3) * 1.5, '" +
             directory + "/t.pt')\n",
         directory);
  torch::Tensor tensor = load_tensor(directory + "/t.pt");
  EXPECT_EQ(tensor.scalar_type(), torch::kDouble);
  EXPECT_TRUE(torch::equal(tensor, torch::arange(6, torch::kDouble).view({2, 3}) * 1.5));
}

TEST(SaveNamedTensors, PythonLoadsADictWithTheNamesInOrderAndTheValues) {
  if (!python_has_torch()) GTEST_SKIP() << no_python_torch_message();
  const std::string directory = temporary_directory();
  torch::Tensor weight = torch::arange(4, torch::kFloat).view({2, 2}).requires_grad_();
  save_named_tensors(directory + "/params.pt",
                     {{"0.weight", weight}, {"2.attn.in_proj_bias", torch::full({3}, -0.5)}});
  const std::string printed =
      python("import torch\nd = torch.load('" + directory +
                 "/params.pt')\nprint(type(d).__name__, list(d.keys()))\n"
                 "print(d['0.weight'].tolist(), d['2.attn.in_proj_bias'].tolist(), "
                 "d['0.weight'].requires_grad)\n",
             directory);
  EXPECT_NE(printed.find("dict ['0.weight', '2.attn.in_proj_bias']"), std::string::npos) << printed;
  EXPECT_NE(printed.find("[[0.0, 1.0], [2.0, 3.0]] [-0.5, -0.5, -0.5] False"), std::string::npos)
      << printed;
}

TEST(SaveNamedTensors, RoundTripsThroughPickleLoad) {
  const std::string directory = temporary_directory();
  save_named_tensors(directory + "/p.pt", {{"a", torch::ones({2})}, {"b", torch::zeros({1, 3})}});
  std::ifstream file(directory + "/p.pt", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  auto dict = torch::pickle_load(bytes).toGenericDict();
  ASSERT_EQ(dict.size(), 2u);
  EXPECT_TRUE(torch::equal(dict.at("a").toTensor(), torch::ones({2})));
  EXPECT_TRUE(torch::equal(dict.at("b").toTensor(), torch::zeros({1, 3})));
}

TEST(SaveNamedTensors, ReplacesAnExistingFileAndLeavesNoTemporaryFile) {
  const std::string directory = temporary_directory();
  const std::string path = directory + "/p.pt";
  std::ofstream(path) << "old contents";
  save_named_tensors(path, {{"a", torch::ones({2})}});
  EXPECT_EQ(directory_entries(directory), std::vector<std::string>{"p.pt"});
  std::ifstream file(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(torch::pickle_load(bytes).isGenericDict());
}

TEST(SaveNamedTensors, NamesThePathWhenTheDirectoryIsMissing) {
  const std::string path = temporary_directory() + "/no/such/dir/p.pt";
  expect_error_mentions<FileError>(
      [&] {
        save_named_tensors(path, {{"a", torch::ones({1})}});
      },
      path);
}

TEST(SaveNamedTensors, RejectsADuplicateName) {
  const std::string path = temporary_directory() + "/p.pt";
  expect_error_mentions<BadInput>(
      [&] {
        save_named_tensors(path, {{"a", torch::ones({1})}, {"a", torch::ones({1})}});
      },
      "'a' appears twice");
}

TEST(LoadTensor, NamesTheMissingPath) {
  const std::string path = temporary_directory() + "/absent.pt";
  expect_error_mentions<FileError>([&] { load_tensor(path); }, path);
}

TEST(LoadTensor, NamesTheCorruptPath) {
  const std::string path = temporary_directory() + "/corrupt.pt";
  std::ofstream(path) << "definitely not a pickle";
  expect_error_mentions<BadInput>([&] { load_tensor(path); }, path);
}

TEST(LoadTensor, SaysWhatTheFileHoldsWhenItIsNotATensor) {
  const std::string path = temporary_directory() + "/dict.pt";
  save_named_tensors(path, {{"a", torch::ones({1})}});
  expect_error_mentions<BadInput>([&] { load_tensor(path); }, "not a tensor");
}

}  // namespace
}  // namespace pipetrain
