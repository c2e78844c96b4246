// The suites' children (child_runs.h).
#include "child_runs.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "pipetrain/base/median.h"

namespace pipetrain::bench {

std::string self_path() {
  return std::filesystem::canonical("/proc/self/exe").string();
}

Child run_child(const BenchOptions& a, const std::string& command) {
  Child child;
  const std::string line =
      "timeout " + std::to_string(static_cast<int>(a.config_timeout)) + " " + command + " 2>&1";
  FILE* pipe = ::popen(line.c_str(), "r");
  if (!pipe) return {"", -1};
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe)) child.output += buffer;
  child.status = ::pclose(pipe);
  return child;
}

void write_random_ids(const std::string& path, int64_t count) {
  std::vector<uint16_t> ids(static_cast<size_t>(count));
  uint64_t state = 0x9e3779b97f4a7c15ULL;
  for (uint16_t& id : ids) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    id = static_cast<uint16_t>((state >> 33) % 4096);
  }
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(ids.data()),
             static_cast<std::streamsize>(ids.size() * sizeof(uint16_t)));
}

std::pair<double, double> largest_activations(const std::string& output) {
  auto bytes = [](double value, const std::string& unit) {
    const std::map<std::string, double> scale = {
        {"B", 1}, {"KiB", 1024.0}, {"MiB", 1024.0 * 1024}, {"GiB", 1024.0 * 1024 * 1024}};
    const auto found = scale.find(unit);
    return found == scale.end() ? 0.0 : value * found->second;
  };
  std::pair<double, double> most{0, 0};
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    const size_t at = line.find(" activations ");
    if (at == std::string::npos || line.find("memory:") == std::string::npos) continue;
    std::istringstream fields(line.substr(at + 13));
    double predicted = 0, measured = 0;
    std::string unit_p, unit_m;
    if (!(fields >> predicted >> unit_p >> measured >> unit_m)) continue;
    most.first = std::max(most.first, bytes(predicted, unit_p));
    most.second = std::max(most.second, bytes(measured, unit_m));
  }
  return most;
}

std::string report_cell(const nlohmann::json& row, const char* key, double scale,
                        const char* format) {
  if (!row.contains(key)) return "-";
  char text[32];
  std::snprintf(text, sizeof text, format, row[key].get<double>() * scale);
  return text;
}

std::string tail(const std::string& text) {
  return text.substr(text.size() > 800 ? text.size() - 800 : 0);
}

std::string run_train_row(const BenchOptions& a, const std::string& command,
                          const std::string& summary, nlohmann::json& row) {
  std::filesystem::remove(summary);
  const Child child = run_child(a, command);
  std::ifstream in(summary);
  if (child.status != 0 || !in) {
    row["error"] = "exit status " + std::to_string(child.status) + ": " + tail(child.output);
    return child.output;
  }
  const nlohmann::json result = nlohmann::json::parse(in);
  std::vector<double> steps = result.at("step_seconds").get<std::vector<double>>();
  if (static_cast<int>(steps.size()) <= a.warmup) {
    row["error"] = "fewer steps than --warmup";
    return child.output;
  }
  steps.erase(steps.begin(), steps.begin() + a.warmup);
  row["step_seconds"] = median(steps);
  row["step_seconds_all"] = steps;
  if (result.contains("process_peak_bytes"))
    row["process_peak_bytes"] = result["process_peak_bytes"];
  return child.output;
}

}  // namespace pipetrain::bench
