// Sharded checkpoints (pipetrain/train/sharded_checkpoint.h).
#include "pipetrain/train/sharded_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <sstream>

#include "pipetrain/base/atomic_file.h"
#include "pipetrain/base/check.h"
#include "pipetrain/io/mapped_file.h"
#include "pipetrain/io/safetensors.h"
#include "pipetrain/parallel/expert_parallel.h"

namespace pipetrain::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kLatestFile = "latest";

[[noreturn]] void fail(const std::string& path, const std::string& step, int error) {
  throw FileError("cannot write '" + path + "': " + step + ": " + std::strerror(error));
}

// Best effort where a file system cannot fsync a directory (EINVAL).
void sync_directory(const std::string& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) fail(directory, "open directory", errno);
  if (::fsync(fd) != 0 && errno != EINVAL) {
    const int error = errno;
    ::close(fd);
    fail(directory, "fsync of directory", error);
  }
  ::close(fd);
}

std::vector<int64_t> dims(c10::IntArrayRef sizes) {
  return sizes.vec();
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// The d-th of `replicas` runs of [0, n): [d n / R, (d + 1) n / R).
std::pair<int64_t, int64_t> share(int64_t n, int replica, int replicas) {
  return {n * replica / replicas, n * (replica + 1) / replicas};
}

int64_t parse_step_directory(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() <= 5) return -1;
  const std::string digits = name.substr(5);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return digits.size() > 18 ? -1 : std::stoll(digits);
}

// `directory` holds neither index.json nor `latest`: no checkpoint to read (as a file it is no
// torch pickle either). Says what is there instead: the writes that were interrupted (step-N.tmp,
// which a save leaves only when it did not finish), complete step-N directories that no `latest`
// names, a single-file checkpoint.
[[noreturn]] void throw_no_checkpoint_in(const std::string& directory) {
  std::vector<int64_t> interrupted, complete;
  std::error_code error;
  for (const auto& item : fs::directory_iterator(directory, error)) {
    const std::string name = item.path().filename().string();
    const bool partial = name.size() > 4 && name.substr(name.size() - 4) == ".tmp";
    const int64_t step = parse_step_directory(partial ? name.substr(0, name.size() - 4) : name);
    if (step < 0) continue;
    if (partial) {
      interrupted.push_back(step);
    } else if (fs::exists(item.path() / io::kShardIndexFile, error)) {
      complete.push_back(step);
    }
  }
  std::sort(interrupted.begin(), interrupted.end());
  std::sort(complete.begin(), complete.end());
  auto list = [&](const std::vector<int64_t>& steps, const std::string& suffix) {
    std::string steps_text, paths;
    for (size_t i = 0; i < steps.size(); ++i) {
      const std::string separator = i == 0 ? "" : i + 1 == steps.size() ? " and " : ", ";
      steps_text += separator + std::to_string(steps[i]);
      paths += (i == 0 ? "" : ", ") + sharded_step_directory(directory, steps[i]) + suffix;
    }
    return std::make_pair(steps_text, paths);
  };
  std::string message = "'" + directory + "' holds no complete checkpoint";
  if (!interrupted.empty()) {
    const auto [steps, paths] = list(interrupted, ".tmp");
    message += interrupted.size() == 1
                   ? ": the write of step " + steps + " was interrupted (" + paths + ")"
                   : ": the writes of steps " + steps + " were interrupted (" + paths + ")";
  } else {
    message += std::string(" (no ") + io::kShardIndexFile + ", no " + kLatestFile + ")";
  }
  if (!complete.empty()) {
    const auto [steps, paths] = list(complete, "");
    message += "; no " + std::string(kLatestFile) + " names a complete one, but " + paths +
               (complete.size() == 1 ? " is one" : " are") + ": give its path";
  } else if (fs::exists(fs::path(directory) / "checkpoint.pt", error)) {
    message += "; it holds checkpoint.pt, a single-file checkpoint: give its path";
  } else if (!interrupted.empty()) {
    message += ", and none before it was completed; start the run again without resuming";
  }
  throw CheckpointError(message);
}

}  // namespace

