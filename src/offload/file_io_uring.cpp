// The io_uring engine of FileIo (offload/file_io.h); file_io_nouring.cpp stands in for it where
// the build has no liburing.
#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <unordered_set>

#include "pipetrain/base/error.h"
#include "pipetrain/offload/file_io.h"

namespace pipetrain::offload::detail {
namespace {

// One request, owned by the ring while it is in flight (user_data points at it).
struct Pending {
  bool write;
  int fd;
  int64_t offset;
  char* data;
  int64_t bytes;
  int64_t done = 0;
  std::string path;
  std::shared_ptr<IoTicket::State> state;
};

// A submission moves at most this much; the rest of a range follows when it completes.
constexpr int64_t kMostPerSubmission = int64_t{1} << 30;

class UringIo : public FileIo {
 public:
  explicit UringIo(int depth) : depth_(depth) {
    const int rc = io_uring_queue_init(static_cast<unsigned>(depth), &ring_, 0);
    if (rc < 0) {
      throw Error(ErrorKind::Runtime, std::string("io_uring_queue_init: ") + std::strerror(-rc));
    }
    reaper_ = std::thread([this] { reap(); });
  }

  ~UringIo() override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      space_.wait(lock, [&] { return in_flight_ == 0; });
      if (!broken_.empty()) {  // the reaper has stopped already
        lock.unlock();
        reaper_.join();
        io_uring_queue_exit(&ring_);
        return;
      }
      io_uring_sqe* sqe = next_sqe();
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data(sqe, nullptr);  // the reaper's sign to stop
      io_uring_submit(&ring_);
    }
    reaper_.join();
    io_uring_queue_exit(&ring_);
  }

  IoTicket write(int fd, int64_t offset, const void* data, int64_t bytes,
                 const std::string& path) override {
    return submit(new Pending{true, fd, offset, const_cast<char*>(static_cast<const char*>(data)),
                              bytes, 0, path, std::make_shared<IoTicket::State>()});
  }
  IoTicket read(int fd, int64_t offset, void* data, int64_t bytes,
                const std::string& path) override {
    return submit(new Pending{false, fd, offset, static_cast<char*>(data), bytes, 0, path,
                              std::make_shared<IoTicket::State>()});
  }
  IoEngine engine() const override { return IoEngine::kUring; }
  int depth() const override { return depth_; }

 private:
  IoTicket submit(Pending* p) {
    IoTicket ticket(p->state);
    if (p->bytes == 0) {
      finish(*p->state, "");
      delete p;
      return ticket;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    space_.wait(lock, [&] { return in_flight_ < depth_ || !broken_.empty(); });
    if (!broken_.empty()) {
      finish(*p->state, transfer_error(p->write, p->path, p->offset, p->bytes, broken_));
      delete p;
      return ticket;
    }
    ++in_flight_;
    pending_.insert(p);
    queue_locked(p);
    return ticket;
  }

  // Queues the rest of p's range. REQUIRES: mutex_ held.
  void queue_locked(Pending* p) {
    io_uring_sqe* sqe = next_sqe();
    const auto length = static_cast<unsigned>(std::min(p->bytes - p->done, kMostPerSubmission));
    if (p->write) {
      io_uring_prep_write(sqe, p->fd, p->data + p->done, length,
                          static_cast<uint64_t>(p->offset + p->done));
    } else {
      io_uring_prep_read(sqe, p->fd, p->data + p->done, length,
                         static_cast<uint64_t>(p->offset + p->done));
    }
    io_uring_sqe_set_data(sqe, p);
    io_uring_submit(&ring_);
  }

  // REQUIRES: mutex_ held. The queue holds depth_ entries and at most depth_ requests are in
  // flight, each with one entry, so one is free once the kernel took the last submission.
  io_uring_sqe* next_sqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (!sqe) {
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
    }
    return sqe;
  }

  void reap() {
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        fail_all(std::string("io_uring_wait_cqe: ") + std::strerror(-rc));
        return;
      }
      auto* p = static_cast<Pending*>(io_uring_cqe_get_data(cqe));
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      if (!p) return;  // the destructor's stop sign
      // Under the submitters' mutex: p was filled in under it (the ring's own ordering is the
      // kernel's, which a thread sanitizer cannot see).
      std::unique_lock<std::mutex> lock(mutex_);
      if (res == -EINTR || res == -EAGAIN) {
        queue_locked(p);
        continue;
      }
      std::string error;
      if (res < 0) {
        error = transfer_error(p->write, p->path, p->offset, p->bytes, std::strerror(-res));
      } else if (res == 0) {
        error = transfer_error(p->write, p->path, p->offset, p->bytes,
                               "the file ends after " + std::to_string(p->done) + " bytes");
      } else {
        p->done += res;
        if (p->done < p->bytes) {
          queue_locked(p);
          continue;
        }
      }
      finish(*p->state, std::move(error));
      pending_.erase(p);
      --in_flight_;
      delete p;
      lock.unlock();
      space_.notify_all();
    }
  }

  // The ring broke: nothing in flight will complete. Not expected; every waiter hears why.
  void fail_all(const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    broken_ = why;
    for (Pending* p : pending_) {
      finish(*p->state, transfer_error(p->write, p->path, p->offset, p->bytes, why));
      delete p;
    }
    pending_.clear();
    in_flight_ = 0;
    space_.notify_all();
  }

  int depth_;
  io_uring ring_{};
  std::mutex mutex_;
  std::condition_variable space_;
  int in_flight_ = 0;   // GUARDED_BY(mutex_)
  std::string broken_;  // GUARDED_BY(mutex_): why the ring stopped, "" while it works
  std::unordered_set<Pending*> pending_;  // GUARDED_BY(mutex_): in flight
  std::thread reaper_;
};

}  // namespace

std::unique_ptr<FileIo> make_uring_io(int depth) {
  return std::make_unique<UringIo>(depth);
}

std::string uring_unavailable_reason() {
  static const std::string reason = [] {
    io_uring ring{};
    const int rc = io_uring_queue_init(2, &ring, 0);
    if (rc < 0) return std::string("io_uring_queue_init: ") + std::strerror(-rc);
    io_uring_queue_exit(&ring);
    return std::string();
  }();
  return reason;
}

}  // namespace pipetrain::offload::detail
