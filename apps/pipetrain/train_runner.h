// TrainRunner: one training step of `pipetrain train`, whatever runs it -- plain sequential
// training, the in-process Pipe (worker thread per rank), or one rank of a multi-process
// DistributedPipe. The training loop (train.cpp) talks only to this interface, so epochs,
// evaluation, checkpoints, clipping, tracing and progress are written once.
//
//   loop (every rank)                      runner
//   -----------------                      ------
//   zero grads, set lr                     step(x, y)            -> loss of the whole mini-batch
//   clip                                   grad_norm_squared()   -> summed over every rank
//   optimizer.step()                       parameters()          (this rank's, each tensor once)
//   checkpoint / evaluate                  gather(part)          -> every rank's part, merged,
//                                                                   on the main rank
//
// Thread-safety: used by the training loop's thread only.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pipetrain/runtime/distributed.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/train/checkpoint.h"
#include "train_setup.h"
#include "train_trace.h"

namespace pipetrain::cli {

class TrainRunner {
 public:
  virtual ~TrainRunner() = default;

  // Forward + backward of one mini-batch (gradients accumulate into .grad()); returns its loss,
  // the same value on every rank.
  virtual double step(const torch::Tensor& inputs, const torch::Tensor& targets) = 0;
  // This rank's parameters, each tensor once (for the optimizer and clipping).
  virtual std::vector<torch::Tensor> parameters() = 0;
  // This rank's parameters and buffers under the full model's names.
  virtual train::NamedTensors named_parameters() = 0;
  virtual train::NamedTensors named_buffers() = 0;
  // Squared global L2 norm of every gradient of the model (each tensor counted once).
  virtual double grad_norm_squared() = 0;
  // Events of the last step, relative to its start, and the rank to file them under (-1: keep).
  virtual std::vector<ActionEvent> last_events() = 0;
  virtual int event_rank() const { return -1; }
  // Pipeline ranks drawn in the trace (rows).
  virtual int trace_rows() const = 0;
  virtual std::string description() const = 0;
  // True on the rank that prints, evaluates and writes files.
  virtual bool is_main() const { return true; }
  // Every rank passes its part; the main rank gets them merged, other ranks nullopt.
  virtual std::optional<train::Checkpoint> gather(const train::Checkpoint& part) { return part; }
  // Every rank passes its events; the main rank gets them merged.
  virtual EventLog gather_events(const EventLog& mine) { return mine; }
  // Sum of `value` over every rank (a collective in a multi-process run).
  virtual double sum_over_ranks(double value) { return value; }
};

// Sequential (no pipeline) training of `model`: forward, loss, backward on the whole batch.
std::unique_ptr<TrainRunner> make_sequential_runner(BuiltModel& model);

// The in-process Pipe over `model.sequential` (batch norms already deferred by the caller).
// `checkpoint` names the recompute policy for the description.
std::unique_ptr<TrainRunner> make_pipe_runner(BuiltModel& model, const PipeOptions& options,
                                              const std::string& checkpoint);

// One rank of a multi-process run over `model.sequential` (every rank builds the same model).
std::unique_ptr<TrainRunner> make_distributed_runner(Distributed& distributed, BuiltModel& model,
                                                     const PipeOptions& options,
                                                     const std::string& description);

}  // namespace pipetrain::cli
