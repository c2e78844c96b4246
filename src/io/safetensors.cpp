// Safetensors checkpoints with LibTorch (io/safetensors.h).
#include "pipetrain/io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "pipetrain/base/atomic_file.h"
#include "pipetrain/base/check.h"
#include "pipetrain/stage/tensor_bytes.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; pipetrain reads it in place on little-endian "
              "hosts only");

namespace pipetrain::io {

const char* const kSafetensorsFile = "model.safetensors";
const char* const kSafetensorsIndexFile = "model.safetensors.index.json";

namespace {

namespace fs = std::filesystem;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// The index's weight_map: tensor name -> shard file name (relative to the index's directory).
std::map<std::string, std::string> read_index(const std::string& index_path) {
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_file(index_path));
  } catch (const nlohmann::json::exception& error) {
    throw SafetensorsError(index_path, "", std::string("not JSON: ") + error.what());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw SafetensorsError(index_path, "", "no \"weight_map\" object of tensor name -> file");
  }
  std::map<std::string, std::string> map;
  for (const auto& item : index["weight_map"].items()) {
    if (!item.value().is_string()) {
      throw SafetensorsError(index_path, item.key(),
                             "its weight_map entry is not a file name: " + item.value().dump());
    }
    const std::string file = item.value().get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      throw SafetensorsError(
          index_path, item.key(),
          "weight_map names file '" + file + "', which is not a file name beside the index");
    }
    map[item.key()] = file;
  }
  return map;
}

// Shards of an earlier save into the same directory ("model-*-of-*.safetensors") that this save
// did not write: nothing points at them any more.
void remove_stale_shards(const fs::path& dir, const std::vector<std::string>& written) {
  std::error_code error;
  for (const auto& item : fs::directory_iterator(dir, error)) {
    const std::string name = item.path().filename().string();
    const bool shard = name.rfind("model-", 0) == 0 && name.find("-of-") != std::string::npos &&
                       name.size() > 12 && name.substr(name.size() - 12) == ".safetensors";
    if (shard && std::find(written.begin(), written.end(), name) == written.end()) {
      fs::remove(item.path(), error);
    }
  }
}

}  // namespace

torch::Dtype torch_dtype_of(SafetensorsDtype dtype, const std::string& file,
                            const std::string& tensor) {
  switch (dtype) {
    case SafetensorsDtype::kF32:
      return torch::kFloat32;
    case SafetensorsDtype::kF16:
      return torch::kFloat16;
    case SafetensorsDtype::kBF16:
      return torch::kBFloat16;
    case SafetensorsDtype::kF64:
      return torch::kFloat64;
    case SafetensorsDtype::kI64:
      return torch::kInt64;
    case SafetensorsDtype::kI32:
      return torch::kInt32;
    case SafetensorsDtype::kI16:
      return torch::kInt16;
    case SafetensorsDtype::kI8:
      return torch::kInt8;
    case SafetensorsDtype::kU8:
      return torch::kUInt8;
    case SafetensorsDtype::kBool:
      return torch::kBool;
    default:
      throw SafetensorsError(file, tensor,
                             std::string("dtype ") + to_string(dtype) +
                                 " has no LibTorch dtype pipetrain converts from (F32, F16, BF16, "
                                 "F64, I64, I32, I16, I8, U8, BOOL)");
  }
}

