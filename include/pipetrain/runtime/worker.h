// Worker: one long-lived thread that runs the tasks it is given, one at a time. The in-process
// Pipe keeps one per rank, created at construction and joined in the destructor, so thread-local
// settings (intra-op thread count, CUDA stream) are made once and autograd runs on the thread
// that ran the forward.
//
// Ownership: the Worker owns its thread. Thread-safety: run()/wait() are called by one owner
// thread; the task runs on the worker thread. A task's exception is caught and returned by wait().
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace pipetrain {

class Worker {
 public:
  // `setup` runs once on the new thread before any task (e.g. at::set_num_threads).
  explicit Worker(std::function<void()> setup = {});
  ~Worker();  // finishes the running task, then joins
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Starts `task` on the worker thread. REQUIRES: the previous task was waited for.
  void run(std::function<void()> task);
  // Blocks until the task finished; returns its exception (null when it succeeded).
  std::exception_ptr wait();

 private:
  void loop(std::function<void()> setup);

  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> task_;  // GUARDED_BY(mutex_)
  bool busy_ = false;           // GUARDED_BY(mutex_)
  bool stopping_ = false;       // GUARDED_BY(mutex_)
  std::exception_ptr error_;    // GUARDED_BY(mutex_)
  std::thread thread_;          // last member: starts after the others exist
};

}  // namespace pipetrain
