// Sharded checkpoints: every rank writes what it owns into a file of its own, no rank gathers
// another's state, and a run of any layout reads back only the parts it needs.
//
//   DIR/latest                        "step-8": the last complete checkpoint
//   DIR/step-8/index.json             every global tensor's dtype, shape and stored pieces
//   DIR/step-8/rank-00000.safetensors (io/shard_index.h), the trainer's state, the layout
//   DIR/step-8/rank-00001.safetensors
//
// Who writes what (rank_pieces): a tensor-parallel rank its slice of each split tensor (a slice
// or a whole tensor several tp ranks hold: the first of them); of that, a data-parallel replica
// its share -- under ZeRO its own shard of the parameters and of the optimizer state (the
// optimizer's OwnedSlice), otherwise the d-th of `replicas` equal runs of the elements. Every
// element of the model and of its optimizer state is written once, by one rank, from where it
// lives (no copy on the CPU; a GPU tensor through one host buffer, the size of the largest piece).
// Tensor names in the index: "param/<name>", "buffer/<name>", "optim/<name>/<field>",
// "rng/torch", "rng/stage/<j>".
//
// Atomic (save_sharded, on every rank together): the pieces go into DIR/step-N.tmp/, each file
// written under a temporary name, fsynced and renamed; when every rank has written, one rank writes
// the index, renames the directory to DIR/step-N, fsyncs DIR and only then points DIR/latest at
// it. A crash at any moment leaves the previous complete checkpoint named by `latest`.
//
// Reading (ShardedCheckpoint): the index is parsed and checked first; the files are mapped, and a
// region is assembled from the pieces that hold some of it, each piece's CRC-32 checked when it is
// first read. read_rank_checkpoint gives a rank of any layout (pp, tp, dp, ZeRO stage, schedule)
// its own tensors in the form restore_model / restore_optimizer / ShardedOptimizer::restore take.
//
// Errors: io::ShardIndexError (a FileError: CLI exit 2) naming the file and tensor for a broken
// index, a missing or truncated file, a checksum mismatch, a tensor the model lacks or needs.
//
// Thread-safety: ShardedCheckpoint's reads are safe from several threads; the rest is called by
// the training loop's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/arg.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "pipetrain/io/shard_index.h"
#include "pipetrain/train/checkpoint.h"

namespace pipetrain::train {

// One piece a rank writes: `values` (region.elements() of them, on any device, any layout; their
// dtype is what is stored) of the global tensor `name` of shape `shape`.
struct ShardPieceSource {
  std::string name;
  std::vector<int64_t> shape;
  io::ShardRegion region;
  torch::Tensor values;
};

// What write_shard_file wrote: the pieces as the index lists them (file 0), the file's bytes, and
// the host buffer it needed (0 when every piece was a contiguous CPU tensor).
struct ShardFileWritten {
  std::map<std::string, io::ShardTensor> tensors;
  uint64_t bytes = 0;
  int64_t buffer_bytes = 0;
};

// Writes `pieces` as the safetensors file `path` (flat 1-D entries "<name>#<k>"), through a
// temporary name in the same directory, fsynced, then renamed; one piece at a time. Throws
// FileError naming the path.
// `after_piece(i, bytes)`, when given, is called after piece i is written (bytes so far).
ShardFileWritten write_shard_file(
    const std::string& path, const std::vector<ShardPieceSource>& pieces,
    const std::function<void(size_t piece, uint64_t bytes)>& after_piece = {});

// Where a rank's tensors lie in the global ones, and which of their elements it writes.
struct ShardPlacement {
  TensorParallelSlice tensor_parallel;  // how names are cut; this rank's place in its group
  int replica = 0;                      // data-parallel replica, of `replicas`
  int replicas = 1;
  // Expert parallelism: experts (parallel::is_expert_parameter) are held by the replicas with
  // one replica % expert_parallel, which share their writing.
  int expert_parallel = 1;
};

// The box of the global tensor that a rank holding `local` sizes of `name` holds, the global
// shape, and whether this rank is the one of its tensor-parallel group that writes it.
struct TensorBox {
  std::vector<int64_t> shape;
  io::ShardRegion region;
  bool writer = true;
};
TensorBox tensor_box(const TensorParallelSlice& slice, const std::string& name,
                     c10::IntArrayRef local);

// A ZeRO optimizer's share of the rank: per parameter name, elements [offset, offset + numel) of
// the parameter, their values and the optimizer's fields over them (ShardedOptimizer::OwnedSlice;
// no elements for a parameter the optimizer holds wholly on other replicas).
struct OwnedElements {
  std::string name;
  int64_t offset = 0;
  torch::Tensor values;
  std::map<std::string, torch::Tensor> state;
};

// The pieces this rank writes of `part` (its parameters, buffers, optimizer state and stage RNG
// streams, views or copies alike) and, under ZeRO, of `owned` (which then stand for the
// parameters and the optimizer state of the names they cover). `main`: the rank that writes the
// torch generator's state.
std::vector<ShardPieceSource> rank_pieces(const Checkpoint& part,
                                          const std::vector<OwnedElements>& owned,
                                          const ShardPlacement& placement, bool main);

// DIR/step-N, and the checkpoint a path names: a directory holding index.json, or one holding
// `latest` (the directory it names); nullopt for anything but a directory (a file: today's single
// file). A directory holding neither throws CheckpointError saying what it holds instead: the
// writes that were interrupted ("'DIR' holds no complete checkpoint: the write of step 1 was
// interrupted (DIR/step-1.tmp), ..."), complete step-N directories no `latest` names, a
// checkpoint.pt.
std::string sharded_step_directory(const std::string& directory, int64_t step);
std::optional<std::string> resolve_sharded_checkpoint(const std::string& path);

// The index of the checkpoint whose rank files are `files` (name, what write_shard_file returned
// there, in any order), checked: every element of every tensor once.
io::ShardIndex make_shard_index(
    const std::vector<std::pair<std::string, std::map<std::string, io::ShardTensor>>>& files,
    nlohmann::json state, nlohmann::json layout);
// After every rank's file is in `partial` (DIR/step-N.tmp): writes the index there, renames it to
// DIR/step-N (replacing one of that name), points DIR/latest at it, and removes the oldest
// complete checkpoints beyond `keep` (0: none) and leftovers of interrupted saves.
void commit_sharded_checkpoint(const std::string& directory, int64_t step,
                               const std::string& partial, const io::ShardIndex& index, int keep);

class ShardedCheckpoint {
 public:
  // `directory`: DIR/step-N, or DIR (its `latest`). Throws FileError when there is no index,
  // ShardIndexError when it is broken or a file it names is missing or shorter than its pieces.
  static ShardedCheckpoint open(const std::string& directory);

