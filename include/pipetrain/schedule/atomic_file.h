// Writing a file so that readers never see it half-written: write a temporary file next to it,
// then rename it over the target (rename is atomic within one file system).
//
// Thread-safety: safe from several threads for different paths; two writers of one path race
// (the last rename wins, each file is whole).
#pragma once

#include <string>

namespace pipetrain::schedule {

// Writes `content` to "<path>.tmp.<pid>.<counter>" and renames it to `path`.
// Throws std::runtime_error naming the path and the OS error when it cannot.
void write_file_atomically(const std::string& path, const std::string& content);

}  // namespace pipetrain::schedule
