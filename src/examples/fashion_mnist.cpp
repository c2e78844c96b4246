// Fashion-MNIST IDX reader (fashion_mnist.h): zlib stream -> validated header -> tensor.
#include "pipetrain/examples/fashion_mnist.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include <ATen/Parallel.h>

namespace pipetrain::examples {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
constexpr uint32_t kMaxSide = 4096;            // a sanity bound against a garbage header

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw DataError("data file '" + path + "': " + problem);
}

struct GzCloser {
  void operator()(gzFile_s* file) const { gzclose(file); }
};

// A gz (or plain) file read sequentially; every short read is an error naming the path.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0) {
      fail(path, std::string(std::strerror(errno)) +
                     " (install Debian's dataset-fashion-mnist package, or pass the directory "
                     "that holds the IDX files)");
    }
    if (!S_ISREG(info.st_mode)) fail(path, "not a regular file");
    file_.reset(gzopen(path.c_str(), "rb"));
    if (!file_) fail(path, std::string("cannot open: ") + std::strerror(errno));
    gzbuffer(file_.get(), 1 << 20);
  }

  // Reads up to `size` bytes; returns how many were read (fewer only at the end of the data).
  size_t read_some(uint8_t* out, size_t size) {
    size_t done = 0;
    while (done < size) {
      unsigned chunk = static_cast<unsigned>(std::min<size_t>(size - done, 1u << 24));
      int got = gzread(file_.get(), out + done, chunk);
      if (got < 0) {
        int code = 0;
        const char* message = gzerror(file_.get(), &code);
        fail(path_, std::string("corrupt gzip stream: ") + (message ? message : "unknown error"));
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    // zlib reports a truncated gzip member as a short read plus Z_BUF_ERROR; surface it.
    if (done < size) {
      int code = 0;
      const char* message = gzerror(file_.get(), &code);
      if (code != Z_OK && code != Z_STREAM_END) {
        fail(path_, std::string("corrupt or truncated gzip stream: ") +
                        (message ? message : "unknown error"));
      }
    }
    return done;
  }

  uint32_t read_u32_big_endian(const char* field) {
    uint8_t bytes[4];
    if (read_some(bytes, 4) != 4)
      fail(path_, std::string("file ends inside the header (") + field + ")");
    return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) |
           uint32_t{bytes[3]};
  }

  // Reads exactly `size` payload bytes and checks that nothing follows them.
  std::vector<uint8_t> read_payload(size_t size) {
    std::vector<uint8_t> data;
    // Grow while reading instead of trusting the header for one huge allocation; the reserve is
    // capped so that a garbage count costs address space, not memory.
    data.reserve(std::min(size, size_t{1} << 28));
    constexpr size_t kStep = size_t{1} << 22;
    while (data.size() < size) {
      size_t old = data.size();
      size_t want = std::min(kStep, size - old);
      data.resize(old + want);
      size_t got = read_some(data.data() + old, want);
      if (got < want) {
        fail(path_, "truncated: the header promises " + std::to_string(size) +
                        " payload bytes but the file holds " + std::to_string(old + got));
      }
    }
    uint8_t extra = 0;
    if (read_some(&extra, 1) != 0) {
      fail(path_, "trailing bytes after the " + std::to_string(size) +
                      " payload bytes the header promises");
    }
    return data;
  }

 private:
  std::string path_;
  std::unique_ptr<gzFile_s, GzCloser> file_;
};

std::string hex(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", value);
  return text;
}

}  // namespace

torch::Tensor read_idx_images(const std::string& path) {
  GzReader reader(path);
  uint32_t magic = reader.read_u32_big_endian("magic number");
  if (magic != kImagesMagic) {
    fail(path, "bad magic number " + hex(magic) + ", expected " + hex(kImagesMagic) +
                   " (IDX unsigned-byte images); is this a label file or not an IDX file?");
  }
  uint32_t count = reader.read_u32_big_endian("image count");
  uint32_t rows = reader.read_u32_big_endian("row count");
  uint32_t columns = reader.read_u32_big_endian("column count");
  if (count == 0) fail(path, "the header says it holds 0 images");
  if (rows == 0 || columns == 0 || rows > kMaxSide || columns > kMaxSide) {
    fail(path, "implausible image size " + std::to_string(rows) + "x" + std::to_string(columns));
  }
  size_t size = size_t{count} * rows * columns;
  // The tensor adopts the vector's buffer: no copy of the 47 MB of training pixels.
  auto* pixels = new std::vector<uint8_t>(reader.read_payload(size));
  return torch::from_blob(
      pixels->data(), {count, rows, columns}, [pixels](void*) { delete pixels; }, torch::kUInt8);
}

torch::Tensor read_idx_labels(const std::string& path, int64_t classes) {
  GzReader reader(path);
  uint32_t magic = reader.read_u32_big_endian("magic number");
  if (magic != kLabelsMagic) {
    fail(path, "bad magic number " + hex(magic) + ", expected " + hex(kLabelsMagic) +
                   " (IDX unsigned-byte labels); is this an image file or not an IDX file?");
  }
  uint32_t count = reader.read_u32_big_endian("label count");
  if (count == 0) fail(path, "the header says it holds 0 labels");
  std::vector<uint8_t> bytes = reader.read_payload(count);
  torch::Tensor labels = torch::empty({count}, torch::kInt64);
  int64_t* out = labels.data_ptr<int64_t>();
  for (size_t n = 0; n < bytes.size(); ++n) {
    if (bytes[n] >= classes) {
      fail(path, "label " + std::to_string(bytes[n]) + " at index " + std::to_string(n) +
                     " is outside 0.." + std::to_string(classes - 1));
    }
    out[n] = bytes[n];
  }
  return labels;
}

torch::Tensor normalize_images(const torch::Tensor& pixels, double mean, double std) {
  TORCH_CHECK(pixels.dim() == 3, "normalize_images expects [N, rows, columns], got ",
              pixels.sizes());
  TORCH_CHECK(pixels.scalar_type() == torch::kUInt8, "normalize_images expects uint8 pixels, got ",
              pixels.scalar_type());
  // One pass through a 256-entry table instead of four passes over the float tensor.
  float table[256];
  for (int v = 0; v < 256; ++v) table[v] = static_cast<float>((v / 255.0 - mean) / std);
  torch::Tensor source = pixels.contiguous();
  torch::Tensor out = torch::empty({pixels.size(0), 1, pixels.size(1), pixels.size(2)});
  const uint8_t* in = source.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, source.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) dst[n] = table[in[n]];
  });
  return out;
}

LabeledImages read_fashion_mnist(Split split, const std::string& directory) {
  std::string prefix = directory + "/" + (split == Split::kTrain ? "train" : "t10k");
  std::string images_path = prefix + "-images-idx3-ubyte.gz";
  std::string labels_path = prefix + "-labels-idx1-ubyte.gz";
  torch::Tensor pixels = read_idx_images(images_path);
  torch::Tensor labels = read_idx_labels(labels_path);
  if (pixels.size(0) != labels.size(0)) {
    throw DataError("data files '" + images_path + "' and '" + labels_path +
                    "' disagree: " + std::to_string(pixels.size(0)) + " images but " +
                    std::to_string(labels.size(0)) + " labels");
  }
  return {normalize_images(pixels), labels};
}

}  // namespace pipetrain::examples
