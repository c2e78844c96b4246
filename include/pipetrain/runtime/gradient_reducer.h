// GradientReducer: the data-parallel gradient sum of one pipeline rank, started stage by stage
// while the pipeline still runs (PipeOptions::overlap_gradient_reduction; DDP's buckets, for a
// pipeline).
//
//   step:   F F F B B ... [stage 3's last B] ... [stage 1's last B/W]  | finish()
//   comm:                  start(stage 3) ---- all-reduce ---->          wait, copy back
//                                           start(stage 1) -- all-reduce -->
//
// start(params) groups the parameters, whose gradients are final for this step, into buckets of
// at most bucket_bytes (in the order given; a parameter larger than that is a bucket of its own;
// one dtype per bucket); each bucket's gradients are packed into one flat tensor and an
// all-reduce of it starts over the data-parallel group (C10dGroup::allreduce_sum_start: Gloo's or
// NCCL's own threads carry it). finish() waits for every bucket and writes the sums into the
// gradients. The sum of each element is the same sum as one blocking all-reduce of everything
// (Distributed::allreduce_gradients) makes; with two replicas it is the same bits.
//
// The communication thread: where a start()'s parameters are all on the CPU, the packing (a copy
// of every gradient: 7.5 ms for 16 MB on one core of a 2-core machine) and the collective's start
// run on the reducer's own CommunicationThread (runtime/communication_thread.h), in the order
// start() was called, and start() returns at once: the rank's next action does not wait for them.
// A start() of CUDA parameters packs on the calling thread (an asynchronous copy on its stream)
// after the thread's queue has drained, so the collectives keep their order and the two threads
// never issue one at the same time (C10dGroup: one thread at a time per group). Between the first
// start() and finish() the caller issues no other collective on the group.
//
// exposed: what finish() waited, the communication left after the pipeline's last action.
//
// Thread-safety: one caller thread (the rank's interpreter); the reducer's own thread is internal.
// A packing failure is thrown by finish(). Collective: every replica of the pipeline rank starts
// the same buckets in the same order (they run the same schedule).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <torch/types.h>

#include "pipetrain/runtime/collective_log.h"
#include "pipetrain/runtime/communication_thread.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain {

// The gradients of `parameters` (of one dtype) packed end to end into one flat tensor on `device`
// (where the group sums: C10dGroup::collective_device); an undefined gradient packs as zeros.
torch::Tensor pack_gradients(const std::vector<torch::Tensor>& parameters,
                             const torch::Device& device);
// The summed `flat` (pack_gradients' layout) written back into `parameters`' gradients, on their
// devices; an undefined gradient receives its piece.
void unpack_gradients(const std::vector<torch::Tensor>& parameters, const torch::Tensor& flat);

// `tensors` cut, in order, into buckets of at most `bucket_bytes` (a tensor larger than that is a
// bucket of its own) and of one dtype each: GradientReducer's buckets, and the segments the ZeRO
// optimizer reduce-scatters under the overlap (train/sharded_optimizer.h).
std::vector<std::vector<torch::Tensor>> cut_into_buckets(const std::vector<torch::Tensor>& tensors,
                                                         std::int64_t bucket_bytes);

class GradientReducer {
 public:
  // REQUIRES: group non-null; bucket_bytes >= 1. `log` (optional, outliving the reducer) gets
  // each bucket's all-reduce, from its start to finish()'s wait.
  GradientReducer(std::shared_ptr<C10dGroup> group, std::int64_t bucket_bytes,
                  CollectiveLog* log = nullptr);
  // Lets the thread finish what it packs (unwaited buckets are dropped).
  ~GradientReducer() = default;
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Starts the sum of `parameters`' gradients (an undefined gradient counts as zeros and
  // receives the sum); `stage`: whose they are, for the log (-1: several).
  void start(const std::vector<torch::Tensor>& parameters, int stage = -1);
  // Waits for every bucket started since the last finish() and writes the sums back. Returns
  // the seconds it waited.
  double finish();

  int buckets_started() const { return started_; }
  // Bytes of the flat copies of the buckets started since the last finish() (in flight together
  // until it).
  std::int64_t pending_bytes() const { return started_bytes_; }

 private:
  struct Bucket {
    std::vector<torch::Tensor> parameters;
    std::vector<torch::Tensor> flat;  // one tensor: the packed gradients, summed in place
    std::function<void()> wait;
    int stage = -1;
    double start_us = 0;
  };
  Bucket launch(std::vector<torch::Tensor> parameters, int stage) const;
  void submit(std::vector<torch::Tensor> parameters, int stage);

  std::shared_ptr<C10dGroup> group_;
  std::int64_t bucket_bytes_;
  CollectiveLog* log_ = nullptr;
  int started_ = 0;
  std::int64_t started_bytes_ = 0;
  // Written by the thread's jobs (and by CUDA start()s after a drain); read after a drain.
  std::vector<Bucket> pending_;
  CommunicationThread thread_;  // last: it ends, and its jobs with it, before pending_ goes
};

}  // namespace pipetrain
