// CommunicationThread: one thread that runs jobs in the order they were submitted, so that the
// thread submitting them goes on at once. The overlapped gradient reductions use it to pack a
// bucket's gradients and start its collective off the compute thread: GradientReducer (the
// all-reduce) and the ZeRO optimizer's reduce-scatter (train/sharded_optimizer.h).
//
//   compute:  B(stage 3) submit ... B(stage 1) B(stage 1) submit ...     drain() | wait, unpack
//   thread:                 [pack, start]                  [pack, start]
//
// A collective's order must be the same on every member of its group, and c10d takes a group's
// collectives from one thread at a time. So: the jobs run one after the other, in submission
// order; and before its owner issues a collective of its own on the group the jobs use, it calls
// drain(), which returns once every job submitted so far has run (and rethrows the first job's
// failure). After a failed job the rest of the queue is skipped: they would only add collectives
// the other replicas do not match. What a job writes is the submitter's to read after drain().
//
// The thread starts with the first submit() and ends with the object; the destructor lets a
// running job end and drops the queued ones.
// Thread-safety: one submitting thread (submit, drain); the thread itself is internal.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace pipetrain {

class CommunicationThread {
 public:
  CommunicationThread() = default;
  ~CommunicationThread();
  CommunicationThread(const CommunicationThread&) = delete;
  CommunicationThread& operator=(const CommunicationThread&) = delete;

  // Queues `job` behind the jobs submitted before it.
  void submit(std::function<void()> job);
  // submit(job), or, when `run_here`, drain() and then job() on the calling thread: it still
  // follows what was submitted before it. For work that must stay on the caller's thread (an
  // asynchronous copy on the caller's CUDA stream) but in the queue's order.
  void submit_or_run_here(std::function<void()> job, bool run_here);
  // Blocks until every job submitted so far has run or been skipped; rethrows the first failure
  // since the last drain() (once).
  void drain();
  // Whether the thread has been started (a job was ever submitted).
  bool started() const { return thread_.joinable(); }

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;  // GUARDED_BY(mutex_)
  bool running_ = false;                     // GUARDED_BY(mutex_): a job left the queue, not ended
  bool stopping_ = false;                    // GUARDED_BY(mutex_)
  std::exception_ptr error_;                 // GUARDED_BY(mutex_)
  std::thread thread_;
};

}  // namespace pipetrain