ShardFileWritten write_shard_file(
    const std::string& path, const std::vector<ShardPieceSource>& pieces,
    const std::function<void(size_t piece, uint64_t bytes)>& after_piece) {
  ShardFileWritten written;
  std::vector<io::SafetensorsLayoutEntry> layout;
  std::map<std::string, int> count;
  int64_t largest_copy = 0;
  for (const ShardPieceSource& piece : pieces) {
    const int64_t n = piece.region.elements();
    TORCH_CHECK(piece.values.numel() == n, "shard piece of '", piece.name, "' has ",
                piece.values.numel(), " values for ", n, " elements");
    const std::string key = piece.name + "#" + std::to_string(count[piece.name]++);
    layout.push_back({key, io::safetensors_dtype_of(piece.values.scalar_type()), {n}});
    if (!piece.values.device().is_cpu() || !piece.values.is_contiguous()) {
      largest_copy = std::max<int64_t>(largest_copy, piece.values.nbytes());
    }
  }
  const std::string header = io::serialize_safetensors_header(layout);
  AtomicFileWriter file(path);
  file.write(header.data(), header.size());
  // One host buffer for the pieces that are not contiguous CPU memory (a GPU's, a strided view).
  torch::Tensor buffer;
  if (largest_copy > 0) buffer = torch::empty({largest_copy}, torch::kUInt8);
  written.buffer_bytes = largest_copy;
  for (const ShardPieceSource& piece : pieces) {
    torch::Tensor values = piece.values.detach();
    if (!values.device().is_cpu() || !values.is_contiguous()) {
      torch::Tensor host =
          buffer.narrow(0, 0, values.nbytes()).view(values.scalar_type()).view(values.sizes());
      host.copy_(values);
      values = host;
    }
    const char* data = static_cast<const char*>(values.data_ptr());
    const size_t bytes = values.nbytes();
    const uint64_t offset = file.written();
    // Written and summed a slice at a time, so that the checksum reads the bytes the write has
    // just brought into the cache rather than reading the whole piece from memory a second time.
    constexpr size_t kSlice = size_t{1} << 20;
    uint32_t checksum = 0;
    for (size_t at = 0; at < bytes; at += kSlice) {
      const size_t n = std::min(kSlice, bytes - at);
      file.write(data + at, n);
      checksum = io::crc32c_update(checksum, data + at, n);
    }
    io::ShardTensor& tensor = written.tensors[piece.name];
    tensor.dtype = io::safetensors_dtype_of(values.scalar_type());
    tensor.shape = piece.shape;
    io::ShardPiece stored;
    stored.file = 0;
    stored.begin = offset;
    stored.end = offset + bytes;
    stored.region = piece.region;
    stored.checksum = checksum;
    tensor.pieces.push_back(std::move(stored));
    if (after_piece) after_piece(static_cast<size_t>(&piece - pieces.data()), file.written());
  }
  written.bytes = file.written();
  file.commit();
  return written;
}

TensorBox tensor_box(const TensorParallelSlice& slice, const std::string& name,
                     c10::IntArrayRef local) {
  TensorBox box;
  box.shape = dims(local);
  box.region = io::ShardRegion::whole(box.shape);
  const std::optional<parallel::TensorSplit> split =
      slice.size > 1 && slice.split ? slice.split(name) : std::nullopt;
  if (!split) {
    box.writer = slice.rank == 0;
    return box;
  }
  const int parts = split->parts(slice.size);
  const size_t dim = static_cast<size_t>(split->dim);
  TORCH_CHECK(dim < box.shape.size(), "tensor-parallel split of '", name, "' along dimension ", dim,
              " of a tensor of ", box.shape.size());
  box.shape[dim] *= parts;
  box.region.offsets[dim] = split->part_of(slice.rank) * local[dim];
  box.writer = slice.rank % split->replicas == 0;
  return box;
}

