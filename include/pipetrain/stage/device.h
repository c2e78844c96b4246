// The device seam: everything that differs between a CUDA build and a CPU-only build of LibTorch.
//
// src/stage/device_cuda.cpp implements it with CUDA streams, events and generators (built only
// with a CUDA LibTorch); src/stage/device_nocuda.cpp is the CPU stand-in, where CUDA devices are
// a clear error and synchronisation is a no-op. The rest of the runtime has no `if (cuda)`.
//
// Thread-safety: every function may be called from any thread; the stream guard acts on the
// calling thread only.
#pragma once

#include <memory>

#include <torch/types.h>

namespace pipetrain {

// Throws pipetrain::BadInput naming `device` when this build cannot run on it (a CUDA device in a
// CPU-only build, or a CUDA index beyond the visible devices).
void check_device_usable(const torch::Device& device);

// While alive, work on `device` issued by the calling thread goes to a stream of its own (taken
// from the pool once per guard), so the ranks of one process overlap on their devices. No-op on
// CPU.
class RankStreamGuard {
 public:
  explicit RankStreamGuard(const torch::Device& device);
  ~RankStreamGuard();
  RankStreamGuard(const RankStreamGuard&) = delete;
  RankStreamGuard& operator=(const RankStreamGuard&) = delete;

 private:
  std::shared_ptr<void> impl_;  // the CUDA stream guard; null on CPU
};

// Marks "the work queued so far on `device` by this thread" so that another thread can make its
// own stream wait for it before reading tensors produced here. Empty on CPU.
struct ReadyMarker {
  std::shared_ptr<void> event;  // a CUDA event; null on CPU
};
ReadyMarker mark_ready(const torch::Device& device);
// Makes the calling thread's current stream on `device` wait for `marker`. No-op when empty.
void wait_ready(const ReadyMarker& marker, const torch::Device& device);

// The state of the random number generator of `device` (undefined tensor for CPU: the CPU
// generator is handled by the stage itself), and its restore.
torch::Tensor device_rng_state(const torch::Device& device);
void set_device_rng_state(const torch::Device& device, const torch::Tensor& state);

}  // namespace pipetrain
