// Checkpoint: everything needed to resume training exactly, keyed by parameter NAME.
//
// Contents: named parameters and buffers, the optimizer's per-parameter state (by parameter
// name: exp_avg / exp_avg_sq / step for adam and adamw, momentum_buffer for sgd), the position
// (global step, epoch, batch index within the epoch), the torch CPU generator state, the random
// stream of every pipeline stage (its dropout masks: Pipe::stage_rng_states()), the data
// loader's state (an opaque string), and a JSON metadata blob (model name, options, ...).
//
// Names are the global names of the full model (`sequential->named_parameters()`, e.g.
// "3.weight"), so a checkpoint written by a run with S stages (each stage capturing its own
// names, merged with merge_checkpoint) restores into a run with any other number of stages: each
// stage restores the names it holds (NameMatch::kSubset).
//
// File format: one torch pickle (torch::pickle_save, the zip format of Python's torch.save) of a
// dict {"format": "pipetrain-checkpoint", "version": 1, "parameters": {name: Tensor},
// "buffers": {name: Tensor}, "optimizer": str, "optimizer_state": {name: {field: Tensor}},
// "step": int, "epoch": int, "batch": int, "torch_rng_state": uint8 Tensor, "loader_state": str,
// "metadata": JSON text, "stage_rng_states": {"<stage>": uint8 Tensor}} (the last may be absent:
// files written before it existed load with no stage streams). Python reads it with
// `torch.load(path)`. Files are written atomically (atomic_file.h): a failed save leaves the
// previous checkpoint intact.
//
// Dtypes: a saved tensor converts into a live one of another dtype when no value rounds (float32
// into float64, bfloat16 into float32); one that would round (float64 into float32) is a
// CheckpointError naming it. Every precision of a run keeps float32 master weights and optimizer
// state, so checkpoints move between fp32, bf16 and fp16 runs as they are.
//
// Ownership: a Checkpoint holds detached CPU copies, independent of the model. Thread-safety:
// plain value; the capture/restore functions must not run concurrently with training steps.
//
// Example (one process):
//   Checkpoint c;
//   capture_model(c, *model);  capture_optimizer(c, *optimizer, model->named_parameters());
//   capture_torch_rng(c);  c.step = k;  c.epoch = e;  c.batch = b;  c.metadata = {...};
//   save_checkpoint("run.ckpt", c);
//   ...
//   Checkpoint r = load_checkpoint("run.ckpt");
//   restore_model(r, *model);  restore_optimizer(r, *optimizer, model->named_parameters());
//   restore_torch_rng(r);  loader.seek({r.epoch, r.batch});
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "pipetrain/base/error.h"
#include "pipetrain/parallel/tensor_split.h"

