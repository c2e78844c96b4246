// Skip connections that may cross stage boundaries, and the recompute flag.
//
// Inside a layer's forward, stash(name, t) hands t to a later layer, which takes it with
// pop(name). The later layer may sit on another stage: the runtime carries every tensor that was
// stashed but not yet popped across each boundary it passes, and gradients flow back through it.
// Each name is stashed once and popped once per micro-batch.
//
// The calls act on the skip context of the calling thread. The pipeline runtime installs one per
// (stage, micro-batch) around each forward and recompute. Outside the runtime (plain sequential
// execution of the same layers, e.g. `sequential->forward(x)`) a per-thread default context is
// used, so a model with skips runs unchanged with or without a pipeline.
//
// Thread-safety: every function acts on thread-local state only.
#pragma once

#include <map>
#include <string>

#include <torch/types.h>

namespace pipetrain {

// REQUIRES: `name` is not already stashed and unpopped in the current context.
void stash(const std::string& name, torch::Tensor tensor);

// REQUIRES: `name` was stashed earlier in the same micro-batch (this or an earlier stage).
// Throws pipetrain::BadInput naming the missing skip and the names that are available.
torch::Tensor pop(const std::string& name);

// True while the runtime re-runs a forward to rebuild activations for backward (checkpointing).
// A layer may use it to avoid side effects twice, e.g. updating batch-norm running statistics.
bool is_recomputing();

// The skip context: tensors stashed and not yet popped, by name. The runtime swaps contexts per
// micro-batch; user code does not need this.
class SkipContext {
 public:
  std::map<std::string, torch::Tensor> pending;  // stashed, not yet popped
  bool recomputing = false;
};

// Installs `context` as the calling thread's skip context until destroyed (restores the previous).
class SkipContextGuard {
 public:
  explicit SkipContextGuard(SkipContext* context);
  ~SkipContextGuard();
  SkipContextGuard(const SkipContextGuard&) = delete;
  SkipContextGuard& operator=(const SkipContextGuard&) = delete;

 private:
  SkipContext* previous_;
};

}  // namespace pipetrain
