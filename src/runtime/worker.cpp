// The long-lived worker thread (include/pipetrain/runtime/worker.h).
#include "pipetrain/runtime/worker.h"

#include <c10/util/Exception.h>

namespace pipetrain {

Worker::Worker(std::function<void()> setup)
    : thread_([this, setup = std::move(setup)]() mutable { loop(std::move(setup)); }) {}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void Worker::run(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_INTERNAL_ASSERT(!busy_, "Worker::run while a task is running");
    task_ = std::move(task);
    busy_ = true;
    error_ = nullptr;
  }
  changed_.notify_all();
}

std::exception_ptr Worker::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !busy_; });
  return error_;
}

void Worker::loop(std::function<void()> setup) {
  std::exception_ptr setup_error;
  try {
    if (setup) setup();
  } catch (...) {
    setup_error = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || (busy_ && task_); });
    if (stopping_ && !busy_) return;
    std::function<void()> task = std::move(task_);
    task_ = nullptr;
    lock.unlock();
    std::exception_ptr error = setup_error;
    if (!error) {
      try {
        task();
      } catch (...) {
        error = std::current_exception();
      }
    }
    task = nullptr;  // release what the task captured on this thread
    lock.lock();
    error_ = error;
    busy_ = false;
    changed_.notify_all();
  }
}

}  // namespace pipetrain
