// FileIo: asynchronous positional reads and writes of whole byte ranges, the engine under the
// offload files (offload/swap_file.h). Two engines, chosen by --offload-io (bench --suite offload
// measures both against the disk's own speed, docs/OFFLOAD.md):
//
//   uring    Linux's io_uring (Debian's liburing): requests go to the kernel's submission queue
//            without a thread each, a completion thread reaps them. Needs liburing at build time
//            and a kernel (and a sandbox) that lets the process set up a ring: uring_available().
//   threads  a pool of `depth` threads, each running pread/pwrite to the end of its range.
//
// A request moves every byte of its range or fails: short transfers are continued, EINTR retried,
// and a failure (or a read past the end of the file) is thrown by IoTicket::wait() as a
// pipetrain::FileError naming the file, the offset, the length and the system's reason. At most
// `depth` requests are in the kernel (or the threads) at once; more wait in the engine's queue.
//
// Torch-free (part of pipetrain::schedule). Thread-safety: read and write may be called from any
// thread; a ticket may be waited on from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace pipetrain::offload {

enum class IoEngine { kUring, kThreads };
// "uring", "threads"; the parser throws BadInput naming the text.
const char* to_string(IoEngine engine);
IoEngine parse_io_engine(const std::string& text);
// True where this build has liburing and the kernel lets this process set up a ring.
bool uring_available();

// One request's completion.
class IoTicket {
 public:
  struct State {
    std::mutex mutex;
    std::condition_variable changed;
    bool done = false;  // GUARDED_BY(mutex)
    std::string error;  // GUARDED_BY(mutex): "" on success
  };
  IoTicket() = default;
  explicit IoTicket(std::shared_ptr<State> state) : state_(std::move(state)) {}

  // Waits until the request is done; throws pipetrain::FileError when it failed. A default ticket
  // (no request) is done.
  void wait() const;
  bool done() const;

 private:
  std::shared_ptr<State> state_;
};

class FileIo {
 public:
  virtual ~FileIo() = default;
  // Starts moving `bytes` from `data` to `offset` of the open file `fd` (`path` names it in
  // errors). `data` must stay valid until the ticket is done. Under O_DIRECT the caller aligns
  // data, offset and bytes (offload/swap_file.h does).
  virtual IoTicket write(int fd, int64_t offset, const void* data, int64_t bytes,
                         const std::string& path) = 0;
  // The same from the file into `data`.
  virtual IoTicket read(int fd, int64_t offset, void* data, int64_t bytes,
                        const std::string& path) = 0;
  virtual IoEngine engine() const = 0;
  virtual int depth() const = 0;
};

// Throws pipetrain::BadInput for depth < 1 or kUring where !uring_available() (saying why).
std::unique_ptr<FileIo> make_file_io(IoEngine engine, int depth = 4);

namespace detail {
// Marks a ticket's state done, with `error` ("" for success), and wakes its waiters.
void finish(IoTicket::State& state, std::string error);
// The message of a failed transfer: "cannot read 'PATH' at offset O (N bytes): REASON".
std::string transfer_error(bool write, const std::string& path, int64_t offset, int64_t bytes,
                           const std::string& reason);
std::unique_ptr<FileIo> make_uring_io(int depth);  // file_io_uring.cpp / file_io_nouring.cpp
std::string uring_unavailable_reason();            // "" where available
}  // namespace detail

}  // namespace pipetrain::offload
