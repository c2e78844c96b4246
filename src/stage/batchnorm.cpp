// DeferredBatchNorm (include/pipetrain/stage/batchnorm.h).
#include "pipetrain/stage/batchnorm.h"

#include <cmath>

#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <torch/nn/modules/batchnorm.h>

#include "pipetrain/base/check.h"
#include "pipetrain/stage/skip.h"
#include "pipetrain/stage/torchscript.h"

namespace pipetrain {

DeferredBatchNormImpl::DeferredBatchNormImpl(DeferredBatchNormOptions options_)
    : options(std::move(options_)) {
  reset();
}

DeferredBatchNormImpl::DeferredBatchNormImpl(DeferredBatchNormOptions options_,
                                             DeferredBatchNormTensors shared)
    : options(std::move(options_)), shared_(std::move(shared)) {
  reset();
}

void DeferredBatchNormImpl::reset() {
  PIPETRAIN_CHECK_INPUT(options.num_features() > 0,
                        "DeferredBatchNorm needs num_features >= 1, got ", options.num_features());
  PIPETRAIN_CHECK_INPUT(options.chunks() >= 1,
                        "DeferredBatchNorm needs chunks >= 1 (micro-batches per ",
                        "mini-batch), got ", options.chunks());
  const int64_t c = options.num_features();
  // The shared tensors serve the constructor's reset() only; a later reset() (clone) makes fresh
  // ones, into which Cloneable copies the values.
  DeferredBatchNormTensors tensors;
  if (shared_) {
    tensors = std::move(*shared_);
    shared_.reset();
    auto check = [c](const torch::Tensor& tensor, const char* name) {
      PIPETRAIN_CHECK_INPUT(tensor.defined() && tensor.dim() == 1 && tensor.size(0) == c,
                            "DeferredBatchNorm(", c, "): the shared ", name, " must have shape [",
                            c, "], got ",
                            tensor.defined() ? c10::str(tensor.sizes()) : "undefined");
    };
    if (options.affine()) {
      check(tensors.weight, "weight");
      check(tensors.bias, "bias");
    }
    check(tensors.running_mean, "running_mean");
    check(tensors.running_var, "running_var");
    PIPETRAIN_CHECK_INPUT(
        tensors.num_batches_tracked.defined() && tensors.num_batches_tracked.numel() == 1,
        "DeferredBatchNorm: the shared num_batches_tracked must hold one number");
  } else {
    if (options.affine()) {
      tensors.weight = torch::ones({c}).requires_grad_();
      tensors.bias = torch::zeros({c}).requires_grad_();
    }
    tensors.running_mean = torch::zeros({c});
    tensors.running_var = torch::ones({c});
    tensors.num_batches_tracked = torch::zeros({}, torch::kLong);
  }
  if (options.affine()) {
    weight = register_parameter("weight", tensors.weight, tensors.weight.requires_grad());
    bias = register_parameter("bias", tensors.bias, tensors.bias.requires_grad());
  } else {
    weight = register_parameter("weight", torch::Tensor(), /*requires_grad=*/false);
    bias = register_parameter("bias", torch::Tensor(), /*requires_grad=*/false);
  }
  running_mean = register_buffer("running_mean", tensors.running_mean);
  running_var = register_buffer("running_var", tensors.running_var);
  num_batches_tracked = register_buffer("num_batches_tracked", tensors.num_batches_tracked);
  mean_ = torch::Tensor();
  m2_ = torch::Tensor();
  count_ = 0;
  tracked_ = 0;
}

void DeferredBatchNormImpl::reset_running_stats() {
  torch::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
  mean_ = torch::Tensor();
  m2_ = torch::Tensor();
  count_ = 0;
  tracked_ = 0;
}

torch::Tensor DeferredBatchNormImpl::forward(const torch::Tensor& input) {
  PIPETRAIN_CHECK_INPUT(input.dim() >= 2 && input.size(1) == options.num_features(),
                        "DeferredBatchNorm(", options.num_features(), ") expects input (N, ",
                        options.num_features(), ", ...) but got shape ", input.sizes(),
                        "; set num_features to the channel count (dim 1)");
  const bool cudnn = at::globalContext().userEnabledCuDNN();
  if (!is_training()) {
    return torch::batch_norm(input, weight, bias, running_mean, running_var,
                             /*training=*/false, /*momentum=*/0.0, options.eps(), cudnn);
  }
  PIPETRAIN_CHECK_INPUT(
      input.numel() / input.size(1) > 1,
      "DeferredBatchNorm: expected more than 1 value per channel when training, got input "
      "shape ",
      input.sizes(), "; use micro-batches of at least 2 rows");
  // Undefined running stats: normalize with this micro-batch's statistics and update nothing.
  // native_batch_norm also returns the statistics it normalized with (mean, 1/sqrt(var + eps)),
  // so tracking costs no extra pass over the activations.
  auto [output, mean, invstd] =
      at::native_batch_norm(input, weight, bias, /*running_mean=*/{}, /*running_var=*/{},
                            /*training=*/true, /*momentum=*/0.0, options.eps());
  // A recompute re-runs a forward that was already tracked (checkpointing): skip it.
  if (!is_recomputing()) {
    track(input.numel() / input.size(1), mean, invstd);
    if (tracked_ >= options.chunks()) commit();
  }
  return output;
}

void DeferredBatchNormImpl::track(int64_t count, const torch::Tensor& mean,
                                  const torch::Tensor& invstd) {
  torch::NoGradGuard no_grad;
  // This micro-batch: count values per channel, their mean and biased variance, in float64.
  torch::Tensor mean_b = mean.detach().to(torch::kDouble);
  torch::Tensor var_b =
      (invstd.detach().to(torch::kDouble).square().reciprocal() - options.eps()).clamp_min(0);
  torch::Tensor m2_b = var_b * static_cast<double>(count);
  if (tracked_ == 0 || !mean_.defined()) {
    mean_ = mean_b;
    m2_ = m2_b;
  } else {
    // Chan et al.'s pairwise combination: no cancellation when the mean dwarfs the spread.
    const auto n_a = static_cast<double>(count_);
    const auto n_b = static_cast<double>(count);
    const double n = n_a + n_b;
    torch::Tensor delta = mean_b - mean_;
    mean_ = mean_ + delta * (n_b / n);
    m2_ = m2_ + m2_b + delta.square() * (n_a * n_b / n);
  }
  count_ += count;
  ++tracked_;
}

void DeferredBatchNormImpl::sum_tracked_over(const std::vector<DeferredBatchNormImpl*>& norms,
                                             const std::function<void(torch::Tensor&)>& sum) {
  torch::NoGradGuard no_grad;
  // [1] Per layer [values, micro-batches, sum of the values (C)], every layer in one tensor and
  // one sum: the mini-batch's count and mean of each layer.
  std::vector<int64_t> at;  // where each layer's part starts
  int64_t size = 0;
  for (const auto* norm : norms) {
    at.push_back(size);
    size += 2 + norm->options.num_features();
  }
  torch::Tensor totals = torch::zeros({size}, torch::kDouble);
  for (size_t k = 0; k < norms.size(); ++k) {
    const DeferredBatchNormImpl& norm = *norms[k];
    if (norm.tracked_ == 0) continue;
    const auto n = static_cast<double>(norm.count_);
    totals[at[k]] = n;
    totals[at[k] + 1] = static_cast<double>(norm.tracked_);
    totals.narrow(0, at[k] + 2, norm.options.num_features()).copy_(norm.mean_ * n);
  }
  sum(totals);
  // [2] Chan et al.'s combination: each replica's squared deviations plus its share of the spread
  // between its mean and the mini-batch's, summed (no cancellation when the mean dwarfs the
  // spread); again one tensor, one sum.
  std::vector<torch::Tensor> means;
  torch::Tensor m2 = torch::zeros({size}, torch::kDouble);
  for (size_t k = 0; k < norms.size(); ++k) {
    const DeferredBatchNormImpl& norm = *norms[k];
    const int64_t C = norm.options.num_features();
    const auto n = totals[at[k]].item<double>();
    means.push_back(n > 0 ? totals.narrow(0, at[k] + 2, C) / n : torch::zeros({C}, torch::kDouble));
    if (norm.tracked_ == 0) continue;
    m2.narrow(0, at[k] + 2, C)
        .copy_(norm.m2_ + (norm.mean_ - means[k]).square() * static_cast<double>(norm.count_));
  }
  sum(m2);
  for (size_t k = 0; k < norms.size(); ++k) {
    DeferredBatchNormImpl& norm = *norms[k];
    norm.count_ = static_cast<int64_t>(std::llround(totals[at[k]].item<double>()));
    norm.tracked_ = static_cast<int64_t>(std::llround(totals[at[k] + 1].item<double>()));
    if (norm.tracked_ == 0) continue;
    norm.mean_ = means[k];
    norm.m2_ = m2.narrow(0, at[k] + 2, norm.options.num_features()).clone();
  }
}

void DeferredBatchNormImpl::commit() {
  if (tracked_ == 0) return;
  torch::NoGradGuard no_grad;
  num_batches_tracked += 1;
  const double m = options.momentum().has_value()
                       ? *options.momentum()
                       : 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  const auto n = static_cast<double>(count_);
  torch::Tensor mean = mean_;
  torch::Tensor biased_var = m2_ / n;
  // BatchNorm keeps the unbiased variance; with one value per channel it is undefined (torch
  // stores inf/nan there too), so we follow it rather than hide the problem.
  torch::Tensor var = count_ > 1 ? biased_var * (n / (n - 1)) : biased_var;
  running_mean.mul_(1 - m).add_(mean.to(running_mean.dtype()), m);
  running_var.mul_(1 - m).add_(var.to(running_var.dtype()), m);
  mean_ = torch::Tensor();
  m2_ = torch::Tensor();
  count_ = 0;
  tracked_ = 0;
}

void DeferredBatchNormImpl::restore_tracked_state(const Tracked& state) {
  // track() and commit() replace the accumulators, never write into them: the saved ones hold.
  mean_ = state.mean;
  m2_ = state.m2;
  count_ = state.count;
  tracked_ = state.microbatches;
}

void DeferredBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "pipetrain::DeferredBatchNorm(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << std::boolalpha << options.affine() << ", chunks=" << options.chunks()
         << ")";
}

