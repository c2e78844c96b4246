// StageParameterHooks: what a stage tells the owner of its parameters while it computes, layer by
// layer: ZeRO-3 by unit gathers a layer's parameters before they are used and frees them after,
// and ZeRO-2/3 take each micro-batch's weight gradients as they are made
// (train/sharded_optimizer.h).
//
// With hooks installed (Stage::set_parameter_hooks) a stage records every training forward for a
// split backward (stage.h: segments of layers, each ending at a layer with parameters), and its
// backward B runs segment by segment from the last: the segment's input gradients (I) and at once
// its weight gradients (W), so that one layer's parameters are in use at a time:
//
//   forward, recompute       for each layer l with parameters, in order:
//                              acquire(j, l)   the layer runs   release(j, l)
//   B (one segment at once)  for each segment k from the last, its layer l with parameters:
//                              acquire(j, l)  I of k, W of k  gradients(j, l, ...)  release(j, l)
//   I                        the same from the last, without W and gradients
//   W                        for each segment k from the first: acquire, W, gradients, release
//
// Every call happens on the thread that drives the stage, in this order, which is the same on
// every data-parallel replica of the rank (they run the same schedule on the same layers).
#pragma once

#include <cstddef>
#include <vector>

#include <torch/types.h>

#include "pipetrain/schedule/checkpoint_mode.h"
#include "pipetrain/schedule/schedule.h"

namespace pipetrain {

class StageParameterHooks {
 public:
  virtual ~StageParameterHooks() = default;
  // A training step of `s` begins on rank r (what the uses of the step will be: the schedule's
  // actions, and which micro-batches recompute under `checkpoint`). Default: nothing.
  virtual void begin_step(const schedule::Schedule& s, int r, Checkpoint checkpoint) {
    (void)s;
    (void)r;
    (void)checkpoint;
  }
  // Layer l of stage j (its index in the stage) is about to compute with its parameters, or has
  // finished with them for now.
  virtual void acquire(int j, std::size_t l) = 0;
  virtual void release(int j, std::size_t l) = 0;
  // Layer l's weight gradients of one micro-batch, `grads[p]` for `parameters[p]` (undefined
  // where no gradient reached it). The hooks take what they want: an entry they leave defined is
  // accumulated into its parameter's .grad() by the stage, as without hooks.
  virtual void gradients(int j, std::size_t l, const std::vector<torch::Tensor>& parameters,
                         std::vector<torch::Tensor>& grads) = 0;
  // Whether gradients(j, l, ...) may take `parameter`'s gradient. One it never takes the stage
  // may let the backward add into .grad() directly (stage/in_place_gradients.h): it then reaches
  // gradients() undefined. Default: every gradient may be taken.
  virtual bool takes_gradient(int j, std::size_t l, const torch::Tensor& parameter) const {
    (void)j;
    (void)l;
    (void)parameter;
    return true;
  }
};

}  // namespace pipetrain
