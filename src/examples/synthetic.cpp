// Seeded random data sets (synthetic.h).
#include "pipetrain/examples/synthetic.h"

#include <ATen/CPUGeneratorImpl.h>

namespace pipetrain::examples {
namespace {

std::vector<int64_t> with_samples(int64_t samples, const std::vector<int64_t>& shape) {
  std::vector<int64_t> sizes{samples};
  sizes.insert(sizes.end(), shape.begin(), shape.end());
  return sizes;
}

}  // namespace

SyntheticData make_synthetic_classification(int64_t samples, std::vector<int64_t> sample_shape,
                                            int64_t classes, uint64_t seed) {
  TORCH_CHECK(samples > 0 && classes > 0, "synthetic classification needs samples > 0 and ",
              "classes > 0, got ", samples, " and ", classes);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::Tensor inputs = at::randn(with_samples(samples, sample_shape), generator);
  torch::Tensor targets = at::randint(classes, {samples}, generator, torch::kInt64);
  return {inputs, targets};
}

SyntheticData make_synthetic_regression(int64_t samples, std::vector<int64_t> input_shape,
                                        std::vector<int64_t> target_shape, uint64_t seed) {
  TORCH_CHECK(samples > 0, "synthetic regression needs samples > 0, got ", samples);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::Tensor inputs = at::randn(with_samples(samples, input_shape), generator);
  torch::Tensor targets = at::randn(with_samples(samples, target_shape), generator);
  return {inputs, targets};
}

SyntheticData make_synthetic_tokens(int64_t samples, int64_t length, int64_t vocab_size,
                                    uint64_t seed) {
  TORCH_CHECK(samples > 0 && length > 0 && vocab_size > 0,
              "synthetic tokens need samples, length and vocab_size > 0, got ", samples, ", ",
              length, ", ", vocab_size);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::Tensor stream = at::randint(vocab_size, {samples, length + 1}, generator, torch::kInt64);
  using torch::indexing::Slice;
  return {stream.index({Slice(), Slice(0, length)}).contiguous(),
          stream.index({Slice(), Slice(1, length + 1)}).contiguous()};
}

}  // namespace pipetrain::examples
