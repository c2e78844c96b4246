// write_file_atomically: replace a file so that a crash or a full disk never leaves it half
// written; readers see either the old content or the new, never a mix.
//
//   [1] create a temporary file in the SAME directory (rename is atomic only within a file system)
//   [2] write every byte, [3] fsync it (data on disk before the name points at it)
//   [4] rename over the destination, [5] fsync the directory (the rename itself is durable)
// A failure at [1]..[4] removes the temporary and leaves the destination untouched.
//
// Thread-safety: concurrent writers of the same path each rename a complete file; the last one
// wins.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pipetrain/base/error.h"

namespace pipetrain {

// Throws pipetrain::FileError("cannot write '<path>': <step>: <strerror>") on any failure.
void write_file_atomically(const std::string& path, std::string_view bytes);
// The same with the content given as pieces written one after the other (a header, then each
// tensor's bytes where they lie), so a large file is never assembled in memory first.
void write_file_atomically(const std::string& path, const std::vector<std::string_view>& pieces);

// The same, streamed: bytes are written as they come ([1] at construction, [2] by write, [3]..[5]
// by commit), for a file whose parts are produced one after the other (each tensor of a shard read
// when its turn comes) and never held together. Destroyed without commit, or after a failure, it
// removes the temporary and leaves `path` untouched. One thread. A long file is handed to the disk
// window by window as it is written (Linux's sync_file_range), so that [3] waits only for its
// tail and the page cache holds at most two windows of it.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t size);
  uint64_t written() const { return written_; }
  void commit();

 private:
  [[noreturn]] void abandon(const std::string& step, int error);

  // Starts the disk on each whole kWriteBackWindow written (see write_back in the .cpp).
  void write_back();
  static constexpr uint64_t kWriteBackWindow = uint64_t{32} << 20;

  std::string path_, temporary_;
  int fd_ = -1;
  uint64_t written_ = 0;
  uint64_t started_ = 0;  // bytes handed to the disk's writeback so far
};

// Checks, before any work is done, that `path` can be written later: its directory exists and
// takes a new file (one is made there and removed), and `path` is not a directory. With
// `directory` true, `path` is a directory (made, with its parents, when missing) that takes a new
// file. Throws FileError("cannot write '<path>': <why>").
void check_writable(const std::string& path, bool directory = false);

// Reads a whole file. Throws FileError naming the path when it cannot.
std::string read_file(const std::string& path);

}  // namespace pipetrain
