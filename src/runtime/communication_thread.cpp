// One thread running jobs in submission order (runtime/communication_thread.h).
#include "pipetrain/runtime/communication_thread.h"

#include <utility>

namespace pipetrain {

CommunicationThread::~CommunicationThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CommunicationThread::submit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    queue_.push_back(std::move(job));
  }
  changed_.notify_all();
}

void CommunicationThread::submit_or_run_here(std::function<void()> job, bool run_here) {
  if (!run_here) {
    submit(std::move(job));
    return;
  }
  drain();
  job();
}

void CommunicationThread::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return queue_.empty() && !running_; });
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
}

void CommunicationThread::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    std::function<void()> job = std::move(queue_.front());
    queue_.pop_front();
    if (error_) {  // drain() rethrows it; what follows would not match the other replicas
      changed_.notify_all();
      continue;
    }
    running_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    job = nullptr;  // what it captured is released before the submitter reads on
    lock.lock();
    running_ = false;
    if (error) error_ = error;
    changed_.notify_all();
  }
}

}  // namespace pipetrain
