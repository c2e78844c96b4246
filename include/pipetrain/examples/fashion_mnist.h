// Fashion-MNIST: the gzipped IDX files of Debian's dataset-fashion-mnist package, read with zlib.
//
// The package installs, under /usr/share/datasets/fashion-mnist,
//   train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz   60000 images
//   t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz    10000 images
// of 28x28 grey-scale clothing pictures in 10 classes. IDX format (big-endian):
//   images: u32 magic 0x00000803, u32 count, u32 rows, u32 columns, count*rows*columns u8 pixels
//   labels: u32 magic 0x00000801, u32 count, count u8 labels
// Every header field, the exact payload length (no truncation, no trailing bytes) and the label
// range 0..9 are checked; anything wrong throws DataError naming the path and the problem.
// Plain (not gzipped) IDX files are accepted as well: zlib reads them through.
//
// Ownership: the returned tensors own their memory. Thread-safety: the functions share no state.
#pragma once

#include <cstdint>
#include <string>

#include <torch/types.h>

#include "pipetrain/examples/data_error.h"

namespace pipetrain::examples {

// The directory the Debian package installs the files into.
inline constexpr const char* kFashionMnistDirectory = "/usr/share/datasets/fashion-mnist";

// Per-pixel statistics of the 60000 training images, after scaling to [0, 1]. Used to normalize
// both splits (test images are normalized with the *training* statistics, as usual).
inline constexpr double kFashionMnistMean = 0.2860;
inline constexpr double kFashionMnistStd = 0.3530;

inline constexpr int64_t kFashionMnistClasses = 10;

enum class Split { kTrain, kTest };

struct LabeledImages {
  torch::Tensor images;  // float32 [N, 1, 28, 28], normalized: (pixel/255 - mean) / std
  torch::Tensor labels;  // int64 [N], in 0..9
};

// Reads one split from `directory` ("train" -> train-*, "test" -> t10k-*).
// Throws DataError naming the file on a missing, unreadable, corrupt or inconsistent file, and
// when the image and label files disagree on the count.
LabeledImages read_fashion_mnist(Split split,
                                 const std::string& directory = kFashionMnistDirectory);

// The two readers behind it, for any IDX file of this shape.
// Returns uint8 [N, rows, columns]. REQUIRES nothing; checks everything.
torch::Tensor read_idx_images(const std::string& path);
// Returns int64 [N]; every label must be < `classes`.
torch::Tensor read_idx_labels(const std::string& path, int64_t classes = kFashionMnistClasses);

// uint8 [N, rows, columns] -> float32 [N, 1, rows, columns], (x/255 - mean) / std.
torch::Tensor normalize_images(const torch::Tensor& pixels, double mean = kFashionMnistMean,
                               double std = kFashionMnistStd);

}  // namespace pipetrain::examples
