// Synthetic data for benchmarks and tests: random inputs and targets of given shapes, from a seed.
//
// Each call draws from its own torch CPU generator seeded with `seed`, so the result depends only
// on the arguments (not on the global torch seed, nor on what ran before, nor on thread count).
//
// Ownership: returned tensors own their memory. Thread-safety: no shared state.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

namespace pipetrain::examples {

struct SyntheticData {
  torch::Tensor inputs;
  torch::Tensor targets;
};

// inputs: float32 [samples, sample_shape...] ~ N(0, 1); targets: int64 [samples] in 0..classes-1.
// REQUIRES: samples > 0, classes > 0.
SyntheticData make_synthetic_classification(int64_t samples, std::vector<int64_t> sample_shape,
                                            int64_t classes, uint64_t seed);

// inputs: float32 [samples, input_shape...] ~ N(0, 1); targets: float32 [samples, target_shape...]
// ~ N(0, 1). REQUIRES: samples > 0.
SyntheticData make_synthetic_regression(int64_t samples, std::vector<int64_t> input_shape,
                                        std::vector<int64_t> target_shape, uint64_t seed);

// int64 tokens [samples, length] in 0..vocab_size-1 and their next-token targets (the same
// sequence shifted by one), for language-model benchmarks. REQUIRES: all > 0.
SyntheticData make_synthetic_tokens(int64_t samples, int64_t length, int64_t vocab_size,
                                    uint64_t seed);

}  // namespace pipetrain::examples
