// Bucketed, overlapped data-parallel gradient sum (runtime/gradient_reducer.h).
#include "pipetrain/runtime/gradient_reducer.h"

#include <algorithm>
#include <chrono>

#include <torch/torch.h>

#include "pipetrain/base/check.h"
#include "pipetrain/base/error.h"
#include "pipetrain/stage/tensor_bytes.h"

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

GradientReducer::Bucket GradientReducer::launch(std::vector<torch::Tensor> parameters,
                                                int stage) const {
  // Where the group sums (the CPU under Gloo, the GPU under NCCL), as
  // Distributed::allreduce_gradients sums them.
  const torch::Device device = group_->collective_device(parameters.front().device());
  Bucket bucket;
  bucket.flat = {pack_gradients(parameters, device)};
  bucket.stage = stage;
  bucket.start_us = CollectiveLog::now_us();
  bucket.parameters = std::move(parameters);
  bucket.wait = group_->allreduce_sum_start(bucket.flat);
  return bucket;
}

void GradientReducer::submit(std::vector<torch::Tensor> parameters, int stage) {
  if (parameters.empty()) return;
  const bool on_cpu = std::all_of(parameters.begin(), parameters.end(),
                                  [](const torch::Tensor& p) { return p.device().is_cpu(); });
  // On a GPU the pack is an asynchronous copy on the compute stream: here, in the queue's order.
  thread_.submit_or_run_here(
      [this, parameters = std::move(parameters), stage]() mutable {
        pending_.push_back(launch(std::move(parameters), stage));
      },
      /*run_here=*/!on_cpu);
}

std::vector<std::vector<torch::Tensor>> cut_into_buckets(const std::vector<torch::Tensor>& tensors,
                                                         std::int64_t bucket_bytes) {
  std::vector<std::vector<torch::Tensor>> buckets;
  std::int64_t bytes = 0;
  for (const auto& t : tensors) {
    const std::int64_t size = tensor_bytes(t);
    const bool fresh = buckets.empty() || bytes + size > bucket_bytes ||
                       buckets.back().front().scalar_type() != t.scalar_type();
    if (fresh) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(t);
    bytes += size;
  }
  return buckets;
}

void GradientReducer::start(const std::vector<torch::Tensor>& parameters, int stage) {
  for (std::vector<torch::Tensor>& bucket : cut_into_buckets(parameters, bucket_bytes_)) {
    ++started_;
    for (const auto& p : bucket) {  // pack_gradients keeps each parameter's dtype
      started_bytes_ += tensor_bytes(p);
    }
    submit(std::move(bucket), stage);
  }
}

double GradientReducer::finish() {
  const auto begin = std::chrono::steady_clock::now();
  thread_.drain();  // what the thread still packs is exposed too
  std::vector<Bucket> buckets;
  buckets.swap(pending_);
  for (auto& bucket : buckets) {
    bucket.wait();
    if (log_) {
      log_->finished(CollectiveKind::kAllReduce, bucket.stage, bucket.start_us,
                     static_cast<std::int64_t>(bucket.flat[0].nbytes()));
    }
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  for (auto& bucket : buckets) unpack_gradients(bucket.parameters, bucket.flat[0]);
  started_ = 0;
  started_bytes_ = 0;
  return waited;
}

}  // namespace pipetrain
