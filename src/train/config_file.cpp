// JSON config files as command-line flags (pipetrain/train/config_file.h).
#include "pipetrain/train/config_file.h"

#include <fstream>

namespace pipetrain::train {
namespace {

bool sets_flag(const std::vector<std::string>& given, const std::string& key) {
  const std::string flag = "--" + key;
  for (const auto& argument : given) {
    if (argument == flag || argument.rfind(flag + "=", 0) == 0) return true;
  }
  return false;
}

std::string scalar(const std::string& key, const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  if (value.is_number()) return value.dump();
  throw ConfigError("config key '" + key + "': unsupported value " + value.dump() +
                    " (use a string, number, boolean or an array of them)");
}

}  // namespace

nlohmann::json read_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("config file '" + path + "' cannot be opened");
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError("config file '" + path + "' is not valid JSON: " + e.what());
  }
  if (!config.is_object()) {
    throw ConfigError("config file '" + path +
                      "' must hold a JSON object of flag names, e.g. {\"lr\": 0.001}");
  }
  return config;
}

std::vector<std::string> config_to_arguments(const nlohmann::json& config,
                                             const std::vector<std::string>& given) {
  if (!config.is_object())
    throw ConfigError("a config must be a JSON object, got " + config.dump());
  std::vector<std::string> out;
  for (const auto& [key, value] : config.items()) {
    if (key.empty() || key[0] == '-') {
      throw ConfigError("config key '" + key + "': write the flag name without dashes");
    }
    if (sets_flag(given, key) || value.is_null()) continue;
    if (value.is_array()) {
      for (const auto& element : value) out.push_back("--" + key + "=" + scalar(key, element));
    } else {
      out.push_back("--" + key + "=" + scalar(key, value));
    }
  }
  return out;
}

std::vector<std::string> expand_config_arguments(const std::vector<std::string>& arguments,
                                                 const std::string& flag) {
  std::vector<std::string> rest;
  std::string path;
  bool found = false;
  for (size_t n = 0; n < arguments.size(); ++n) {
    const std::string& argument = arguments[n];
    if (argument == flag) {
      if (n + 1 >= arguments.size()) throw ConfigError(flag + " needs a file name");
      path = arguments[++n];
      found = true;
    } else if (argument.rfind(flag + "=", 0) == 0) {
      path = argument.substr(flag.size() + 1);
      found = true;
    } else {
      rest.push_back(argument);
    }
  }
  if (!found) return arguments;
  std::vector<std::string> from_file = config_to_arguments(read_config_file(path), rest);
  rest.insert(rest.end(), from_file.begin(), from_file.end());
  return rest;
}

}  // namespace pipetrain::train
