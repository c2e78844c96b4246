// What one training or inference step hands to the interpreter of every rank, and what each rank
// hands back: micro-batches, targets, the loss, the checkpoint policy, measured events.
//
// Thread-safety: StepData is read concurrently by all ranks' workers and never written during a
// step; each rank writes only its own RankResult.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "pipetrain/data/sequence_layout.h"
#include "pipetrain/schedule/action.h"
#include "pipetrain/schedule/checkpoint_mode.h"
#include "pipetrain/schedule/residency.h"

namespace pipetrain {

// Stages' parameters that are whole only part of the time (ZeRO-3: train/sharded_optimizer.h
// frees them between uses). Called by the interpreter's thread of one rank, for its own stages.
class StageParameters {
 public:
  virtual ~StageParameters() = default;
  // Starts making stage j's parameters whole; nothing when they are, or when that has started.
  // Collective in order: every data-parallel replica of this rank starts the same stages in the
  // same order (they run the same schedule).
  virtual void start_gather(int j) = 0;
  // Returns once stage j's parameters are whole (starting their gather if need be).
  virtual void wait_gathered(int j) = 0;
  // Frees stage j's parameters' storage (their shapes stay).
  virtual void release(int j) = 0;
};

// The loss of one micro-batch: mean-reduced over its rows (like torch::mse_loss's default), or
// over what its rows weigh (data/batch.h: a language model's counted targets). The runtime
// weights it by weight(i) / weight(mini-batch) so gradients equal the full batch's.
using LossFn =
    std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;

struct StepData {
  int num_microbatches = 0;                        // M
  std::vector<std::vector<torch::Tensor>> inputs;  // [i]: stage 0's input tuple (rank of stage 0)
  std::vector<torch::Tensor> targets;              // [i]: on the last stage's device (training)
  // [i]: weight(i) / weight(mini-batch), the weights rows unless the batch gives its own
  // (data/batch.h: a language model's counted targets).
  std::vector<double> loss_weights;
  // [i]: micro-batch i's token layout (data/sequence_layout.h), installed around each of i's
  // actions on every rank; empty (or null entries): none.
  std::vector<std::shared_ptr<const data::SequenceLayout>> layouts;
  const LossFn* loss_fn = nullptr;  // training only
  bool training = true;             // false: inference (no stash, no grad)
  Checkpoint checkpoint = Checkpoint::kNever;
  bool offload = false;  // checkpointed micro-batches' inputs wait in host memory (PipeOptions)
  std::chrono::steady_clock::time_point start;  // events are measured from here
  // Training: called with stage j after the rank's last action that adds to j's weight gradients
  // in this step (its last B or W), or after the sends right behind it
  // (Schedule::gradient_sum_starts), so that their reduction can start while the rest of the
  // step runs (runtime/gradient_reducer.h). Empty: not called.
  std::function<void(int stage)> on_stage_gradients;
  // ZeRO-3: whole only around the actions that compute with them (schedule/residency.h): the
  // interpreter waits for `residency.steps[a].needs` before action a, and after it releases and
  // prefetches as the plan says. Null: every stage's parameters are always whole.
  StageParameters* parameters = nullptr;
  const schedule::ResidencyPlan* residency = nullptr;
};

// One executed action, for traces and timelines.
struct ActionEvent {
  int rank = 0;
  schedule::Action action;
  double start_us = 0;  // microseconds since StepData::start
  double end_us = 0;
  int lane = 0;  // the compute lane that ran it (parallel/lane.h): 1 beside a paired forward
};

struct RankResult {
  std::vector<torch::Tensor> losses;                // [i]: weighted, detached (last stage's rank)
  std::vector<std::vector<torch::Tensor>> outputs;  // [i]: inference outputs (last stage's rank)
  std::vector<ActionEvent> events;
};

}  // namespace pipetrain