std::vector<ShardPieceSource> rank_pieces(const Checkpoint& part,
                                          const std::vector<OwnedElements>& owned,
                                          const ShardPlacement& placement, bool main) {
  std::vector<ShardPieceSource> pieces;
  const TensorParallelSlice& tp = placement.tensor_parallel;
  // A tensor this rank holds whole (its tp box): its data-parallel share, where it writes it.
  // Expert parallelism: an expert is held by the replicas r, r + E, ...: they share its writing.
  const int ep = placement.expert_parallel;
  auto add_shared = [&](const std::string& key, const torch::Tensor& t, const TensorBox& box,
                        bool expert = false) {
    if (!box.writer) return;
    const auto [begin, end] =
        expert ? share(t.numel(), placement.replica / ep, placement.replicas / ep)
               : share(t.numel(), placement.replica, placement.replicas);
    if (begin == end) return;
    io::ShardRegion region = box.region;
    region.flat_begin = begin;
    region.flat_end = end;
    pieces.push_back(
        {key, box.shape, region, t.detach().reshape({-1}).narrow(0, begin, end - begin)});
  };
  // A scalar or a tensor of another shape than its parameter (a step count): whole, written once
  // (by replica 0 of the rank holding the parameter's first element).
  auto add_once = [&](const std::string& key, const torch::Tensor& t) {
    const std::vector<int64_t> shape = dims(t.sizes());
    pieces.push_back({key, shape, io::ShardRegion::whole(shape), t.detach().reshape({-1})});
  };
  auto holds_first = [](const TensorBox& box) {
    return box.writer && std::all_of(box.region.offsets.begin(), box.region.offsets.end(),
                                     [](int64_t o) { return o == 0; });
  };
  std::set<std::string> zero_names;
  for (const OwnedElements& slice : owned) {
    zero_names.insert(slice.name);
    const auto live = part.parameters.find(slice.name);
    TORCH_CHECK(live != part.parameters.end(), "ZeRO slice of '", slice.name,
                "', a parameter the rank does not hold");
    const TensorBox box = tensor_box(tp, slice.name, live->second.sizes());
    if (!box.writer) continue;
    io::ShardRegion region = box.region;
    region.flat_begin = slice.offset;
    region.flat_end = slice.offset + slice.values.numel();
    if (region.elements() == 0) continue;
    pieces.push_back({"param/" + slice.name, box.shape, region, slice.values.reshape({-1})});
    for (const auto& [field, value] : slice.state) {
      const std::string key = "optim/" + slice.name + "/" + field;
      if (value.numel() == slice.values.numel() && field != "step") {
        pieces.push_back({key, box.shape, region, value.reshape({-1})});
      } else if (slice.offset == 0 && holds_first(box) && slice.values.numel() > 0) {
        add_once(key, value);
      }
    }
  }
  for (const auto& [name, tensor] : part.parameters) {
    if (zero_names.count(name)) continue;
    const TensorBox box = tensor_box(tp, name, tensor.sizes());
    const bool expert = ep > 1 && parallel::is_expert_parameter(name);
    add_shared("param/" + name, tensor, box, expert);
    const auto state = part.optimizer_state.find(name);
    if (state == part.optimizer_state.end()) continue;
    for (const auto& [field, value] : state->second) {
      const std::string key = "optim/" + name + "/" + field;
      if (value.sizes() == tensor.sizes() && field != "step") {
        add_shared(key, value, box, expert);
      } else if ((expert ? placement.replica < ep : placement.replica == 0) && holds_first(box)) {
        add_once(key, value);
      }
    }
  }
  for (const auto& [name, tensor] : part.buffers) {
    add_shared("buffer/" + name, tensor, tensor_box(tp, name, tensor.sizes()));
  }
  if (placement.replica == 0 && tp.rank == 0) {
    for (const auto& [stage, state] : part.stage_rng_states) {
      add_once("rng/stage/" + std::to_string(stage), state);
    }
  }
  if (main && part.torch_rng_state.defined()) add_once("rng/torch", part.torch_rng_state);
  return pieces;
}

std::string sharded_step_directory(const std::string& directory, int64_t step) {
  return (fs::path(directory) / ("step-" + std::to_string(step))).string();
}

std::optional<std::string> resolve_sharded_checkpoint(const std::string& path) {
  std::error_code error;
  if (!fs::is_directory(path, error)) return std::nullopt;
  if (fs::exists(fs::path(path) / io::kShardIndexFile, error)) return path;
  const fs::path latest = fs::path(path) / kLatestFile;
  if (!fs::exists(latest, error)) throw_no_checkpoint_in(path);
  std::string name = read_file(latest.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos) {
    throw FileError("'" + latest.string() + "' does not name a checkpoint directory");
  }
  return (fs::path(path) / name).string();
}

io::ShardIndex make_shard_index(
    const std::vector<std::pair<std::string, std::map<std::string, io::ShardTensor>>>& files,
    nlohmann::json state, nlohmann::json layout) {
  io::ShardIndex index;
  index.state = std::move(state);
  index.layout = std::move(layout);
  for (const auto& [file, tensors] : files) {
    const size_t f = index.files.size();
    index.files.push_back(file);
    for (const auto& [name, tensor] : tensors) {
      auto [it, inserted] =
          index.tensors.emplace(name, io::ShardTensor{tensor.dtype, tensor.shape, {}});
      if (it->second.dtype != tensor.dtype || it->second.shape != tensor.shape) {
        throw io::ShardIndexError(file, name,
                                  "ranks disagree on its dtype or shape (" +
                                      shape_text(it->second.shape) + " and " +
                                      shape_text(tensor.shape) + ")");
      }
      (void)inserted;
      for (io::ShardPiece piece : tensor.pieces) {
        piece.file = f;
        it->second.pieces.push_back(std::move(piece));
      }
    }
  }
  io::check_shard_index(index, io::kShardIndexFile);
  return index;
}

