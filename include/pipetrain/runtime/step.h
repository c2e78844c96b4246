// What one training or inference step hands to the interpreter of every rank, and what each rank
// hands back: micro-batches, targets, the loss, the checkpoint policy, measured events.
//
// Thread-safety: StepData is read concurrently by all ranks' workers and never written during a
// step; each rank writes only its own RankResult.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "pipetrain/schedule/action.h"
#include "pipetrain/schedule/checkpoint_mode.h"

namespace pipetrain {

// The loss of one micro-batch: mean-reduced over its rows (like torch::mse_loss's default).
// The runtime weights it by rows(i) / rows(mini-batch) so gradients equal the full batch's.
using LossFn =
    std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;

struct StepData {
  int num_microbatches = 0;                        // M
  std::vector<std::vector<torch::Tensor>> inputs;  // [i]: stage 0's input tuple (rank of stage 0)
  std::vector<torch::Tensor> targets;              // [i]: on the last stage's device (training)
  std::vector<double> loss_weights;                // [i]: rows(i) / rows(mini-batch)
  const LossFn* loss_fn = nullptr;                 // training only
  bool training = true;                            // false: inference (no stash, no grad)
  Checkpoint checkpoint = Checkpoint::kNever;
  bool offload = false;  // checkpointed micro-batches' inputs wait in host memory (PipeOptions)
  std::chrono::steady_clock::time_point start;  // events are measured from here
  // Training: called with stage j after the rank's last action that adds to j's weight gradients
  // in this step (its last B or W), so that their reduction can start while the rest of the step
  // runs (runtime/gradient_reducer.h). Empty: not called.
  std::function<void(int stage)> on_stage_gradients;
};

// One executed action, for traces and timelines.
struct ActionEvent {
  int rank = 0;
  schedule::Action action;
  double start_us = 0;  // microseconds since StepData::start
  double end_us = 0;
};

struct RankResult {
  std::vector<torch::Tensor> losses;                // [i]: weighted, detached (last stage's rank)
  std::vector<std::vector<torch::Tensor>> outputs;  // [i]: inference outputs (last stage's rank)
  std::vector<ActionEvent> events;
};

}  // namespace pipetrain