SafetensorsDtype safetensors_dtype_of(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kFloat32:
      return SafetensorsDtype::kF32;
    case torch::kFloat16:
      return SafetensorsDtype::kF16;
    case torch::kBFloat16:
      return SafetensorsDtype::kBF16;
    case torch::kFloat64:
      return SafetensorsDtype::kF64;
    case torch::kInt64:
      return SafetensorsDtype::kI64;
    case torch::kInt32:
      return SafetensorsDtype::kI32;
    case torch::kInt16:
      return SafetensorsDtype::kI16;
    case torch::kInt8:
      return SafetensorsDtype::kI8;
    case torch::kUInt8:
      return SafetensorsDtype::kU8;
    case torch::kBool:
      return SafetensorsDtype::kBool;
    default:
      throw BadInput(std::string("safetensors has no dtype for torch's ") + c10::toString(dtype));
  }
}

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::string& path) {
  SafetensorsCheckpoint checkpoint;
  checkpoint.path_ = path;
  auto add_shard = [&](const std::string& file) {
    auto shard = std::make_shared<Shard>();
    shard->file = MappedFile(file);
    shard->header = parse_safetensors_header(shard->file.data(), shard->file.size(), file);
    checkpoint.shards_.push_back(std::move(shard));
    return checkpoint.shards_.size() - 1;
  };
  std::error_code error;
  if (!fs::is_directory(path, error)) {
    const size_t s = add_shard(path);  // FileError when it does not exist
    const auto& entries = checkpoint.shards_[s]->header.entries;
    for (size_t e = 0; e < entries.size(); ++e) checkpoint.index_[entries[e].name] = {s, e};
    return checkpoint;
  }
  const fs::path directory(path);
  const fs::path index_path = directory / kSafetensorsIndexFile;
  const fs::path single = directory / kSafetensorsFile;
  if (fs::exists(index_path, error)) {
    const std::map<std::string, std::string> weight_map = read_index(index_path.string());
    std::map<std::string, size_t> shard_of_file;
    for (const auto& [name, file] : weight_map) {
      if (shard_of_file.count(file)) continue;
      const fs::path shard_path = directory / file;
      if (!fs::exists(shard_path, error)) {
        throw SafetensorsError(index_path.string(), name,
                               "is in shard '" + file + "', which is not in " + path);
      }
      shard_of_file[file] = add_shard(shard_path.string());
    }
    for (const auto& [name, file] : weight_map) {
      const size_t s = shard_of_file.at(file);
      const auto& entries = checkpoint.shards_[s]->header.entries;
      auto found = std::find_if(entries.begin(), entries.end(),
                                [&](const SafetensorsEntry& e) { return e.name == name; });
      if (found == entries.end()) {
        throw SafetensorsError(checkpoint.shards_[s]->file.path(), name,
                               "the index puts it in this file, which does not hold it");
      }
      checkpoint.index_[name] = {s, static_cast<size_t>(found - entries.begin())};
    }
    for (const auto& shard : checkpoint.shards_) {
      for (const SafetensorsEntry& entry : shard->header.entries) {
        if (!weight_map.count(entry.name)) {
          throw SafetensorsError(shard->file.path(), entry.name,
                                 std::string("not in the index ") + kSafetensorsIndexFile +
                                     " (an extra tensor, or a stale shard)");
        }
      }
    }
    return checkpoint;
  }
  if (fs::exists(single, error)) {
    SafetensorsCheckpoint one = open(single.string());
    one.path_ = path;
    return one;
  }
  throw FileError("'" + path + "' holds neither " + kSafetensorsFile + " nor " +
                  kSafetensorsIndexFile + " (a Hugging Face checkpoint's weights)");
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> names;
  for (const auto& item : index_) names.push_back(item.first);
  return names;
}

bool SafetensorsCheckpoint::contains(const std::string& name) const {
  return index_.count(name) > 0;
}

const SafetensorsEntry& SafetensorsCheckpoint::entry(const std::string& name) const {
  auto found = index_.find(name);
  if (found == index_.end()) throw SafetensorsError(path_, name, "not in the checkpoint");
  return shards_[found->second.shard]->header.entries[found->second.entry];
}

const std::string& SafetensorsCheckpoint::file_of(const std::string& name) const {
  auto found = index_.find(name);
  if (found == index_.end()) throw SafetensorsError(path_, name, "not in the checkpoint");
  return shards_[found->second.shard]->file.path();
}

std::vector<std::string> SafetensorsCheckpoint::files() const {
  std::vector<std::string> files;
  for (const auto& shard : shards_) files.push_back(shard->file.path());
  return files;
}

torch::Tensor SafetensorsCheckpoint::load(const std::string& name, torch::Dtype dtype,
                                          const torch::Device& device) const {
  const SafetensorsEntry& e = entry(name);
  return load_slice(name, 0, 0, e.shape.empty() ? 1 : e.shape[0], dtype, device);
}

