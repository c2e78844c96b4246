// ScopedThreadCount: the calling thread's intra-op thread count (at::set_num_threads) for the
// lifetime of the guard, restored afterwards. Both runtimes run a rank on the calling thread with
// PipeOptions::threads_per_stage this way (Pipe with one rank, DistributedPipe always), so a
// caller's own thread count is the same before and after a step.
//
// Thread-safety: the count is per OS thread; construct and destroy on the same thread.
#pragma once

#include <ATen/Parallel.h>

namespace pipetrain {

class ScopedThreadCount {
 public:
  // threads <= 0: leaves the count alone.
  explicit ScopedThreadCount(int threads) : saved_(at::get_num_threads()) {
    if (threads > 0 && threads != saved_) at::set_num_threads(threads);
  }
  ~ScopedThreadCount() {
    if (at::get_num_threads() != saved_) at::set_num_threads(saved_);
  }
  ScopedThreadCount(const ScopedThreadCount&) = delete;
  ScopedThreadCount& operator=(const ScopedThreadCount&) = delete;

 private:
  int saved_;
};

}  // namespace pipetrain
