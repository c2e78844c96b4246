// Finding a test's processes from outside, as an operator would: by a variable in their
// environment. The fault tests use it to kill or stop one rank of a running job, and to check that
// nothing of a job is left once it ended.
#pragma once

#include <dirent.h>
#include <sys/types.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

namespace pipetrain::testing {

// The pids of live processes whose environment holds every one of `variables` ("NAME=value").
// Zombies and processes of other users (unreadable environ) are not listed.
inline std::vector<pid_t> processes_with(const std::vector<std::string>& variables) {
  std::vector<pid_t> found;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* entry = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
    if (pid <= 0) continue;
    std::ifstream in("/proc/" + std::string(entry->d_name) + "/environ", std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::set<std::string> present;
    std::size_t start = 0;
    for (std::size_t end; (end = text.find('\0', start)) != std::string::npos; start = end + 1) {
      present.insert(text.substr(start, end - start));
    }
    bool all = true;
    for (const std::string& variable : variables) all = all && present.count(variable) > 0;
    if (all) found.push_back(pid);
  }
  closedir(proc);
  return found;
}

// The process of rank `rank` of the job tagged PIPETRAIN_TEST_JOB=`tag` (its environment has both);
// -1 when there is none (between two attempts of a restarted job).
inline pid_t rank_process(const std::string& tag, int rank) {
  const std::vector<pid_t> found =
      processes_with({"PIPETRAIN_TEST_JOB=" + tag, "RANK=" + std::to_string(rank)});
  return found.empty() ? -1 : found.front();
}

}  // namespace pipetrain::testing