void commit_sharded_checkpoint(const std::string& directory, int64_t step,
                               const std::string& partial, const io::ShardIndex& index, int keep) {
  write_file_atomically((fs::path(partial) / io::kShardIndexFile).string(),
                        io::serialize_shard_index(index));
  sync_directory(partial);
  const std::string final_dir = sharded_step_directory(directory, step);
  std::error_code error;
  // A checkpoint of this step already there (a rerun): moved aside, removed once `latest` names
  // the new one.
  std::string aside;
  if (fs::exists(final_dir, error)) {
    aside = final_dir + ".old";
    fs::remove_all(aside, error);
    fs::rename(final_dir, aside, error);
    if (error) throw FileError("cannot move '" + final_dir + "' aside: " + error.message());
  }
  fs::rename(partial, final_dir, error);
  if (error) {
    throw FileError("cannot rename '" + partial + "' to '" + final_dir + "': " + error.message());
  }
  sync_directory(directory);
  write_file_atomically((fs::path(directory) / kLatestFile).string(),
                        "step-" + std::to_string(step) + "\n");
  if (!aside.empty()) fs::remove_all(aside, error);
  // Older checkpoints beyond `keep`, and what interrupted saves left (step-N.tmp of other steps).
  std::vector<int64_t> complete;
  for (const auto& item : fs::directory_iterator(directory, error)) {
    const std::string name = item.path().filename().string();
    if (name.size() > 4 && name.substr(name.size() - 4) == ".tmp" &&
        parse_step_directory(name.substr(0, name.size() - 4)) >= 0) {
      fs::remove_all(item.path(), error);
      continue;
    }
    const int64_t n = parse_step_directory(name);
    if (n >= 0 && fs::exists(item.path() / io::kShardIndexFile)) complete.push_back(n);
  }
  std::sort(complete.begin(), complete.end());
  if (keep > 0 && complete.size() > static_cast<size_t>(keep)) {
    for (size_t i = 0; i + static_cast<size_t>(keep) < complete.size(); ++i) {
      if (complete[i] == step) continue;
      fs::remove_all(sharded_step_directory(directory, complete[i]), error);
    }
  }
}

// ---- reading -------------------------------------------------------------------------------

struct ShardedCheckpoint::State {
  std::string directory;
  std::string index_path;
  io::ShardIndex index;
  std::vector<io::MappedFile> files;
  mutable std::mutex mutex;
  mutable std::set<std::pair<std::string, size_t>> verified;  // (tensor, piece)
};

ShardedCheckpoint ShardedCheckpoint::open(const std::string& path) {
  const std::optional<std::string> directory = resolve_sharded_checkpoint(path);
  if (!directory) {
    throw FileError("'" + path + "' is not a sharded checkpoint (no " + io::kShardIndexFile +
                    " and no latest)");
  }
  auto state = std::make_shared<State>();
  state->directory = *directory;
  state->index_path = (fs::path(*directory) / io::kShardIndexFile).string();
  const std::string& index_path = state->index_path;
  state->index = io::parse_shard_index(read_file(index_path), index_path);
  for (const std::string& name : state->index.files) {
    const std::string file = (fs::path(*directory) / name).string();
    if (!fs::exists(file)) throw io::ShardIndexError(file, "", "the file is missing");
    state->files.emplace_back(file);
  }
  for (const auto& [name, tensor] : state->index.tensors) {
    for (const io::ShardPiece& piece : tensor.pieces) {
      const io::MappedFile& file = state->files[piece.file];
      if (piece.end > file.size()) {
        throw io::ShardIndexError(file.path(), name,
                                  "the file is truncated: " + std::to_string(file.size()) +
                                      " bytes, a piece ends at " + std::to_string(piece.end));
      }
    }
  }
  ShardedCheckpoint checkpoint;
  checkpoint.state_ = std::move(state);
  return checkpoint;
}

const io::ShardIndex& ShardedCheckpoint::index() const {
  return state_->index;
}
const std::string& ShardedCheckpoint::directory() const {
  return state_->directory;
}
bool ShardedCheckpoint::contains(const std::string& name) const {
  return state_->index.find(name) != nullptr;
}

