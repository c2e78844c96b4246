// Config files: a JSON object whose keys are the long flag names of a command, e.g.
//   {"model": "cnn", "lr": 0.001, "epochs": 1, "tie-embeddings": true, "widths": [784, 10]}
// `pipetrain train --config run.json --lr 0.01` equals `pipetrain train --model cnn --lr 0.01
// --epochs 1 ...`: the file's settings become flags, and a flag given on the command line wins
// over the file's (the file's value for that key is dropped).
//
// Translation of a value: string/number -> "--key=value"; true/false -> "--key=true"/"=false"
// (CLI11 flags accept both); array -> "--key=v" repeated per element; null -> nothing.
// Objects, and keys that are empty or start with '-', are errors.
//
// Thread-safety: pure functions.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipetrain/base/error.h"

namespace pipetrain::train {

// A malformed config file or value: user input, CLI exit code 2.
class ConfigError : public BadInput {
 public:
  using BadInput::BadInput;
};

// Reads and parses a JSON object. Throws ConfigError naming the path (and the parse error).
nlohmann::json read_config_file(const std::string& path);

// The flags for `config`, in key order, leaving out keys for which `given` already holds
// "--key" or "--key=...".
std::vector<std::string> config_to_arguments(const nlohmann::json& config,
                                             const std::vector<std::string>& given = {});

// Finds "<flag> FILE" or "<flag>=FILE" in `arguments`, removes it, and appends the file's flags
// that the arguments do not set. Without the flag, returns `arguments` unchanged.
// Example: {"train", "--config", "a.json", "--lr", "0.1"} with a.json = {"lr": 1, "epochs": 2}
//       -> {"train", "--lr", "0.1", "--epochs=2"}
std::vector<std::string> expand_config_arguments(const std::vector<std::string>& arguments,
                                                 const std::string& flag = "--config");

}  // namespace pipetrain::train
