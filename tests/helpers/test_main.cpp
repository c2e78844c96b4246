// main() of every test binary (in place of gtest_main):
//   - ::testing::TempDir() is a directory of this process's own (TEST_TMPDIR, which GoogleTest
//     reads on every call), removed with everything in it when the tests are done: what a test
//     writes there (parameter files, checkpoints, traces of the runs it starts) does not outlive
//     the process, whatever the test forgot to remove.
//   - The process then leaves with std::_Exit, as pipetrain's CLI does (apps/pipetrain/main.cpp):
//     LibTorch's static teardown (its operator registrations) is about 0.07 s of CPU a process,
//     and ctest starts some 270 of them. Not under ASan or TSan, whose checks run at exit.
#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>

#include <gtest/gtest.h>

int main(int argc, char** argv) {
  const char* base = std::getenv("TEST_TMPDIR");
  if (base == nullptr || *base == '\0') base = std::getenv("TMPDIR");
  std::string pattern =
      std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/pipetrain_test_XXXXXX";
  const bool own_dir = ::mkdtemp(pattern.data()) != nullptr;
  if (own_dir) {
    ::setenv("TEST_TMPDIR", pattern.c_str(), 1);
  } else {
    std::cerr << "test_main: mkdtemp " << pattern << " failed; TempDir() stays "
              << ::testing::TempDir() << "\n";
  }
  ::testing::InitGoogleTest(&argc, argv);
  const int code = RUN_ALL_TESTS();
  if (own_dir) {
    std::error_code ignored;
    std::filesystem::remove_all(pattern, ignored);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::cout.flush();
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  std::_Exit(code);
#endif
  return code;
}