torch::Tensor ShardedCheckpoint::read(const std::string& name,
                                      const io::ShardRegion& region) const {
  const io::ShardTensor* tensor = state_->index.find(name);
  const std::string& index_path = state_->index_path;
  if (tensor == nullptr) throw io::ShardIndexError(index_path, name, "not in the checkpoint");
  if (region.shape.size() != tensor->shape.size()) {
    throw io::ShardIndexError(index_path, name,
                              "of shape " + shape_text(tensor->shape) + ", asked for a box of " +
                                  std::to_string(region.shape.size()) + " dimensions");
  }
  for (size_t d = 0; d < region.shape.size(); ++d) {
    if (region.offsets[d] < 0 || region.offsets[d] + region.shape[d] > tensor->shape[d]) {
      throw io::ShardIndexError(
          index_path, name,
          "of shape " + shape_text(tensor->shape) + ", asked for a box outside it");
    }
  }
  const torch::Dtype dtype = io::torch_dtype_of(tensor->dtype, index_path, name);
  torch::Tensor out = torch::empty({region.elements()}, dtype);
  const int64_t element = static_cast<int64_t>(io::element_size(tensor->dtype));
  char* to = static_cast<char*>(out.data_ptr());
  int64_t copied = 0;
  for (size_t p = 0; p < tensor->pieces.size(); ++p) {
    const io::ShardPiece& piece = tensor->pieces[p];
    const io::MappedFile& file = state_->files[piece.file];
    const char* from = file.data() + piece.begin;
    bool checked = false;
    copied +=
        io::for_each_run(tensor->shape, piece.region, region, [&](int64_t f, int64_t t, int64_t n) {
          if (!checked) {
            checked = true;
            std::lock_guard<std::mutex> lock(state_->mutex);
            if (state_->verified.insert({name, p}).second &&
                io::shard_checksum(piece.checksum_kind, from, piece.end - piece.begin) !=
                    piece.checksum) {
              state_->verified.erase({name, p});
              throw io::ShardIndexError(file.path(), name,
                                        "a piece's bytes differ from the index's checksum "
                                        "(bytes " +
                                            std::to_string(piece.begin) + ".." +
                                            std::to_string(piece.end) + ")");
            }
          }
          std::memcpy(to + t * element, from + f * element, static_cast<size_t>(n * element));
        });
    // What was copied out is held once: the mapped pages go (a resume or an export then holds
    // what it read, not also every page of the files it read it from).
    if (checked) file.release(piece.begin, piece.end);
  }
  if (copied != region.elements()) {
    throw io::ShardIndexError(index_path, name, "its pieces do not hold the region asked for");
  }
  return out;
}

torch::Tensor ShardedCheckpoint::read_whole(const std::string& name) const {
  const io::ShardTensor* tensor = state_->index.find(name);
  if (tensor == nullptr) {
    throw io::ShardIndexError((fs::path(state_->directory) / io::kShardIndexFile).string(), name,
                              "not in the checkpoint");
  }
  return read(name, io::ShardRegion::whole(tensor->shape)).view(tensor->shape);
}

namespace {

void read_trainer_state(const ShardedCheckpoint& c, Checkpoint& out) {
  const nlohmann::json& s = c.index().state;
  const std::string path = (fs::path(c.directory()) / io::kShardIndexFile).string();
  try {
    out.step = s.value("step", int64_t{0});
    out.epoch = s.value("epoch", int64_t{0});
    out.batch = s.value("batch", int64_t{0});
    out.optimizer = s.value("optimizer", std::string());
    out.loader_state = s.value("loader_state", std::string());
    out.metadata = s.value("metadata", nlohmann::json::object());
  } catch (const nlohmann::json::exception& error) {
    throw io::ShardIndexError(path, "", std::string("bad trainer state: ") + error.what());
  }
  if (c.contains("rng/torch")) out.torch_rng_state = c.read_whole("rng/torch");
  const std::string prefix = "rng/stage/";
  for (auto it = c.index().tensors.lower_bound(prefix);
       it != c.index().tensors.end() && it->first.rfind(prefix, 0) == 0; ++it) {
    const std::string digits = it->first.substr(prefix.size());
    if (digits.empty() || digits.size() > 9 ||
        !std::all_of(digits.begin(), digits.end(),
                     [](char ch) { return ch >= '0' && ch <= '9'; })) {
      throw io::ShardIndexError(path, it->first, "not a stage's random stream");
    }
    out.stage_rng_states[std::stoi(digits)] = c.read_whole(it->first);
  }
}

// The optimizer fields the index holds for parameter `name`.
std::vector<std::string> optimizer_fields(const io::ShardIndex& index, const std::string& name) {
  std::vector<std::string> fields;
  const std::string prefix = "optim/" + name + "/";
  for (auto it = index.tensors.lower_bound(prefix);
       it != index.tensors.end() && it->first.rfind(prefix, 0) == 0; ++it) {
    const std::string field = it->first.substr(prefix.size());
    if (field.find('/') == std::string::npos) fields.push_back(field);
  }
  return fields;
}

}  // namespace

