// Runs build/pipetrain from a test and captures what it prints (stdout and stderr together).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace pipetrain::testing {

struct CliRun {
  int exit_code = -1;  // -1: could not start, or killed by a signal
  std::string output;  // stdout and stderr
};

// Runs `build/pipetrain ARGUMENTS` through the shell (arguments are not quoted).
inline CliRun run_pipetrain(const std::string& arguments) {
  const std::string command =
      std::string(PIPETRAIN_BINARY_DIR) + "/pipetrain " + arguments + " 2>&1";
  CliRun run;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return run;
  std::array<char, 4096> buffer;
  std::size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    run.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

}  // namespace pipetrain::testing