  const io::ShardIndex& index() const;
  const std::string& directory() const;
  bool contains(const std::string& name) const;
  // `region` of tensor `name`, flat, in its stored dtype, on the CPU. Throws ShardIndexError for
  // a tensor the index lacks or a piece whose bytes differ from its checksum.
  torch::Tensor read(const std::string& name, const io::ShardRegion& region) const;
  torch::Tensor read_whole(const std::string& name) const;  // in the tensor's shape

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// A rank's part of a checkpoint: for every parameter and buffer of `parameters` / `buffers` its
// tensor-parallel box (a meta tensor: checked against the index, not read), the optimizer state
// of those names, the position, the RNG streams, the loader state and the metadata. Throws
// ShardIndexError for a tensor missing, of another shape, or in the checkpoint but not the model.
// With `optimizer_state_by_range`, the optimizer state of the box is not read: its tensors are
// meta tensors, and Checkpoint::optimizer_range reads (mapped, checksummed) the ranges that the
// rank's ZeRO shard keeps when the sharded optimizer restores (1/dp of it, not the whole box).
Checkpoint read_rank_checkpoint(const ShardedCheckpoint& checkpoint, const NamedTensors& parameters,
                                const NamedTensors& buffers, const TensorParallelSlice& slice = {},
                                bool optimizer_state_by_range = false);
// Everything, whole (one process reading it all: eval, export, a test).
Checkpoint read_whole_checkpoint(const ShardedCheckpoint& checkpoint);

// load_for_resume for either format: a sharded checkpoint (a directory: read_rank_checkpoint of
// `model`'s tensors) or today's single file.
// `optimizer_state_by_range` as read_rank_checkpoint's (a ZeRO run; a single file is read whole).
Checkpoint resume_checkpoint(const std::string& path, torch::nn::Module& model,
                             const std::string& optimizer, const TensorParallelSlice& slice = {},
                             bool optimizer_state_by_range = false);
// load_checkpoint for either format (whole).
Checkpoint load_any_checkpoint(const std::string& path);

// A tensor of a safetensors export (a Hugging Face checkpoint) made from a sharded checkpoint: the
// name it is written under, the checkpoint's tensor it is made of ("param/<name>"), and the shape
// both must have.
struct ExportedTensor {
  std::string name;
  std::string source;
  std::vector<int64_t> shape;
};

struct SafetensorsExportOptions {
  /// The dtype written. Default float32.
  TORCH_ARG(torch::Dtype, dtype) = torch::kFloat32;
  /// The largest shard file (io/safetensors.h). Default 5 GB.
  TORCH_ARG(int64_t, max_shard_bytes) = 5'000'000'000;
  /// This writer, of `parts` writing the export together (a process of a run): it writes shard
  /// files s with s % parts == part, and shards are cut at most total / parts bytes so that each
  /// part has some. Default one part.
  TORCH_ARG(int, part) = 0;
  TORCH_ARG(int, parts) = 1;
  /// Checkpoint parameters that are left out on purpose (a tied head): any other "param/" tensor
  /// of the checkpoint that `tensors` does not name is refused.
  TORCH_ARG(std::vector<std::string>, unexported) = {};
};

// Writes this part's shard files of `tensors` into `directory` (made when missing), each tensor
// read from `checkpoint` when its turn comes and converted to the dtype: memory is the largest
// tensor (and its conversion), never a shard. Every part checks the whole list first: a source
// missing or of another shape, or a parameter of the checkpoint neither exported nor unexported,
// is a ShardIndexError naming the index and the tensor. Returns the files written.
std::vector<std::string> export_safetensors_part(const ShardedCheckpoint& checkpoint,
                                                 const std::string& directory,
                                                 const std::vector<ExportedTensor>& tensors,
                                                 const SafetensorsExportOptions& options);
// After every part has written (called once): the index (more than one shard) and stale files
// removed, as io::finish_safetensors_checkpoint.
void finish_safetensors_export(const std::string& directory,
                               const std::vector<ExportedTensor>& tensors,
                               const SafetensorsExportOptions& options);
// Every file of the export (the shards, then the index when there is one).
std::vector<std::string> safetensors_export_files(const std::vector<ExportedTensor>& tensors,
                                                  const SafetensorsExportOptions& options);

// What `checkpoint-info` prints: format, step, the layout it was written at, tensors by kind,
// bytes by file; read from the index alone.
std::string describe_sharded_checkpoint(const std::string& path);

}  // namespace pipetrain::train