torch::Tensor SafetensorsCheckpoint::load_slice(const std::string& name, int64_t dim, int64_t start,
                                                int64_t length, torch::Dtype dtype,
                                                const torch::Device& device) const {
  const SafetensorsEntry& e = entry(name);
  const Shard& shard = *shards_[index_.at(name).shard];
  const torch::Dtype stored = torch_dtype_of(e.dtype, shard.file.path(), name);
  const char* bytes = shard.file.data() + e.offset;
  torch::Tensor view;
  const auto size = static_cast<int64_t>(element_size(e.dtype));
  if (reinterpret_cast<uintptr_t>(bytes) % static_cast<uintptr_t>(size) == 0) {
    // The map is read-only: this view is only ever read (copied just below).
    view =
        torch::from_blob(const_cast<char*>(bytes), e.shape, torch::TensorOptions().dtype(stored));
  } else {  // a misaligned tensor (the format does not promise alignment): copy it first
    view = torch::empty(e.shape, torch::TensorOptions().dtype(stored));
    std::memcpy(view.data_ptr(), bytes, e.bytes);
  }
  if (!e.shape.empty()) {
    PIPETRAIN_CHECK_INPUT(dim >= 0 && dim < static_cast<int64_t>(e.shape.size()) && start >= 0 &&
                              length >= 0 && start + length <= e.shape[dim],
                          "slice [", start, ", ", start + length, ") of dimension ", dim, " of '",
                          name, "' of shape ", view.sizes(), " does not exist");
    view = view.narrow(dim, start, length);
  }
  return view.to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
}

void write_safetensors_file(const std::string& path, const NamedTensorList& tensors,
                            const std::map<std::string, std::string>& metadata) {
  // Wider element types first: each tensor's offset is then a multiple of its element size.
  std::vector<size_t> order(tensors.size());
  for (size_t t = 0; t < order.size(); ++t) order[t] = t;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return tensors[a].second.element_size() > tensors[b].second.element_size();
  });
  std::vector<SafetensorsLayoutEntry> layout;
  std::vector<torch::Tensor> data;  // contiguous CPU copies (or the tensors themselves)
  for (size_t t : order) {
    const auto& [name, tensor] = tensors[t];
    if (!tensor.defined()) throw BadInput("safetensors: tensor '" + name + "' is undefined");
    layout.push_back({name, safetensors_dtype_of(tensor.scalar_type()), tensor.sizes().vec()});
    data.push_back(tensor.detach().to(torch::kCPU).contiguous());
  }
  const std::string header = serialize_safetensors_header(layout, metadata);
  std::vector<std::string_view> pieces{header};
  for (const torch::Tensor& t : data) {
    pieces.emplace_back(static_cast<const char*>(t.data_ptr()),
                        static_cast<size_t>(t.numel()) * t.element_size());
  }
  write_file_atomically(path, pieces);
}

int64_t StreamedTensor::bytes() const {
  int64_t n = static_cast<int64_t>(element_size(dtype));
  for (int64_t d : shape) n *= d;
  return n;
}

void write_safetensors_file_streamed(const std::string& path,
                                     const std::vector<StreamedTensor>& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  // Wider element types first, as write_safetensors_file lays them out.
  std::vector<size_t> order(tensors.size());
  for (size_t t = 0; t < order.size(); ++t) order[t] = t;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return element_size(tensors[a].dtype) > element_size(tensors[b].dtype);
  });
  std::vector<SafetensorsLayoutEntry> layout;
  for (size_t t : order) layout.push_back({tensors[t].name, tensors[t].dtype, tensors[t].shape});
  const std::string header = serialize_safetensors_header(layout, metadata);
  AtomicFileWriter file(path);
  file.write(header.data(), header.size());
  for (size_t t : order) {
    const StreamedTensor& want = tensors[t];
    torch::Tensor values = want.values();
    if (!values.defined() || values.sizes().vec() != want.shape) {
      throw BadInput("safetensors: tensor '" + want.name + "' of '" + path + "' was announced as " +
                     shape_text(want.shape) + " but made as " +
                     (values.defined() ? shape_text(values.sizes().vec()) : "undefined"));
    }
    values =
        values.detach().to(torch::kCPU, torch_dtype_of(want.dtype, path, want.name)).contiguous();
    file.write(values.data_ptr(), values.nbytes());
  }
  file.commit();
}

