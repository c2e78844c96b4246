// The example models learn: short sequential runs. The full one-epoch CNN measurement is a
// disabled test, run by hand:
//   build/tests/tests_examples --gtest_also_run_disabled_tests --gtest_filter='*OneEpoch*'
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/examples/data_loader.h"
#include "pipetrain/examples/fashion_mnist.h"
#include "pipetrain/examples/gpt.h"
#include "pipetrain/examples/model_registry.h"
#include "pipetrain/examples/text_corpus.h"

namespace pipetrain::examples {
namespace {

double accuracy(torch::nn::Sequential& model, const LabeledImages& data) {
  torch::NoGradGuard no_grad;
  model->eval();
  int64_t correct = 0;
  for (int64_t start = 0; start < data.images.size(0); start += 1000) {
    int64_t n = std::min<int64_t>(1000, data.images.size(0) - start);
    torch::Tensor out = model->forward(data.images.narrow(0, start, n));
    correct += out.argmax(1).eq(data.labels.narrow(0, start, n)).sum().item<int64_t>();
  }
  model->train();
  return static_cast<double>(correct) / static_cast<double>(data.images.size(0));
}

TEST(Training, GptLossFallsWellBelowTheUnigramEntropyOfTheCorpus) {
  if (!std::filesystem::exists(kDefaultCorpusPath)) GTEST_SKIP();
  CharCorpus corpus = CharCorpus::from_file();
  torch::manual_seed(0);
  Gpt gpt = make_gpt(GptOptions(corpus.vocab_size()).context(32).embed_dim(48).heads(3).layers(2));
  torch::optim::Adam optimizer(gpt.model->parameters(), torch::optim::AdamOptions(3e-3));
  double smoothed = 0.0;
  for (int64_t step = 0; step < 200; ++step) {
    TokenWindows batch = corpus.sample_windows(32, 32, 1, step);
    optimizer.zero_grad();
    torch::Tensor loss = gpt_loss(gpt.model->forward(batch.inputs), batch.targets);
    loss.backward();
    optimizer.step();
    smoothed = step == 0 ? loss.item<double>() : 0.9 * smoothed + 0.1 * loss.item<double>();
  }
  double entropy = corpus.unigram_entropy();
  std::printf("gpt after 200 steps: loss %.3f, unigram entropy %.3f nats\n", smoothed, entropy);
  EXPECT_LT(smoothed, entropy - 0.4);
}

TEST(Training, MlpLearnsFashionMnistInAFewHundredSteps) {
  if (!std::filesystem::exists(std::string(kFashionMnistDirectory) +
                               "/t10k-images-idx3-ubyte.gz")) {
    GTEST_SKIP();
  }
  LabeledImages test = read_fashion_mnist(Split::kTest);
  torch::manual_seed(0);
  ExampleModel mlp = make_model("mlp");
  torch::optim::Adam optimizer(mlp.sequential->parameters(), torch::optim::AdamOptions(1e-3));
  // Train on the first 8000 test images, measure on the last 2000 (a quick learning check).
  DataLoader loader(test.images.narrow(0, 0, 8000), test.labels.narrow(0, 0, 8000),
                    DataLoaderOptions(100).seed(1));
  for (int k = 0; k < 160; ++k) {
    Batch batch = loader.next();
    optimizer.zero_grad();
    mlp.loss(mlp.sequential->forward(batch.inputs), batch.targets).backward();
    optimizer.step();
  }
  LabeledImages held_out{test.images.narrow(0, 8000, 2000), test.labels.narrow(0, 8000, 2000)};
  EXPECT_GT(accuracy(mlp.sequential, held_out), 0.75);
}

TEST(Training, DISABLED_CnnReaches88PercentInOneEpoch) {
  LabeledImages train = read_fashion_mnist(Split::kTrain);
  LabeledImages test = read_fashion_mnist(Split::kTest);
  torch::manual_seed(0);
  ExampleModel cnn = make_model("cnn");
  torch::optim::Adam optimizer(cnn.sequential->parameters(), torch::optim::AdamOptions(1e-3));
  DataLoader loader(train.images, train.labels, DataLoaderOptions(128).seed(0));
  auto start = std::chrono::steady_clock::now();
  std::clock_t cpu_start = std::clock();
  for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    Batch batch = loader.next();
    optimizer.zero_grad();
    torch::Tensor loss = cnn.loss(cnn.sequential->forward(batch.inputs), batch.targets);
    loss.backward();
    optimizer.step();
    if (b % 100 == 0) std::printf("batch %lld loss %.4f\n", (long long)b, loss.item<double>());
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // CPU time tells the cost on an idle machine when other jobs share the cores.
  double cpu_seconds = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  double acc = accuracy(cnn.sequential, test);
  std::printf("cnn: 1 epoch in %.1f s wall, %.1f s CPU (%d threads), test accuracy %.4f\n", seconds,
              cpu_seconds, at::get_num_threads(), acc);
  EXPECT_GE(acc, 0.88);
}

}  // namespace
}  // namespace pipetrain::examples