Checkpoint read_rank_checkpoint(const ShardedCheckpoint& c, const NamedTensors& parameters,
                                const NamedTensors& buffers, const TensorParallelSlice& slice,
                                bool optimizer_state_by_range) {
  const std::string path = (fs::path(c.directory()) / io::kShardIndexFile).string();
  Checkpoint out;
  read_trainer_state(c, out);
  std::vector<std::string> missing;
  // One tensor of the rank: its tp box, read (or, on the meta device, only checked).
  auto read_box = [&](const std::string& key, const std::string& name,
                      const torch::Tensor& live) -> torch::Tensor {
    const io::ShardTensor* stored = c.index().find(key);
    if (stored == nullptr) {
      missing.push_back(name);
      return {};
    }
    const TensorBox box = tensor_box(slice, name, live.sizes());
    if (stored->shape != box.shape) {
      throw io::ShardIndexError(path, key,
                                "of shape " + shape_text(stored->shape) + ", the model's is " +
                                    shape_text(box.shape) +
                                    " (was it written for another model or other options?)");
    }
    if (live.is_meta()) {
      return torch::empty(live.sizes(), torch::TensorOptions()
                                            .dtype(io::torch_dtype_of(stored->dtype, path, key))
                                            .device(torch::kMeta));
    }
    return c.read(key, box.region).view(live.sizes());
  };
  std::set<std::string> model_names;
  for (const auto& item : parameters) {
    model_names.insert("param/" + item.key());
    torch::Tensor t = read_box("param/" + item.key(), item.key(), item.value());
    if (!t.defined()) continue;
    out.parameters[item.key()] = t;
    if (item.value().is_meta()) continue;
    for (const std::string& field : optimizer_fields(c.index(), item.key())) {
      const std::string key = "optim/" + item.key() + "/" + field;
      const io::ShardTensor* stored = c.index().find(key);
      const TensorBox box = tensor_box(slice, item.key(), item.value().sizes());
      if (stored->shape == box.shape && field != "step" && optimizer_state_by_range) {
        out.optimizer_state[item.key()][field] = torch::empty(
            item.value().sizes(), torch::TensorOptions()
                                      .dtype(io::torch_dtype_of(stored->dtype, path, key))
                                      .device(torch::kMeta));
      } else if (stored->shape == box.shape && field != "step") {
        out.optimizer_state[item.key()][field] = c.read(key, box.region).view(item.value().sizes());
      } else {
        out.optimizer_state[item.key()][field] = c.read_whole(key);
      }
    }
  }
  if (optimizer_state_by_range) {
    // The box of each parameter, by name, for the ranges read later (the checkpoint's mapped
    // files stay open while the Checkpoint lives).
    auto boxes = std::make_shared<std::map<std::string, io::ShardRegion>>();
    for (const auto& item : parameters) {
      (*boxes)[item.key()] = tensor_box(slice, item.key(), item.value().sizes()).region;
    }
    out.optimizer_range = [c, boxes](const std::string& parameter, const std::string& field,
                                     int64_t begin, int64_t length) {
      const auto box = boxes->find(parameter);
      if (box == boxes->end()) {
        throw CheckpointError("no optimizer state of '" + parameter + "' was asked for");
      }
      io::ShardRegion region = box->second;
      TORCH_CHECK(begin >= 0 && length >= 0 && begin + length <= region.elements(),
                  "optimizer state range [", begin, ", ", begin + length, ") of '", parameter,
                  "' outside its ", region.elements(), " elements");
      region.flat_end = region.flat_begin + begin + length;
      region.flat_begin += begin;
      return c.read("optim/" + parameter + "/" + field, region);
    };
  }
  for (const auto& item : buffers) {
    model_names.insert("buffer/" + item.key());
    torch::Tensor t = read_box("buffer/" + item.key(), item.key(), item.value());
    if (t.defined()) out.buffers[item.key()] = t;
  }
  if (!missing.empty()) {
    std::string names;
    for (size_t i = 0; i < missing.size() && i < 10; ++i) names += (i ? ", " : "") + missing[i];
    if (missing.size() > 10) names += ", ... (" + std::to_string(missing.size()) + " in all)";
    throw io::ShardIndexError(path, missing.front(),
                              "the model's tensors missing from the checkpoint: " + names);
  }
  // Expert parallelism: a mixture's layer holds some of its experts; the others' are another
  // rank's (a layer whose experts this model does not know at all is still refused).
  const std::string experts = ".experts.";
  const auto layer_of = [&](const std::string& name) {  // "param/3.mlp.experts." of an expert
    return name.substr(0, name.find(experts) + experts.size());
  };
  std::set<std::string> expert_layers;
  for (const std::string& name : model_names) {
    if (parallel::is_expert_parameter(name)) expert_layers.insert(layer_of(name));
  }
  for (const auto& [key, tensor] : c.index().tensors) {
    const bool model_tensor = key.rfind("param/", 0) == 0 || key.rfind("buffer/", 0) == 0;
    if (model_tensor && parallel::is_expert_parameter(key) && expert_layers.count(layer_of(key))) {
      continue;
    }
    if (model_tensor && !model_names.count(key)) {
      throw io::ShardIndexError(path, key,
                                "in the checkpoint but not in the model (was it written for "
                                "another model or other options?)");
    }
  }
  return out;
}

