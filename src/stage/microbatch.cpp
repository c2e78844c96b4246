// Even-as-possible micro-batch splitting (include/pipetrain/stage/microbatch.h).
#include "pipetrain/stage/microbatch.h"

#include <algorithm>

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include "pipetrain/base/check.h"

namespace pipetrain {

std::vector<int64_t> microbatch_sizes(int64_t rows, int64_t chunks) {
  PIPETRAIN_CHECK_INPUT(rows >= 1, "a mini-batch needs at least one row along dim 0 (got ", rows,
                        ")");
  PIPETRAIN_CHECK_INPUT(chunks >= 1, "chunks must be at least 1 (got ", chunks, ")");
  const int64_t m = std::min(rows, chunks);
  std::vector<int64_t> sizes(static_cast<size_t>(m), rows / m);
  for (int64_t i = 0; i < rows % m; ++i) ++sizes[static_cast<size_t>(i)];
  return sizes;
}

std::vector<std::vector<torch::Tensor>> split_microbatches(const std::vector<torch::Tensor>& batch,
                                                           const std::vector<int64_t>& sizes) {
  PIPETRAIN_CHECK_INPUT(!batch.empty(),
                        "cannot split an empty tuple of tensors into micro-batches");
  int64_t total = 0;
  for (int64_t size : sizes) total += size;
  for (size_t t = 0; t < batch.size(); ++t) {
    PIPETRAIN_CHECK_INPUT(
        batch[t].defined() && batch[t].dim() >= 1, "tensor ", t,
        " of the mini-batch has no dim 0 to split into micro-batches; give every input "
        "a leading batch dimension");
    PIPETRAIN_CHECK_INPUT(batch[t].size(0) == total, "tensor ", t, " of the mini-batch has ",
                          batch[t].size(0), " rows but tensor 0 has ", total,
                          "; every tensor of a tuple must have the same number of rows (dim 0)");
  }
  // One micro-batch is the batch itself (no narrow: a view op per tensor every step).
  if (sizes.size() == 1) return {batch};
  std::vector<std::vector<torch::Tensor>> parts(sizes.size());
  for (size_t t = 0; t < batch.size(); ++t) {
    int64_t offset = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      parts[i].push_back(batch[t].narrow(0, offset, sizes[i]));
      offset += sizes[i];
    }
  }
  return parts;
}

std::vector<torch::Tensor> join_microbatches(const std::vector<std::vector<torch::Tensor>>& parts) {
  PIPETRAIN_CHECK_INPUT(!parts.empty(), "no micro-batch outputs to join");
  std::vector<torch::Tensor> joined;
  for (size_t t = 0; t < parts[0].size(); ++t) {
    std::vector<torch::Tensor> pieces;
    pieces.reserve(parts.size());
    for (const auto& part : parts) {
      PIPETRAIN_CHECK_INPUT(part.size() == parts[0].size(),
                            "micro-batch outputs disagree on tuple size (", part.size(), " vs ",
                            parts[0].size(), ")");
      pieces.push_back(part[t]);
    }
    joined.push_back(torch::cat(pieces, 0));
  }
  return joined;
}

}  // namespace pipetrain
