// Micro-batching: cutting a mini-batch (a tensor or a tuple of tensors) into M micro-batches
// along dim 0, and gluing outputs back together.
//
// Splitting is even-as-possible: with N rows and M = min(chunks, N) micro-batches, the first
// N % M micro-batches get ceil(N / M) rows and the others floor(N / M) (10 rows, 4 chunks ->
// 3,3,2,2). This differs from torch.chunk (which would give 3,3,3,1) on purpose: the slowest
// micro-batch sets the pipeline's pace, so the most even cut is the fastest. A batch with fewer
// rows than `chunks` is cut into one micro-batch per row. Every tensor of a tuple is cut at the
// same row offsets; micro-batches are views (no copy).
//
// Thread-safety: stateless.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

namespace pipetrain {

// Row counts of the micro-batches for `rows` rows and `chunks` requested micro-batches.
// REQUIRES: rows >= 1, chunks >= 1.
std::vector<int64_t> microbatch_sizes(int64_t rows, int64_t chunks);

// Cuts every tensor of `batch` along dim 0 into micro-batches of `sizes` rows. Result [i][t] is
// tensor t of micro-batch i (views of the batch; with one size, the batch's tensors themselves).
// Throws pipetrain::BadInput naming the tensor when a tensor has no dim 0 or the tensors disagree
// on their row count.
std::vector<std::vector<torch::Tensor>> split_microbatches(const std::vector<torch::Tensor>& batch,
                                                           const std::vector<int64_t>& sizes);

// Concatenates per-micro-batch outputs ([i][t]) back into one tuple along dim 0.
std::vector<torch::Tensor> join_microbatches(const std::vector<std::vector<torch::Tensor>>& parts);

}  // namespace pipetrain
