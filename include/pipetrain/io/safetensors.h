// Safetensors checkpoints with LibTorch: reading tensors out of a Hugging Face checkpoint
// (one file, or shards with an index), memory-mapped, and writing one.
//
//   DIR/model.safetensors                      one file, or
//   DIR/model.safetensors.index.json           {"metadata": {"total_size": N},
//   DIR/model-00001-of-00003.safetensors        "weight_map": {"<tensor>": "<shard file>"}}
//   ...
//
// Reading: SafetensorsCheckpoint::open maps every file and checks every header
// (io/safetensors_format.h) and the index against the shards (each name in the file the index
// says, each shard's tensors in the index), so that a broken checkpoint fails before anything is
// built. load() copies one tensor out of its map, converting it to the dtype asked for: a rank that
// builds two stages of a 32-layer model reads the pages of those stages only. Every problem is a
// SafetensorsError naming the file and the tensor (CLI exit 2).
//
// Writing: write_safetensors_checkpoint lays the tensors out as Hugging Face does, one file when
// they fit max_shard_bytes, else numbered shards plus the index; each file is written to a
// temporary name and renamed (base/atomic_file.h), the index last, so a crash leaves either the
// old file or the new one under each name.
//
// Ownership: a SafetensorsCheckpoint owns its maps (shared between copies); loaded tensors own
// their memory. Thread-safety: load() is const and safe from several threads.
//
// Example:
//   auto checkpoint = io::SafetensorsCheckpoint::open("Llama-3.2-1B");
//   torch::Tensor embedding = checkpoint.load("model.embed_tokens.weight", torch::kFloat32);
//   io::write_safetensors_checkpoint("out", {{"w", embedding}});
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/arg.h>
#include <torch/types.h>

#include "pipetrain/io/mapped_file.h"
#include "pipetrain/io/safetensors_format.h"

namespace pipetrain::io {

// "model.safetensors", "model.safetensors.index.json".
extern const char* const kSafetensorsFile;
extern const char* const kSafetensorsIndexFile;

class SafetensorsCheckpoint {
 public:
  // `path`: a directory with model.safetensors or model.safetensors.index.json (and its shards),
  // or one .safetensors file. Throws FileError when nothing readable is there, SafetensorsError
  // for a broken header or index.
  static SafetensorsCheckpoint open(const std::string& path);

  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  // REQUIRES contains(name); throws SafetensorsError naming the checkpoint otherwise.
  const SafetensorsEntry& entry(const std::string& name) const;
  // The file that holds `name`.
  const std::string& file_of(const std::string& name) const;
  // A copy of tensor `name` as `dtype` on `device`. Throws SafetensorsError naming the file and
  // tensor for a dtype LibTorch has no counterpart of (U16, U32, U64, F8_*).
  torch::Tensor load(const std::string& name, torch::Dtype dtype,
                     const torch::Device& device = torch::kCPU) const;
  // Elements [start, start + length) of dimension `dim` of tensor `name`, copied as load copies:
  // only that part of the mapped bytes is read (a tensor-parallel rank's slice).
  torch::Tensor load_slice(const std::string& name, int64_t dim, int64_t start, int64_t length,
                           torch::Dtype dtype, const torch::Device& device = torch::kCPU) const;
  // What was opened (the directory or the file).
  const std::string& path() const { return path_; }
  // The files read (one, or the index's shards).
  std::vector<std::string> files() const;

 private:
  struct Shard {
    MappedFile file;
    SafetensorsHeader header;
  };
  struct Location {
    size_t shard = 0;
    size_t entry = 0;
  };

  std::string path_;
  std::vector<std::shared_ptr<const Shard>> shards_;
  std::map<std::string, Location> index_;
};

// The tensor dtype a safetensors dtype reads into unchanged (F32 -> kFloat32, ...); throws
// SafetensorsError for the formats pipetrain does not read as tensors.
torch::Dtype torch_dtype_of(SafetensorsDtype dtype, const std::string& file = "",
                            const std::string& tensor = "");
// The safetensors dtype of a torch dtype (kFloat32 -> F32, kBFloat16 -> BF16, ...).
SafetensorsDtype safetensors_dtype_of(torch::Dtype dtype);

using NamedTensorList = std::vector<std::pair<std::string, torch::Tensor>>;

struct SafetensorsWriteOptions {
  /// The largest shard: tensors that exceed it together go into numbered shards with an index.
  /// A tensor larger than it gets a shard of its own. Default 5 GB (huggingface_hub's).
  TORCH_ARG(int64_t, max_shard_bytes) = 5'000'000'000;
  /// Written into each file's __metadata__. Default {"format": "pt"}, as transformers writes.
  using Metadata = std::map<std::string, std::string>;
  TORCH_ARG(Metadata, metadata) = Metadata{{"format", "pt"}};
};

// Writes `tensors` (any device; each in its own dtype) into `directory` (made when missing) and
// returns the file names written, relative to it: model.safetensors, or the shards then the
// index. Shards are filled in the order given; within a file, wider element types come first so
// every tensor's data stays aligned. Throws FileError when a file cannot be written, BadInput for
// repeated names.
std::vector<std::string> write_safetensors_checkpoint(const std::string& directory,
                                                      const NamedTensorList& tensors,
                                                      const SafetensorsWriteOptions& options = {});

// One .safetensors file at `path`, atomically.
void write_safetensors_file(const std::string& path, const NamedTensorList& tensors,
                            const std::map<std::string, std::string>& metadata = {
                                {"format", "pt"}});

// A tensor of a file written streamed: its name, stored dtype and shape, known up front (the
// header comes first), and `values`, called once when its turn comes, that makes it (any device
// or dtype: converted to `dtype`; the shape must be `shape`).
struct StreamedTensor {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  std::function<torch::Tensor()> values;

  int64_t bytes() const;
};

// write_safetensors_file of tensors made one at a time, in the order given, each let go before
// the next is made: what is held is the largest tensor (and its conversion), not the file. The
// same layout rules (wider element types first) and atomic replacement. Throws BadInput when a
// made tensor's shape is not the one announced, FileError when the file cannot be written.
void write_safetensors_file_streamed(const std::string& path,
                                     const std::vector<StreamedTensor>& tensors,
                                     const std::map<std::string, std::string>& metadata = {
                                         {"format", "pt"}});

// How a checkpoint of tensors of `bytes` is cut into shard files (as write_safetensors_checkpoint
// does): the shard of each tensor, filled in order, a new one begun when the next tensor would
// pass `max_shard_bytes`. Shards are numbered from 0.
std::vector<size_t> plan_safetensors_shards(const std::vector<int64_t>& bytes,
                                            int64_t max_shard_bytes);
// The name of shard `shard` of `shards`: model.safetensors when there is one, else
// model-00001-of-00003.safetensors and so on.
std::string safetensors_shard_name(size_t shard, size_t shards);
// After every shard of a checkpoint is in `directory`: its index (model.safetensors.index.json,
// mapping each of `names` to the file of its shard in `plan`, with the total bytes) when there is
// more than one shard, and what an older save left that readers would take instead (a stale index
// or single file, shards of another count) removed. Returns the index's name, or nothing.
std::vector<std::string> finish_safetensors_checkpoint(const std::string& directory,
                                                       const std::vector<std::string>& names,
                                                       const std::vector<size_t>& plan,
                                                       int64_t total_bytes);

}  // namespace pipetrain::io