namespace {

template <typename BatchNormImpl>
std::optional<DeferredBatchNorm> convert_one(const std::shared_ptr<torch::nn::Module>& layer,
                                             int64_t chunks) {
  auto batch_norm = std::dynamic_pointer_cast<BatchNormImpl>(layer);
  if (!batch_norm) return std::nullopt;
  const auto& from = batch_norm->options;
  PIPETRAIN_CHECK_INPUT(
      from.track_running_stats(),
      "convert_deferred_batch_norm: a batch norm with track_running_stats=false has no "
      "running statistics to defer; leave it as it is or enable tracking");
  std::optional<double> momentum;
  if (from.momentum().has_value()) momentum = *from.momentum();
  DeferredBatchNorm deferred(DeferredBatchNormOptions(from.num_features())
                                 .eps(from.eps())
                                 .momentum(momentum)
                                 .affine(from.affine())
                                 .chunks(chunks));
  // set_data keeps each tensor's identity (the registered parameter or buffer) and takes the
  // original's values, device and dtype; Module::to(dtype) would also convert the integer counter.
  torch::NoGradGuard no_grad;
  if (from.affine()) {
    deferred->weight.set_data(batch_norm->weight.detach().clone());
    deferred->bias.set_data(batch_norm->bias.detach().clone());
  }
  deferred->running_mean.set_data(batch_norm->running_mean.detach().clone());
  deferred->running_var.set_data(batch_norm->running_var.detach().clone());
  deferred->num_batches_tracked.set_data(batch_norm->num_batches_tracked.detach().clone());
  deferred->train(batch_norm->is_training());
  return deferred;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A TorchScript nn.BatchNorm1d/2d (type "__torch__.torch.nn.modules.batchnorm.BatchNorm2d",
// possibly with a mangled namespace) becomes a DeferredBatchNorm on the jit module's own tensors.
std::optional<DeferredBatchNorm> convert_script(const std::shared_ptr<torch::nn::Module>& layer,
                                                int64_t chunks) {
  auto script = std::dynamic_pointer_cast<ScriptLayerImpl>(layer);
  if (!script) return std::nullopt;
  const torch::jit::Module& jit = script->jit_module();
  const auto& type = jit.type()->name();
  if (!type) return std::nullopt;
  const std::string name = type->qualifiedName();
  if (!ends_with(name, ".BatchNorm1d") && !ends_with(name, ".BatchNorm2d")) return std::nullopt;
  PIPETRAIN_CHECK_INPUT(
      jit.attr("track_running_stats").toBool(), "convert_deferred_batch_norm: layer '",
      script->layer_name(),
      "' is a batch norm with track_running_stats=False; it has no running statistics "
      "to defer");
  const torch::jit::IValue momentum = jit.attr("momentum");
  const bool affine = jit.attr("affine").toBool();
  DeferredBatchNormTensors shared;
  if (affine) {
    shared.weight = jit.attr("weight").toTensor();
    shared.bias = jit.attr("bias").toTensor();
  }
  shared.running_mean = jit.attr("running_mean").toTensor();
  shared.running_var = jit.attr("running_var").toTensor();
  shared.num_batches_tracked = jit.attr("num_batches_tracked").toTensor();
  DeferredBatchNorm deferred(
      DeferredBatchNormOptions(jit.attr("num_features").toInt())
          .eps(jit.attr("eps").toDouble())
          .momentum(momentum.isNone() ? std::nullopt : std::optional<double>(momentum.toDouble()))
          .affine(affine)
          .chunks(chunks),
      std::move(shared));
  deferred->train(script->is_training());
  return deferred;
}

}  // namespace

torch::nn::Sequential convert_deferred_batch_norm(const torch::nn::Sequential& model,
                                                  int64_t chunks) {
  PIPETRAIN_CHECK_INPUT(chunks >= 1, "convert_deferred_batch_norm needs chunks >= 1, got ", chunks);
  torch::nn::Sequential converted;
  const auto children = model->named_children();
  TORCH_INTERNAL_ASSERT(children.size() == model->size());
  for (size_t index = 0; index < model->size(); ++index) {
    const std::string& name = children[index].key();
    const auto& layer = children[index].value();
    std::optional<DeferredBatchNorm> deferred =
        convert_one<torch::nn::BatchNorm1dImpl>(layer, chunks);
    if (!deferred) deferred = convert_one<torch::nn::BatchNorm2dImpl>(layer, chunks);
    if (!deferred) deferred = convert_script(layer, chunks);
    if (deferred) {
      converted->push_back(std::string(name), *deferred);
    } else {
      converted->push_back(std::string(name),
                           *(model->begin() + static_cast<std::ptrdiff_t>(index)));
    }
  }
  converted->train(model->is_training());
  return converted;
}

void commit_deferred_batch_norms(torch::nn::Module& module) {
  if (auto* self = dynamic_cast<DeferredBatchNormImpl*>(&module)) self->commit();
  for (const auto& child : module.modules(/*include_self=*/false)) {
    if (auto* layer = dynamic_cast<DeferredBatchNormImpl*>(child.get())) layer->commit();
  }
}

}  // namespace pipetrain