Checkpoint read_whole_checkpoint(const ShardedCheckpoint& c) {
  Checkpoint out;
  read_trainer_state(c, out);
  for (const auto& [key, tensor] : c.index().tensors) {
    if (key.rfind("param/", 0) == 0) {
      out.parameters[key.substr(6)] = c.read_whole(key);
    } else if (key.rfind("buffer/", 0) == 0) {
      out.buffers[key.substr(7)] = c.read_whole(key);
    } else if (key.rfind("optim/", 0) == 0) {
      const size_t slash = key.rfind('/');
      if (slash <= 6) continue;
      out.optimizer_state[key.substr(6, slash - 6)][key.substr(slash + 1)] = c.read_whole(key);
    }
  }
  return out;
}

Checkpoint resume_checkpoint(const std::string& path, torch::nn::Module& model,
                             const std::string& optimizer, const TensorParallelSlice& slice,
                             bool optimizer_state_by_range) {
  if (!resolve_sharded_checkpoint(path)) return load_for_resume(path, model, optimizer, slice);
  const ShardedCheckpoint sharded = ShardedCheckpoint::open(path);
  Checkpoint checkpoint = read_rank_checkpoint(
      sharded, model.named_parameters(), model.named_buffers(), slice, optimizer_state_by_range);
  try {
    restore_model(checkpoint, model, NameMatch::kExact);
  } catch (const CheckpointError& error) {
    throw CheckpointError(sharded.directory() + ": " + error.what());
  }
  if (!checkpoint.optimizer.empty() && checkpoint.optimizer != optimizer) {
    throw CheckpointError(sharded.directory() + " was written with --optimizer " +
                          checkpoint.optimizer + " but this run uses --optimizer " + optimizer +
                          "; resume with the same optimizer");
  }
  return checkpoint;
}

Checkpoint load_any_checkpoint(const std::string& path) {
  if (!resolve_sharded_checkpoint(path)) return load_checkpoint(path);
  return read_whole_checkpoint(ShardedCheckpoint::open(path));
}

namespace {

// The shard of every tensor of an export: cut at max_shard_bytes, and at the parts' shares.
std::vector<size_t> export_plan(const std::vector<ExportedTensor>& tensors,
                                const SafetensorsExportOptions& options, int64_t& total) {
  const int64_t element = static_cast<int64_t>(c10::elementSize(options.dtype()));
  std::vector<int64_t> bytes;
  total = 0;
  for (const ExportedTensor& t : tensors) {
    int64_t n = element;
    for (int64_t d : t.shape) n *= d;
    bytes.push_back(n);
    total += n;
  }
  PIPETRAIN_CHECK_INPUT(
      options.parts() >= 1 && options.part() >= 0 && options.part() < options.parts(),
      "safetensors export: part ", options.part(), " of ", options.parts());
  const int64_t share = (total + options.parts() - 1) / options.parts();
  return io::plan_safetensors_shards(
      bytes, std::max<int64_t>(1, std::min(options.max_shard_bytes(), share)));
}

}  // namespace

