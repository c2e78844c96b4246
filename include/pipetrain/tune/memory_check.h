// The memory check `pipetrain train` makes before it starts a run (train/memory_fit.h): the
// memory model's prediction for the run, from a model built whole in this process or, for a
// Llama-family model not built here, from its config (models/llama_profile.h: one decoder layer
// stands for each, and its vocabulary tables profiled on 4096 rows and extended to the whole
// vocabulary), against what this machine has.
//
// Thread-safety: uses torch's intra-op threads to profile; not concurrently with training.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include "pipetrain/models/llama_config.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/train/memory_fit.h"
#include "pipetrain/train/memory_report.h"
#include "pipetrain/tune/zero_ladder.h"

namespace pipetrain::tune {

struct MemoryCheckInput {
  // The model: built here whole (`model`, `loss`), or a Llama-family config (`llama`) whose
  // entries this process does not hold (then the loss is causal_lm_loss).
  torch::nn::Sequential model{nullptr};
  LossFn loss;
  const models::LlamaConfig* llama = nullptr;
  int tensor_parallel = 1;  // with `llama`: the layers as one tensor-parallel rank holds them
  bool sequence_parallel = false;
  // With `llama`, a mixture: its experts as one expert-parallel rank holds them, the tokens it
  // gets as a mirror group of identical members sends them (C10dGroup::mirror).
  int expert_parallel = 1;
  // With expert_parallel > 1: the busiest rank's routed rows over the balanced share the MoE
  // layers' activations are planned for (models::apply_routing_imbalance); 1: balanced.
  double routing_imbalance = 1.0;
  // With `llama`: the attention as one context-parallel rank of this many runs it (a mirror
  // group), ring or Ulysses; `inputs` then hold each rank's tokens as rows of their own (every
  // row's T as context_parallel rows of T / context_parallel, job's modelled_batch).
  int context_parallel = 1;
  bool ulysses = false;
  // The first mini-batch every replica shares.
  torch::Tensor inputs, targets;
  PipeOptions pipe;
  train::MemoryRunOptions run;
  // The pipeline ranks each of the run's processes on this machine runs (train/memory_fit.h).
  std::vector<std::vector<int>> ranks_of_process;
  // --memory-limit: each rank's budget (the planner's reading), checked instead of what the
  // machine has (0).
  std::int64_t budget_per_rank = 0;
  // The evaluation the run makes between steps (a classifier's test split, a corpus's windows):
  // its largest batch, run by process `evaluation_process` with the whole model gathered there.
  // Undefined: the run evaluates nothing. A model built here only (`model`).
  torch::Tensor evaluation_inputs;
  int evaluation_process = 0;
};

// The most bytes a no-grad forward of `model` (in eval mode) holds at once on `inputs`, counted
// layer by layer as the profile counts a training forward (stage/allocation_counter.h): each
// layer's input and output, and what the layer still holds when it returns.
std::int64_t evaluation_forward_bytes(torch::nn::Sequential model, const torch::Tensor& inputs);

// The prediction (profiled once, then asked for each alternative: every ZeRO stage above the
// run's, with replicas; --checkpoint always; both) and the machine's memory, measured now.
// Throws what the memory model throws for a run it does not cover (BadInput).
train::MemoryFit check_run_memory(const MemoryCheckInput& input);

// DeepSpeed's ladder (tune/zero_ladder.h) on the same check: each rung's prediction of the run
// (its ZeRO stage and offloads applied to `input`) on this machine, the first that fits chosen
// (ZeroLadder::chosen; -1: none). Fits as check_run_memory decides: each rank within
// input.budget_per_rank where one is given, else the machine's need within what it has. The NVMe
// rung is tried only with `nvme_possible` (an offload directory given). The steps carry no plans
// (no step times): the run's own schedule is what is predicted.
ZeroLadder walk_memory_ladder(const MemoryCheckInput& input, bool nvme_possible);

}  // namespace pipetrain::tune
