#include "pipetrain/examples/fashion_mnist.h"

#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace pipetrain::examples {
namespace {

namespace fs = std::filesystem;

bool have_fashion_mnist() {
  return fs::exists(std::string(kFashionMnistDirectory) + "/train-images-idx3-ubyte.gz");
}

// A scratch directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "pipetrain-idx-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void put_u32(std::vector<uint8_t>& bytes, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8)
    bytes.push_back(static_cast<uint8_t>(value >> shift));
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  gzclose(file);
}

std::vector<uint8_t> image_file(uint32_t magic, uint32_t count, uint32_t rows, uint32_t columns,
                                size_t pixels) {
  std::vector<uint8_t> bytes;
  put_u32(bytes, magic);
  put_u32(bytes, count);
  put_u32(bytes, rows);
  put_u32(bytes, columns);
  for (size_t n = 0; n < pixels; ++n) bytes.push_back(static_cast<uint8_t>(n % 251));
  return bytes;
}

// Runs `read` and returns the DataError message ("" when nothing was thrown).
template <typename Read>
std::string error_of(Read read) {
  try {
    read();
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(FashionMnist, ReadsSixtyThousandTrainingImagesWithLabelsZeroToNine) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  auto start = std::chrono::steady_clock::now();
  std::clock_t cpu_start = std::clock();
  LabeledImages train = read_fashion_mnist(Split::kTrain);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double cpu_seconds = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  EXPECT_EQ(train.images.sizes(), torch::IntArrayRef({60000, 1, 28, 28}));
  EXPECT_EQ(train.images.scalar_type(), torch::kFloat32);
  EXPECT_EQ(train.labels.sizes(), torch::IntArrayRef({60000}));
  EXPECT_EQ(train.labels.scalar_type(), torch::kInt64);
  EXPECT_EQ(train.labels.min().item<int64_t>(), 0);
  EXPECT_EQ(train.labels.max().item<int64_t>(), 9);
  // Fashion-MNIST is balanced: 6000 training images per class (its published description).
  EXPECT_TRUE(torch::bincount(train.labels).eq(6000).all().item<bool>());
  // Normalized with the training statistics: mean about 0 and std about 1.
  EXPECT_NEAR(train.images.mean().item<double>(), 0.0, 0.01);
  EXPECT_NEAR(train.images.std().item<double>(), 1.0, 0.01);
  // The budget is 1 s on an idle machine; allow for other builds running beside the tests.
  EXPECT_LT(seconds, 5.0) << "reading the training split took " << seconds << " s";
  std::printf("read 60000 training images in %.3f s wall, %.3f s CPU\n", seconds, cpu_seconds);
}

TEST(FashionMnist, ReadsTenThousandTestImages) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  LabeledImages test = read_fashion_mnist(Split::kTest);
  EXPECT_EQ(test.images.size(0), 10000);
  EXPECT_EQ(test.labels.size(0), 10000);
  EXPECT_TRUE(torch::bincount(test.labels).eq(1000).all().item<bool>());
}

TEST(FashionMnist, MissingDirectoryNamesTheFile) {
  std::string message = error_of([] { read_fashion_mnist(Split::kTest, "/nonexistent/dir"); });
  EXPECT_NE(message.find("/nonexistent/dir/t10k-images-idx3-ubyte.gz"), std::string::npos)
      << message;
}

TEST(FashionMnist, ReadsAWellFormedSmallFileExactly) {
  TempDir dir;
  std::string path = dir.file("images.gz");
  write_gz(path, image_file(0x803, 3, 2, 4, 3 * 2 * 4));
  torch::Tensor images = read_idx_images(path);
  ASSERT_EQ(images.sizes(), torch::IntArrayRef({3, 2, 4}));
  EXPECT_EQ(images[2][1][3].item<int>(), 23);  // pixel number 2*8 + 1*4 + 3
}

TEST(FashionMnist, TruncatedImageFileIsAnErrorNamingThePath) {
  TempDir dir;
  std::string path = dir.file("truncated.gz");
  write_gz(path, image_file(0x803, 10, 28, 28, 5 * 28 * 28));
  std::string message = error_of([&] { read_idx_images(path); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
}

TEST(FashionMnist, TrailingBytesAreAnError) {
  TempDir dir;
  std::string path = dir.file("long.gz");
  write_gz(path, image_file(0x803, 1, 2, 2, 5));
  std::string message = error_of([&] { read_idx_images(path); });
  EXPECT_NE(message.find("trailing"), std::string::npos) << message;
}

TEST(FashionMnist, WrongMagicNumberIsAnErrorNamingBothNumbers) {
  TempDir dir;
  std::string path = dir.file("labels-as-images.gz");
  write_gz(path, image_file(0x801, 1, 2, 2, 4));
  std::string message = error_of([&] { read_idx_images(path); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("0x00000801"), std::string::npos) << message;
  EXPECT_NE(message.find("0x00000803"), std::string::npos) << message;
}

TEST(FashionMnist, LabelOutsideTheClassesIsAnError) {
  TempDir dir;
  std::string path = dir.file("labels.gz");
  std::vector<uint8_t> bytes;
  put_u32(bytes, 0x801);
  put_u32(bytes, 3);
  bytes.insert(bytes.end(), {1, 12, 3});
  write_gz(path, bytes);
  std::string message = error_of([&] { read_idx_labels(path); });
  EXPECT_NE(message.find("label 12 at index 1"), std::string::npos) << message;
}

TEST(FashionMnist, CorruptGzipStreamIsAnErrorNamingThePath) {
  TempDir dir;
  std::string path = dir.file("corrupt.gz");
  std::string good = dir.file("good.gz");
  write_gz(good, image_file(0x803, 100, 28, 28, 100 * 28 * 28));
  // Keep the gzip header, garble the deflate stream behind it.
  std::vector<char> bytes(fs::file_size(good));
  {
    std::FILE* in = std::fopen(good.c_str(), "rb");
    ASSERT_EQ(std::fread(bytes.data(), 1, bytes.size(), in), bytes.size());
    std::fclose(in);
  }
  for (size_t n = 20; n < bytes.size(); n += 3) bytes[n] = static_cast<char>(bytes[n] ^ 0x5a);
  std::FILE* out = std::fopen(path.c_str(), "wb");
  std::fwrite(bytes.data(), 1, bytes.size(), out);
  std::fclose(out);
  std::string message = error_of([&] { read_idx_images(path); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
}

TEST(FashionMnist, HeaderCutShortIsAnError) {
  TempDir dir;
  std::string path = dir.file("short.gz");
  write_gz(path, {0, 0, 8, 3, 0, 0});
  std::string message = error_of([&] { read_idx_images(path); });
  EXPECT_NE(message.find("header"), std::string::npos) << message;
}

}  // namespace
}  // namespace pipetrain::examples
