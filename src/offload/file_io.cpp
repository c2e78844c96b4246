#include "pipetrain/offload/file_io.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "pipetrain/base/error.h"

namespace pipetrain::offload {

const char* to_string(IoEngine engine) {
  switch (engine) {
    case IoEngine::kUring:
      return "uring";
    case IoEngine::kThreads:
      return "threads";
  }
  return "?";
}

IoEngine parse_io_engine(const std::string& text) {
  if (text == "uring") return IoEngine::kUring;
  if (text == "threads") return IoEngine::kThreads;
  throw BadInput("--offload-io '" + text + "' is not one of uring, threads");
}

bool uring_available() {
  return detail::uring_unavailable_reason().empty();
}

void IoTicket::wait() const {
  if (!state_) return;
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->changed.wait(lock, [&] { return state_->done; });
  if (!state_->error.empty()) throw FileError(state_->error);
}

bool IoTicket::done() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->done;
}

namespace detail {

void finish(IoTicket::State& state, std::string error) {
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    state.done = true;
    state.error = std::move(error);
  }
  state.changed.notify_all();
}

std::string transfer_error(bool write, const std::string& path, int64_t offset, int64_t bytes,
                           const std::string& reason) {
  return std::string(write ? "cannot write '" : "cannot read '") + path + "' at offset " +
         std::to_string(offset) + " (" + std::to_string(bytes) + " bytes): " + reason;
}

}  // namespace detail

namespace {

// A pool of threads, each moving one whole range with pread/pwrite at a time.
class ThreadIo : public FileIo {
 public:
  explicit ThreadIo(int depth) : depth_(depth) {
    for (int i = 0; i < depth; ++i) threads_.emplace_back([this] { serve(); });
  }
  ~ThreadIo() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    queued_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  IoTicket write(int fd, int64_t offset, const void* data, int64_t bytes,
                 const std::string& path) override {
    return submit({true, fd, offset, const_cast<char*>(static_cast<const char*>(data)), bytes, path,
                   std::make_shared<IoTicket::State>()});
  }
  IoTicket read(int fd, int64_t offset, void* data, int64_t bytes,
                const std::string& path) override {
    return submit({false, fd, offset, static_cast<char*>(data), bytes, path,
                   std::make_shared<IoTicket::State>()});
  }
  IoEngine engine() const override { return IoEngine::kThreads; }
  int depth() const override { return depth_; }

 private:
  struct Request {
    bool write;
    int fd;
    int64_t offset;
    char* data;
    int64_t bytes;
    std::string path;
    std::shared_ptr<IoTicket::State> state;
  };

  IoTicket submit(Request request) {
    IoTicket ticket(request.state);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(request));
    }
    queued_.notify_one();
    return ticket;
  }

  void serve() {
    for (;;) {
      Request r;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        queued_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left to do
        r = std::move(queue_.front());
        queue_.pop_front();
      }
      detail::finish(*r.state, move_all(r));
    }
  }

  // "" when every byte moved, else the error's message.
  static std::string move_all(const Request& r) {
    int64_t done = 0;
    while (done < r.bytes) {
      const ssize_t n = r.write ? ::pwrite(r.fd, r.data + done, static_cast<size_t>(r.bytes - done),
                                           static_cast<off_t>(r.offset + done))
                                : ::pread(r.fd, r.data + done, static_cast<size_t>(r.bytes - done),
                                          static_cast<off_t>(r.offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        return detail::transfer_error(r.write, r.path, r.offset, r.bytes, std::strerror(errno));
      if (n == 0) {
        return detail::transfer_error(r.write, r.path, r.offset, r.bytes,
                                      "the file ends after " + std::to_string(done) + " bytes");
      }
      done += n;
    }
    return "";
  }

  int depth_;
  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<Request> queue_;  // GUARDED_BY(mutex_)
  bool stopping_ = false;      // GUARDED_BY(mutex_)
  std::vector<std::thread> threads_;
};

}  // namespace

std::unique_ptr<FileIo> make_file_io(IoEngine engine, int depth) {
  if (depth < 1) {
    throw BadInput("offload I/O depth " + std::to_string(depth) + " must be at least 1");
  }
  if (engine == IoEngine::kThreads) return std::make_unique<ThreadIo>(depth);
  const std::string why = detail::uring_unavailable_reason();
  if (!why.empty()) throw BadInput("--offload-io uring is not available here: " + why);
  return detail::make_uring_io(depth);
}

}  // namespace pipetrain::offload