namespace pipetrain::train {

// A checkpoint that cannot be used: not a checkpoint, or names/shapes that do not fit the model.
// User input: CLI exit code 2.
class CheckpointError : public BadInput {
 public:
  using BadInput::BadInput;
};

using NamedTensors = torch::OrderedDict<std::string, torch::Tensor>;

struct Checkpoint {
  std::map<std::string, torch::Tensor> parameters;
  std::map<std::string, torch::Tensor> buffers;
  std::string optimizer;  // optimizer_name(): "sgd", "adam", "adamw"; "" when none captured
  std::map<std::string, std::map<std::string, torch::Tensor>> optimizer_state;
  int64_t step = 0;   // optimizer steps done
  int64_t epoch = 0;  // the next batch to train is (epoch, batch)
  int64_t batch = 0;
  torch::Tensor torch_rng_state;  // undefined when not captured
  // Random stream of pipeline stage j (StageRng::state()), for the stages that were captured.
  // They restore exactly only into the same stage layout (the same balance): a stage index of
  // another layout holds other layers.
  std::map<int, torch::Tensor> stage_rng_states;
  std::string loader_state;
  nlohmann::json metadata = nlohmann::json::object();
  // Optimizer state read by range (a sharded checkpoint resumed by a ZeRO rank, which keeps 1/dp
  // of it): where this is set, a tensor of optimizer_state may be a meta tensor (its shape and
  // dtype only), and optimizer_range(parameter, field, begin, length) reads elements [begin,
  // begin + length) of that tensor flattened, as a 1-D CPU tensor. restore_optimizer and the
  // sharded optimizer's restore read through it what they keep.
  std::function<torch::Tensor(const std::string& parameter, const std::string& field, int64_t begin,
                              int64_t length)>
      optimizer_range;
};

// The value of checkpoint.optimizer_state[parameter][field]: the tensor itself, or, when it is a
// meta tensor, all of it read through optimizer_range (CheckpointError without one).
torch::Tensor optimizer_state_value(const Checkpoint& checkpoint, const std::string& parameter,
                                    const std::string& field);

// ---- capture ---------------------------------------------------------------------------------
void capture_model(Checkpoint& checkpoint, const NamedTensors& parameters,
                   const NamedTensors& buffers);
void capture_model(Checkpoint& checkpoint, const torch::nn::Module& model);
// `parameters` names the optimizer's tensors (any superset is fine). Throws CheckpointError for
// an optimizer that is not sgd/adam/adamw.
void capture_optimizer(Checkpoint& checkpoint, const torch::optim::Optimizer& optimizer,
                       const NamedTensors& parameters);
// The same without copies: the optimizer's live state tensors (detached, where they live; "step"
// a new scalar), for writing them out as they are (train/sharded_checkpoint.h). They change with
// the next step.
void capture_optimizer_views(Checkpoint& checkpoint, const torch::optim::Optimizer& optimizer,
                             const NamedTensors& parameters);
void capture_torch_rng(Checkpoint& checkpoint);

// Adds the names of `part` to `into` (multi-process: each rank captures its stages, one rank
// merges). A name present in both must hold equal tensors (tied weights), else CheckpointError.
// Position, RNG, loader state and metadata are taken from `part` where `into` has none.
void merge_checkpoint(Checkpoint& into, const Checkpoint& part);

// ---- files -----------------------------------------------------------------------------------
// Atomic; throws FileError (atomic_file.h) naming the path on an I/O failure.
void save_checkpoint(const std::string& path, const Checkpoint& checkpoint);
// Throws FileError when unreadable, CheckpointError when it is not a pipetrain checkpoint.
Checkpoint load_checkpoint(const std::string& path);
// The same without a file, for sending a checkpoint part between processes.
std::string serialize_checkpoint(const Checkpoint& checkpoint);
Checkpoint deserialize_checkpoint(const std::string& bytes, const std::string& source);
// The parameters of `checkpoint`, in `model`'s order (named_parameters()), as a tensor file
// (runtime/tensor_io.h), readable by torch.load in Python; then, by name, the routed experts
// the checkpoint holds and `model` does not (under expert parallelism a rank's model registers its
// own experts only; parallel::is_expert_parameter). Returns how many it wrote. Throws
// CheckpointError naming a parameter of the model the checkpoint lacks; FileError on I/O.
size_t save_parameters(const std::string& path, const Checkpoint& checkpoint,
                       const torch::nn::Module& model);

// ---- restore ---------------------------------------------------------------------------------
enum class NameMatch {
  kExact,   // the checkpoint and the model hold exactly the same names
  kSubset,  // the model's names must all be in the checkpoint; others are ignored (one stage)
};

// Copies tensors by name. Throws CheckpointError listing missing names (in the model, not in the
// checkpoint), unexpected names (kExact only) and shape mismatches (name, both shapes). A model
// tensor on the meta device (a placeholder of an entry another rank holds) is checked, not filled.
void restore_model(const Checkpoint& checkpoint, const NamedTensors& parameters,
                   const NamedTensors& buffers, NameMatch match = NameMatch::kExact);
void restore_model(const Checkpoint& checkpoint, torch::nn::Module& model,
                   NameMatch match = NameMatch::kExact);
// A tensor-parallel rank's view of a whole checkpoint: how the model cuts parameter `name`
// (nullopt: whole), and this rank's place in the group. The default: no split.
struct TensorParallelSlice {
  std::function<std::optional<parallel::TensorSplit>(const std::string& name)> split;
  int rank = 0;
  int size = 1;
};
// Keeps rank `slice.rank`'s part of every split parameter and of its optimizer state of the same
// shape (a whole checkpoint, as every run writes, restores into a model of any tp). Throws
// CheckpointError naming the tensor when tp does not divide its dimension.
void keep_tensor_parallel_slice(Checkpoint& checkpoint, const TensorParallelSlice& slice);

// What a run that resumes from `path` starts with: the checkpoint read (and, for a
// tensor-parallel model, `slice`d), its parameters and buffers restored into `model` (every name,
// NameMatch::kExact), its optimizer checked against the run's `optimizer` ("adam", ...). Throws
// FileError when unreadable, CheckpointError when it does not fit the model or was written with
// another optimizer.
Checkpoint load_for_resume(const std::string& path, torch::nn::Module& model,
                           const std::string& optimizer, const TensorParallelSlice& slice = {});

// Rebuilds the optimizer's per-parameter state for every name in `parameters` that the
// checkpoint has state for. Throws CheckpointError when the optimizer type differs from the
// checkpoint's or a state tensor's shape does not fit.
void restore_optimizer(const Checkpoint& checkpoint, torch::optim::Optimizer& optimizer,
                       const NamedTensors& parameters);
// REQUIRES a captured RNG state (throws CheckpointError otherwise).
void restore_torch_rng(const Checkpoint& checkpoint);

}  // namespace pipetrain::train
