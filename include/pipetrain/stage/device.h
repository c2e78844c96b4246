// The device seam: everything that differs between a CUDA build and a CPU-only build of LibTorch.
//
// src/stage/device_cuda.cpp implements it with CUDA streams, events and generators (built only
// with a CUDA LibTorch); src/stage/device_nocuda.cpp is the CPU stand-in, where CUDA devices are
// a clear error and synchronisation is a no-op. The rest of the runtime has no `if (cuda)`.
//
// Thread-safety: every function may be called from any thread; the stream guard acts on the
// calling thread only.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

namespace pipetrain {

// Throws pipetrain::BadInput naming `device` when this build cannot run on it (a CUDA device in a
// CPU-only build, or a CUDA index beyond the visible devices).
void check_device_usable(const torch::Device& device);

// CUDA devices visible to this process (0 in a CPU-only build or on a machine without a GPU).
int cuda_device_count();

// The device of each of `ranks` pipeline ranks in one process: `kind` "cpu" (every rank on the
// CPU) or "cuda" (rank r on cuda:(r mod visible GPUs)), or the explicit list `devices` (one per
// rank, e.g. {"cuda:0", "cuda:1"}), which wins when given. Throws pipetrain::BadInput naming the
// value for an unknown kind, a list of another length, a device that does not parse, or CUDA
// where none is visible.
std::vector<torch::Device> rank_devices(const std::string& kind,
                                        const std::vector<std::string>& devices, int ranks);

// A stream of a rank's own on a CUDA device, kept for every step: per-stream caches (cuBLAS keeps a
// workspace of tens of MiB for each stream a thread ran on) are then made once, not once per step.
// Rank r on device d gets the same stream in every Pipe of the process (taken from the pool the
// first time), so building Pipe after Pipe does not add workspaces either. Empty on CPU.
struct RankStream {
  std::shared_ptr<void> stream;  // a c10::cuda::CUDAStream; null on CPU
};
RankStream rank_stream(const torch::Device& device, int rank);

// While alive, work issued by the calling thread on the stream's device goes to `stream`, so the
// ranks of one process overlap on their devices. No-op for an empty RankStream (CPU).
class RankStreamGuard {
 public:
  explicit RankStreamGuard(const RankStream& stream);
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

// Activation offload (PipeOptions::offload_activations): a checkpointed micro-batch's stashed
// inputs wait in host memory between its forward and its backward.
struct HostCopies {
  std::vector<torch::Tensor> tensors;  // pinned host copies; on a CPU device the tensors themselves
  bool moved = false;                  // false on a CPU device: nothing was copied
};
// Starts copying `tensors` (on `device`) to pinned host memory on the device's copy stream, after
// the work queued so far on the calling thread's stream, and returns the copies. The device
// tensors' memory is not reused until the copies are done (the caching allocator waits for the
// copy stream). On a CPU device nothing is copied: the tensors come back as they are.
HostCopies copy_to_host(const std::vector<torch::Tensor>& tensors, const torch::Device& device);
// Starts copying `copies` back to `device` on its copy stream and returns the device tensors, with
// `ready` set to the marker the calling thread's stream waits on (wait_ready) before reading them.
// On a CPU device (copies not moved) the tensors come back as they are and `ready` is empty.
std::vector<torch::Tensor> copy_to_device(const HostCopies& copies, const torch::Device& device,
                                          ReadyMarker& ready);

// Tells LibTorch's caching allocator that the calling thread's current stream on `tensor`'s
// device reads `tensor`, so its memory is not handed out again, when it is freed, before that
// stream's work queued so far is done. A tensor made on another rank's stream needs this: freed
// here, its block would go back to the other stream, whose next allocation could overwrite it
// while this stream's kernels still read it. No-op for CPU tensors and on the allocating stream.
void record_use_on_current_stream(const torch::Tensor& tensor);

// Peak bytes LibTorch's caching allocator had allocated on `device` since the last reset (0 on the
// CPU, where allocations are counted by stage/allocation_counter.h instead), and the reset.
int64_t device_peak_allocated_bytes(const torch::Device& device);
void reset_device_peak_allocated_bytes(const torch::Device& device);
// Bytes LibTorch's caching allocator has allocated on `device` now, every thread's (0 on the CPU).
// Blocks are rounded up by the allocator (to 512 bytes), so small tensors count a little more.
int64_t device_allocated_bytes(const torch::Device& device);

// Counts the CUDA caching allocator's allocations into the AllocationCounter of the allocating
// thread's active CountAllocations guard (stage/allocation_counter.h), as the CPU's are, through
// the allocator's trace callbacks: a block counts from its allocation until its free is asked for,
// whichever thread frees it. Started once per process by the first call on a CUDA device;
// returns whether CUDA allocations are counted: false without CUDA, and with an allocator backend
// that has no trace callbacks (cudaMallocAsync). Allocations of other threads (another rank's,
// a sender's copy into this device) are not counted.
bool count_device_allocations(const torch::Device& device);
// The bytes of the CUDA block at `data` if `counter` counted its allocation, else 0.
int64_t device_counted_bytes(const void* data,
                             const std::shared_ptr<std::atomic<int64_t>>& counter);

// Seconds that `calls` runs of `body` take on `device`. On a CUDA device: the time between two
// CUDA events recorded on the calling thread's current stream before and after the runs, waiting
// for the second -- what the GPU spent, not the time the host took to queue the kernels (which
// is all a host clock sees of asynchronous work). On the CPU: wall-clock time.
// REQUIRES: calls >= 1; `body` queues its work on the current stream.
double time_on_device(const torch::Device& device, int calls, const std::function<void()>& body);

// What `device` is: a CUDA device's name as the driver reports it ("NVIDIA H100 80GB HBM3"), "cpu"
// for the CPU.
std::string device_name(const torch::Device& device);

// The state of the random number generator of `device` (undefined tensor for CPU: the CPU
// generator is handled by the stage itself), and its restore.
torch::Tensor device_rng_state(const torch::Device& device);
void set_device_rng_state(const torch::Device& device, const torch::Tensor& state);

}  // namespace pipetrain
