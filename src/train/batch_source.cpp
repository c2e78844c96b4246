#include "pipetrain/train/batch_source.h"

#include <torch/torch.h>

#include "pipetrain/base/check.h"

namespace pipetrain::train {

TensorBatches::TensorBatches(torch::Tensor inputs, torch::Tensor targets, int64_t batch_size)
    : inputs_(std::move(inputs)), targets_(std::move(targets)), batch_size_(batch_size) {
  PIPETRAIN_CHECK_INPUT(batch_size_ >= 1, "batch size must be >= 1, got ", batch_size_);
  PIPETRAIN_CHECK_INPUT(inputs_.defined() && targets_.defined() && inputs_.dim() >= 1 &&
                            targets_.dim() >= 1 && inputs_.size(0) >= 1,
                        "TensorBatches needs inputs and targets with at least one row");
  PIPETRAIN_CHECK_INPUT(inputs_.size(0) == targets_.size(0), "inputs have ", inputs_.size(0),
                        " rows but targets have ", targets_.size(0));
}

std::pair<torch::Tensor, torch::Tensor> TensorBatches::at(int64_t k) const {
  const int64_t rows = inputs_.size(0);
  const torch::Tensor index =
      (torch::arange(batch_size_, torch::kLong) + k * batch_size_).remainder(rows);
  return {inputs_.index_select(0, index), targets_.index_select(0, index)};
}

int64_t TensorBatches::per_epoch() const {
  return (inputs_.size(0) + batch_size_ - 1) / batch_size_;
}

}  // namespace pipetrain::train
