// Parameter files written by `pipetrain train --save-params` (a torch.load-able dict), read back
// for comparisons in the CLI tests.
#pragma once

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace pipetrain::testing {

inline std::map<std::string, torch::Tensor> load_params(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, torch::Tensor> out;
  for (const auto& entry : torch::pickle_load(bytes).toGenericDict()) {
    out[entry.key().toStringRef()] = entry.value().toTensor();
  }
  return out;
}

// Largest |a - b| / max|b| over every parameter; the names must agree.
inline double max_relative_difference(const std::string& a_path, const std::string& b_path) {
  auto a = load_params(a_path);
  auto b = load_params(b_path);
  EXPECT_EQ(a.size(), b.size());
  EXPECT_FALSE(b.empty()) << b_path;
  double worst = 0;
  for (const auto& [name, tensor] : b) {
    auto found = a.find(name);
    if (found == a.end()) {
      ADD_FAILURE() << "missing parameter " << name << " in " << a_path;
      return 1e9;
    }
    const double scale = std::max(tensor.abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (found->second - tensor).abs().max().item<double>() / scale);
  }
  return worst;
}

}  // namespace pipetrain::testing
