// Test support: an empty directory of the test process's own, ::testing::TempDir()/<name>
// (emptied first), for files a test writes and reads back. Torch-free.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace pipetrain::testing {

inline std::string fresh_temp_dir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace pipetrain::testing
