// Seeded, reproducible orders: the sample order of an epoch, the same on every rank, thread count
// and standard library.
//
//   mix_seed(seed, counter)       a well-spread 64-bit seed from a pair (splitmix64's finalizer),
//                                 so nearby pairs (seed, epoch) give unrelated streams
//   uniform_below(engine, bound)  an unbiased draw in [0, bound) by rejection (the same on every
//                                 standard library, unlike std::uniform_int_distribution)
//   shuffled_order(n, seed, e)    a Fisher-Yates permutation of 0..n-1 driven by
//                                 std::mt19937_64(mix_seed(seed, e))
//
// A data set that shuffles per epoch (examples' DataLoader, train/token_batches.h) draws its order
// from shuffled_order, so resuming needs only (seed, epoch, batch).
//
// Torch-free. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

namespace pipetrain {

inline uint64_t mix_seed(uint64_t seed, uint64_t counter) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (counter + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// REQUIRES bound > 0.
template <typename Engine>
uint64_t uniform_below(Engine& engine, uint64_t bound) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t draw;
  do {
    draw = engine();
  } while (draw >= limit);
  return draw % bound;
}

// A permutation of 0..n-1 that depends only on (n, seed, epoch).
inline std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed, uint64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n > 0 ? n : 0));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::mt19937_64 engine(mix_seed(seed, epoch));
  for (size_t m = order.size(); m > 1; --m) std::swap(order[m - 1], order[uniform_below(engine, m)]);
  return order;
}

}  // namespace pipetrain
