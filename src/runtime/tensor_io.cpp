// Tensor files shared with Python (include/pipetrain/runtime/tensor_io.h).
#include "pipetrain/runtime/tensor_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>

#include <ATen/core/Dict.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>

#include "pipetrain/base/check.h"

namespace pipetrain {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

std::string directory_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Writes all of `bytes` to `fd`, retrying short writes and EINTR.
bool write_all(int fd, const char* bytes, size_t size) {
  while (size > 0) {
    const ssize_t written = ::write(fd, bytes, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    bytes += written;
    size -= static_cast<size_t>(written);
  }
  return true;
}

}  // namespace

std::vector<char> pickle_for_python(const torch::IValue& value) {
  // As torch::pickle_save, but without the type tags it adds to dicts and lists
  // (torch.jit._pickle.restore_type_tag), which torch.load's default weights_only=True refuses.
  std::vector<char> pickled;
  torch::jit::Pickler pickler(
      [&](const char* bytes, size_t size) { pickled.insert(pickled.end(), bytes, bytes + size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    const char* bytes = static_cast<const char*>(data);
    archive.insert(archive.end(), bytes, bytes + size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  return archive;
}

namespace {

class BoundedReader final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BoundedReader(const std::vector<char>& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<size_t>(n, bytes_.size() - static_cast<size_t>(pos));
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  const std::vector<char>& bytes_;  // outlives the reader (load_pickle's argument)
};

}  // namespace

torch::IValue load_pickle(const std::vector<char>& bytes) {
  // What torch::pickle_load does, with a reader of our own.
  caffe2::serialize::PyTorchStreamReader reader(std::make_shared<BoundedReader>(bytes));
  return torch::jit::readArchiveAndTensors("data", /*pickle_prefix=*/"", /*tensor_prefix=*/"",
                                           /*type_resolver=*/std::nullopt,
                                           /*obj_loader=*/std::nullopt, /*device=*/std::nullopt,
                                           reader);
}

torch::Tensor load_tensor(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  PIPETRAIN_CHECK(file.good(), FileError, "cannot open tensor file '", path, "': ", errno_text(),
                  "; write one from Python with torch.save(tensor, path)");
  std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  PIPETRAIN_CHECK(!file.bad(), FileError, "cannot read tensor file '", path, "': ", errno_text());
  torch::IValue value;
  try {
    value = load_pickle(bytes);
  } catch (const c10::Error& error) {
    throw BadInput(c10::str("'", path, "' is not a file written by torch.save (", error.msg(),
                            "); write one from Python with torch.save(tensor, path)"));
  }
  PIPETRAIN_CHECK_INPUT(value.isTensor(), "'", path, "' holds a ", value.tagKind(),
                        ", not a tensor; save a single tensor with torch.save(tensor, path)");
  return value.toTensor();
}

void save_named_tensors(const std::string& path,
                        const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  std::set<std::string> seen;
  for (const auto& [name, tensor] : tensors) {
    PIPETRAIN_CHECK_INPUT(seen.insert(name).second, "save_named_tensors('", path, "'): the name '",
                          name, "' appears twice; names must be unique");
    PIPETRAIN_CHECK_INPUT(tensor.defined(), "save_named_tensors('", path, "'): tensor '", name,
                          "' is undefined");
    dict.insert(name, tensor.detach().cpu());
  }
  const std::vector<char> bytes = pickle_for_python(dict);

  // Unique temporary name beside the target, so rename() stays within one file system.
  static std::atomic<unsigned> counter{0};
  const std::string temporary =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  PIPETRAIN_CHECK(fd >= 0, FileError, "cannot write '", path, "': creating '", temporary,
                  "' failed: ", errno_text(), "; check that the directory exists and is writable");
  const bool written = write_all(fd, bytes.data(), bytes.size()) && ::fsync(fd) == 0;
  const std::string write_error = written ? "" : errno_text();
  const bool closed = ::close(fd) == 0;
  if (!written || !closed) {
    ::unlink(temporary.c_str());
    throw FileError(c10::str("cannot write '", path, "' (via '", temporary, "'): ",
                             written ? errno_text() : write_error, "; check free disk space"));
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string rename_error = errno_text();
    ::unlink(temporary.c_str());
    throw FileError(c10::str("cannot rename '", temporary, "' to '", path, "': ", rename_error));
  }
  // Make the rename itself durable; failure here leaves a complete file, so it is not an error.
  const int directory = ::open(directory_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (directory >= 0) {
    ::fsync(directory);
    ::close(directory);
  }
}

}  // namespace pipetrain