std::vector<std::string> export_safetensors_part(const ShardedCheckpoint& checkpoint,
                                                 const std::string& directory,
                                                 const std::vector<ExportedTensor>& tensors,
                                                 const SafetensorsExportOptions& options) {
  const std::string index_path = (fs::path(checkpoint.directory()) / io::kShardIndexFile).string();
  std::set<std::string> sources(options.unexported().begin(), options.unexported().end());
  for (const ExportedTensor& t : tensors) {
    const io::ShardTensor* stored = checkpoint.index().find(t.source);
    if (stored == nullptr) {
      throw io::ShardIndexError(index_path, t.source,
                                "missing: the model has it (" + t.name +
                                    "), the checkpoint does not (a checkpoint of another model?)");
    }
    if (stored->shape != t.shape) {
      throw io::ShardIndexError(index_path, t.source,
                                "has shape " + shape_text(stored->shape) + " but the model's " +
                                    t.name + " is " + shape_text(t.shape));
    }
    sources.insert(t.source);
  }
  for (const auto& [name, stored] : checkpoint.index().tensors) {
    if (name.rfind("param/", 0) == 0 && !sources.count(name)) {
      throw io::ShardIndexError(index_path, name,
                                "extra: the checkpoint has it, the model does not (a checkpoint "
                                "of another model or config?)");
    }
  }
  int64_t total = 0;
  const std::vector<size_t> plan = export_plan(tensors, options, total);
  const size_t shards = plan.empty() ? 1 : plan.back() + 1;
  std::error_code error;
  fs::create_directories(directory, error);
  if (error) {
    throw FileError("cannot write '" + directory +
                    "': cannot create the directory: " + error.message());
  }
  const io::SafetensorsDtype dtype = io::safetensors_dtype_of(options.dtype());
  std::vector<std::string> written;
  for (size_t shard = static_cast<size_t>(options.part()); shard < shards;
       shard += static_cast<size_t>(options.parts())) {
    std::vector<io::StreamedTensor> members;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (plan[i] != shard) continue;
      const ExportedTensor& t = tensors[i];
      members.push_back({t.name, dtype, t.shape, [&checkpoint, source = t.source] {
                           return checkpoint.read_whole(source);
                         }});
    }
    written.push_back(io::safetensors_shard_name(shard, shards));
    io::write_safetensors_file_streamed((fs::path(directory) / written.back()).string(), members);
  }
  return written;
}

std::vector<std::string> safetensors_export_files(const std::vector<ExportedTensor>& tensors,
                                                  const SafetensorsExportOptions& options) {
  int64_t total = 0;
  const std::vector<size_t> plan = export_plan(tensors, options, total);
  const size_t shards = plan.empty() ? 1 : plan.back() + 1;
  std::vector<std::string> files;
  for (size_t s = 0; s < shards; ++s) files.push_back(io::safetensors_shard_name(s, shards));
  if (shards > 1) files.push_back(io::kSafetensorsIndexFile);
  return files;
}

void finish_safetensors_export(const std::string& directory,
                               const std::vector<ExportedTensor>& tensors,
                               const SafetensorsExportOptions& options) {
  int64_t total = 0;
  const std::vector<size_t> plan = export_plan(tensors, options, total);
  std::vector<std::string> names;
  for (const ExportedTensor& t : tensors) names.push_back(t.name);
  io::finish_safetensors_checkpoint(directory, names, plan, total);
}

std::string describe_sharded_checkpoint(const std::string& path) {
  const ShardedCheckpoint c = ShardedCheckpoint::open(path);
  const io::ShardIndex& index = c.index();
  std::ostringstream out;
  out << "sharded checkpoint " << c.directory() << "\n";
  out << "step " << index.state.value("step", int64_t{0}) << ", epoch "
      << index.state.value("epoch", int64_t{0}) << ", optimizer "
      << index.state.value("optimizer", std::string("none")) << "\n";
  out << "written at: " << index.layout.dump() << "\n";
  std::map<std::string, std::pair<int64_t, uint64_t>> kinds;  // tensors, bytes
  std::vector<uint64_t> file_bytes(index.files.size(), 0);
  std::vector<int64_t> file_pieces(index.files.size(), 0);
  for (const auto& [name, tensor] : index.tensors) {
    const std::string kind = name.substr(0, name.find('/'));
    kinds[kind].first += 1;
    kinds[kind].second += tensor.bytes();
    for (const io::ShardPiece& piece : tensor.pieces) {
      file_bytes[piece.file] += piece.end - piece.begin;
      file_pieces[piece.file] += 1;
    }
  }
  uint64_t total = 0;
  char line[256];
  for (const auto& [kind, figures] : kinds) {
    std::snprintf(line, sizeof line, "  %-8s %6lld tensors %14llu bytes\n", kind.c_str(),
                  static_cast<long long>(figures.first),
                  static_cast<unsigned long long>(figures.second));
    out << line;
    total += figures.second;
  }
  std::snprintf(line, sizeof line, "  %-8s %6zu tensors %14llu bytes\n", "all",
                index.tensors.size(), static_cast<unsigned long long>(total));
  out << line;
  for (size_t f = 0; f < index.files.size(); ++f) {
    out << "  " << index.files[f] << "  " << file_pieces[f] << " pieces, " << file_bytes[f]
        << " bytes\n";
  }
  return out.str();
}

}  // namespace pipetrain::train