std::vector<size_t> plan_safetensors_shards(const std::vector<int64_t>& bytes,
                                            int64_t max_shard_bytes) {
  if (max_shard_bytes < 1) {
    throw BadInput("safetensors: max_shard_bytes must be at least 1, got " +
                   std::to_string(max_shard_bytes));
  }
  std::vector<size_t> plan;
  size_t shard = 0;
  int64_t used = 0;
  for (int64_t b : bytes) {
    if (used > 0 && used + b > max_shard_bytes) {
      ++shard;
      used = 0;
    }
    plan.push_back(shard);
    used += b;
  }
  return plan;
}

std::string safetensors_shard_name(size_t shard, size_t shards) {
  if (shards <= 1) return kSafetensorsFile;
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", shard + 1, shards);
  return name;
}

std::vector<std::string> finish_safetensors_checkpoint(const std::string& directory,
                                                       const std::vector<std::string>& names,
                                                       const std::vector<size_t>& plan,
                                                       int64_t total_bytes) {
  const fs::path dir(directory);
  std::error_code error;
  const size_t shards = plan.empty() ? 1 : plan.back() + 1;
  if (shards == 1) {
    // A single file replaces an older sharded save: its index would otherwise still be read.
    fs::remove(dir / kSafetensorsIndexFile, error);
    remove_stale_shards(dir, {});
    return {};
  }
  nlohmann::json weight_map = nlohmann::json::object();
  std::vector<std::string> files;
  for (size_t t = 0; t < names.size(); ++t) {
    weight_map[names[t]] = safetensors_shard_name(plan[t], shards);
  }
  for (size_t s = 0; s < shards; ++s) files.push_back(safetensors_shard_name(s, shards));
  const nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}},
                                {"weight_map", weight_map}};
  write_file_atomically((dir / kSafetensorsIndexFile).string(), index.dump(2) + "\n");
  // An older single-file save is what readers that look for model.safetensors first would load.
  fs::remove(dir / kSafetensorsFile, error);
  remove_stale_shards(dir, files);
  return {kSafetensorsIndexFile};
}

std::vector<std::string> write_safetensors_checkpoint(const std::string& directory,
                                                      const NamedTensorList& tensors,
                                                      const SafetensorsWriteOptions& options) {
  std::set<std::string> seen;
  std::vector<std::string> names;
  std::vector<int64_t> bytes;
  int64_t total = 0;
  for (const auto& item : tensors) {
    if (!seen.insert(item.first).second) {
      throw BadInput("safetensors: tensor '" + item.first + "' is given twice");
    }
    names.push_back(item.first);
    bytes.push_back(tensor_bytes(item.second));
    total += bytes.back();
  }
  const std::vector<size_t> plan = plan_safetensors_shards(bytes, options.max_shard_bytes());
  std::error_code error;
  fs::create_directories(directory, error);
  if (error) {
    throw FileError("cannot write '" + directory +
                    "': cannot create the directory: " + error.message());
  }
  const size_t shards = plan.empty() ? 1 : plan.back() + 1;
  std::vector<NamedTensorList> members(shards);
  for (size_t t = 0; t < tensors.size(); ++t) members[plan[t]].push_back(tensors[t]);
  std::vector<std::string> written;
  for (size_t s = 0; s < shards; ++s) {
    written.push_back(safetensors_shard_name(s, shards));
    write_safetensors_file((fs::path(directory) / written.back()).string(), members[s],
                           options.metadata());
  }
  for (const std::string& index : finish_safetensors_checkpoint(directory, names, plan, total)) {
    written.push_back(index);
  }
  return written;
}

}  // namespace pipetrain::io
