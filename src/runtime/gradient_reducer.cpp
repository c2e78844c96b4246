// Bucketed, overlapped data-parallel gradient sum (runtime/gradient_reducer.h).
#include "pipetrain/runtime/gradient_reducer.h"

#include <chrono>

#include <torch/torch.h>

#include "pipetrain/base/check.h"
#include "pipetrain/base/error.h"

namespace pipetrain {

GradientReducer::GradientReducer(std::shared_ptr<C10dGroup> group, std::int64_t bucket_bytes,
                                 CollectiveLog* log)
    : group_(std::move(group)), bucket_bytes_(bucket_bytes), log_(log) {
  PIPETRAIN_CHECK_INPUT(group_ != nullptr, "GradientReducer needs a data-parallel group");
  PIPETRAIN_CHECK_INPUT(bucket_bytes_ >= 1, "the gradient bucket size must be >= 1 byte (got ",
                        bucket_bytes_, ")");
}

torch::Tensor pack_gradients(const std::vector<torch::Tensor>& parameters,
                             const torch::Device& device) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> pieces;
  for (const auto& p : parameters) {
    const auto& grad = p.grad();
    pieces.push_back(grad.defined() ? grad.reshape({-1}).to(device, p.scalar_type())
                                    : torch::zeros({p.numel()}, p.options().device(device)));
  }
  return torch::cat(pieces);
}

void unpack_gradients(const std::vector<torch::Tensor>& parameters, const torch::Tensor& flat) {
  torch::NoGradGuard no_grad;
  std::int64_t at = 0;
  for (const auto& p : parameters) {
    auto sum = flat.narrow(0, at, p.numel()).view(p.sizes()).to(p.device());
    at += p.numel();
    if (p.grad().defined()) {
      p.mutable_grad().copy_(sum);
    } else {
      p.mutable_grad() = sum.clone();
    }
  }
}

void GradientReducer::launch(std::vector<torch::Tensor> parameters, int stage) {
  if (parameters.empty()) return;
  // Where the group sums (the CPU under Gloo, the GPU under NCCL), as
  // Distributed::allreduce_gradients sums them.
  const torch::Device device = group_->collective_device(parameters.front().device());
  Bucket bucket;
  bucket.flat = {pack_gradients(parameters, device)};
  bucket.stage = stage;
  bucket.start_us = CollectiveLog::now_us();
  bucket.parameters = std::move(parameters);
  bucket.wait = group_->allreduce_sum_start(bucket.flat);
  pending_.push_back(std::move(bucket));
}

void GradientReducer::start(const std::vector<torch::Tensor>& parameters, int stage) {
  std::vector<torch::Tensor> bucket;
  std::int64_t bytes = 0;
  for (const auto& p : parameters) {
    const std::int64_t size = p.numel() * static_cast<std::int64_t>(p.element_size());
    const bool other_dtype = !bucket.empty() && bucket.front().scalar_type() != p.scalar_type();
    if (!bucket.empty() && (bytes + size > bucket_bytes_ || other_dtype)) {
      launch(std::move(bucket), stage);
      bucket.clear();
      bytes = 0;
    }
    bucket.push_back(p);
    bytes += size;
  }
  launch(std::move(bucket), stage);
}

std::int64_t GradientReducer::pending_bytes() const {
  std::int64_t bytes = 0;
  for (const Bucket& bucket : pending_) bytes += static_cast<std::int64_t>(bucket.flat[0].nbytes());
  return bytes;
}

double GradientReducer::finish() {
  const auto begin = std::chrono::steady_clock::now();
  for (auto& bucket : pending_) {
    bucket.wait();
    if (log_) {
      log_->finished(CollectiveKind::kAllReduce, bucket.stage, bucket.start_us,
                     static_cast<std::int64_t>(bucket.flat[0].nbytes()));
    }
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  for (auto& bucket : pending_) unpack_gradients(bucket.parameters, bucket.flat[0]);
  pending_.clear();
  return waited;
}

}  // namespace pipetrain
