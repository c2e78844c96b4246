// Hugging Face models made by transformers (the reference of the Llama port), shared by the tests
// of tests/models and tests/apps: tests/models/hf_reference.py run once per build directory.
//
//   hf_fixtures()        the directory `hf_reference.py fixtures` filled: llama/ (llama3 RoPE,
//                        grouped-query, untied), qwen2/ (biases, tied, published-checkpoint RoPE
//                        keys, 3 shards), mistral/, tokens.bin (random ids), pattern.bin (ids
//                        that follow from the one before), prompt.safetensors and each
//                        model's logits for it (<arch>_logits.safetensors)
//   hf_reference(args)   runs hf_reference.py with `args`; returns its exit code and output
//   worst_relative_errors(output)  the figure of each of its "compare" lines, in order
//
// Several test processes (ctest -j) may ask at once: the first makes the fixtures under a file
// lock, in a temporary directory renamed into place; the others wait for the lock and reuse them.
// A test calls PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS() first: it skips, naming the interpreter, when
// the project's Python cannot import transformers.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "cli_run.h"
#include "pipetrain/io/safetensors.h"
#include "python.h"
#include "shared_fixture.h"

namespace pipetrain::testing {

inline const std::string kHfReference =
    std::string(PIPETRAIN_SOURCE_DIR) + "/tests/models/hf_reference.py";

// An empty directory of this build for one test: build/test-scratch/<name> (emptied first).
inline std::string scratch_dir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::path(PIPETRAIN_BINARY_DIR) / "test-scratch" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// Whether two safetensors checkpoints hold the same names and bitwise equal tensors; the first
// difference is named in `why`.
// The worst relative error of each "compare" line hf_reference printed, in order.
inline std::vector<double> worst_relative_errors(const std::string& output) {
  static const std::regex line(R"(worst relative error ([0-9.e+-]+))");
  std::vector<double> errors;
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it) {
    errors.push_back(std::stod((*it)[1].str()));
  }
  return errors;
}

inline bool same_checkpoints(const std::string& a, const std::string& b, std::string& why);

inline bool python_has_transformers() {
  static const bool has = python_imports("transformers, safetensors");
  return has;
}

#define PIPETRAIN_SKIP_WITHOUT_TRANSFORMERS()                                               \
  do {                                                                                      \
    if (!::pipetrain::testing::python_has_transformers()) {                                 \
      GTEST_SKIP() << ::pipetrain::testing::kPython                                         \
                   << " cannot import transformers and safetensors; run scripts/bootstrap"; \
    }                                                                                       \
  } while (false)

inline CliRun hf_reference(
    const std::string& arguments,
    CliOptions options = CliOptions().timeout_after(std::chrono::seconds(200))) {
  return run_command(kPython + " " + kHfReference + " " + arguments, options);
}

inline const std::string& hf_fixtures() {
  namespace fs = std::filesystem;
  // The script's mtime in the stamp: editing it makes the fixtures again.
  static const std::string directory = shared_fixture(
      "hf", std::to_string(fs::last_write_time(kHfReference).time_since_epoch().count()),
      [](const std::string& partial) {
        fs::remove_all(partial);  // the script makes its directory itself
        const CliRun made = hf_reference("fixtures " + shell_quote(partial));
        if (made.exit_code != 0) {
          throw std::runtime_error("hf_reference.py fixtures failed:\n" + made.output);
        }
      });
  return directory;
}

inline bool same_checkpoints(const std::string& a, const std::string& b, std::string& why) {
  const auto first = io::SafetensorsCheckpoint::open(a);
  const auto second = io::SafetensorsCheckpoint::open(b);
  if (first.names() != second.names()) {
    why = a + " and " + b + " hold different tensors";
    return false;
  }
  for (const std::string& name : first.names()) {
    if (!torch::equal(first.load(name, torch::kFloat32), second.load(name, torch::kFloat32))) {
      why = name + " differs";
      return false;
    }
  }
  return true;
}

}  // namespace pipetrain::testing
