// SwapFile: one file of offloaded bytes under --offload-dir, cut into regions (one a tensor's
// shard, an optimizer state's slice, ...), read and written through a FileIo (offload/file_io.h).
//
// The file is opened with O_DIRECT where the file system takes it (ext4, xfs, and tmpfs since
// Linux 6.6: the page cache is bypassed, so offloaded bytes do not come back as cached host
// memory) and without where it does not, or where the caller asks for the page cache (`direct`
// false); direct() says which. It is removed from its directory as soon as it is open: its
// space is this process's while it lives and goes back to the file system however the process
// ends, so a crash leaves nothing behind to clean.
//
// Regions are reserved up front (reserve(): fallocate where the file system has it), so a disk
// too small for the run fails at once, naming the directory and the bytes, and not in the middle
// of a step. Each region starts at a multiple of the alignment.
//
// Under O_DIRECT a transfer's memory, offset and length must be aligned: write and read round the
// length up to the alignment, so the memory given must hold that many bytes (the buffers of
// offload/aligned_buffers.h do); the bytes past a region's end in its last block are padding.
//
// Torch-free (part of pipetrain::schedule). Thread-safety: reserve on one thread, before the
// transfers; read and write from any thread (the regions they touch must not overlap a write in
// flight).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "pipetrain/offload/file_io.h"

namespace pipetrain::offload {

class SwapFile {
 public:
  // Creates a file named `name` in `directory` (which must exist). Throws pipetrain::FileError
  // naming the path and the reason when it cannot.
  SwapFile(const std::string& directory, const std::string& name, std::shared_ptr<FileIo> io,
           int64_t alignment = 4096, bool direct = true);
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  // A new region of `bytes` (rounded up to the alignment); returns its offset. Throws
  // pipetrain::FileError naming the directory and the bytes when the file system has no room.
  int64_t reserve(int64_t bytes);

  // Starts writing `bytes` of `data` at `offset` (within a reserved region); see the header
  // comment for the alignment. Throws pipetrain::Error (kind Runtime) for a range outside the
  // reserved regions or misaligned memory under O_DIRECT: a caller's mistake, not the disk's.
  IoTicket write(int64_t offset, const void* data, int64_t bytes);
  IoTicket read(int64_t offset, void* data, int64_t bytes);

  bool direct() const { return direct_; }
  const std::string& path() const { return path_; }
  int64_t alignment() const { return alignment_; }
  // The bytes reserved so far (the file's size).
  int64_t size() const { return size_; }
  FileIo& io() const { return *io_; }

 private:
  int64_t checked_length(int64_t offset, const void* data, int64_t bytes, const char* what) const;

  std::string path_;
  std::shared_ptr<FileIo> io_;
  int64_t alignment_;
  int fd_ = -1;
  bool direct_ = false;
  int64_t size_ = 0;
};

}  // namespace pipetrain::offload
