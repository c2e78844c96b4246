// Megatron-style tensor-parallel functions and layers (parallel/tensor_parallel.h).
#include "pipetrain/parallel/tensor_parallel.h"

#include <utility>
#include <vector>

#include <torch/autograd.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>

#include "pipetrain/base/check.h"
#include "pipetrain/base/error.h"
#include "pipetrain/stage/autocast_linear.h"

namespace pipetrain::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The group rides in the autograd context as a capsule, so a backward keeps it alive.
struct GroupHolder : torch::CustomClassHolder {
  explicit GroupHolder(std::shared_ptr<C10dGroup> g) : group(std::move(g)) {}
  std::shared_ptr<C10dGroup> group;
};

void save_group(AutogradContext* ctx, const std::shared_ptr<C10dGroup>& group) {
  ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupHolder>(group));
}

C10dGroup& saved_group(AutogradContext* ctx) {
  auto holder =
      c10::static_intrusive_pointer_cast<GroupHolder>(ctx->saved_data["group"].toCapsule());
  return *holder->group;
}

torch::Tensor summed(const torch::Tensor& x, C10dGroup& group) {
  std::vector<torch::Tensor> one{x.contiguous().clone()};
  group.allreduce_sum(one);
  return one[0];
}

// [size, ..] of every rank's x (same shape everywhere), stacked in rank order.
torch::Tensor gathered(const torch::Tensor& x, C10dGroup& group) {
  const torch::Tensor flat_x = x.contiguous().reshape({-1});
  torch::Tensor flat = torch::empty({group.size() * flat_x.numel()}, x.options());
  group.all_gather(flat_x, flat);
  std::vector<int64_t> shape{group.size()};
  for (int64_t s : x.sizes()) shape.push_back(s);
  return flat.view(shape);
}

struct CopyToGroup : torch::autograd::Function<CopyToGroup> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const std::shared_ptr<C10dGroup>& group) {
    save_group(ctx, group);
    return x.view_as(x);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {summed(grads[0], saved_group(ctx)), torch::Tensor()};
  }
};

struct ReduceFromGroup : torch::autograd::Function<ReduceFromGroup> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x,
                               const std::shared_ptr<C10dGroup>& group) {
    return summed(x, *group);
  }
  static tensor_list backward(AutogradContext*, tensor_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

struct GatherFromGroup : torch::autograd::Function<GatherFromGroup> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const std::shared_ptr<C10dGroup>& group) {
    save_group(ctx, group);
    ctx->saved_data["width"] = x.size(-1);
    const torch::Tensor parts = gathered(x, *group);  // [tp, .., w]
    std::vector<torch::Tensor> pieces = parts.unbind(0);
    return torch::cat(pieces, -1);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const int64_t width = ctx->saved_data["width"].toInt();
    const int rank = saved_group(ctx).rank();
    return {grads[0].narrow(-1, rank * width, width).contiguous(), torch::Tensor()};
  }
};

// x [.., n at dim, ..] -> [n, ..rest] contiguous, and back: the collectives cut the first dim.
torch::Tensor dim_first(const torch::Tensor& x, int64_t dim) {
  return x.movedim(dim, 0).contiguous();
}

// Every rank's x along `dim`, concatenated in rank order.
torch::Tensor all_gather_along(const torch::Tensor& x, int64_t dim, C10dGroup& group) {
  const torch::Tensor first = dim_first(x, dim);
  torch::Tensor flat = torch::empty({group.size() * first.numel()}, first.options());
  group.all_gather(first.reshape({-1}), flat);
  std::vector<int64_t> shape = first.sizes().vec();
  shape[0] *= group.size();
  return flat.view(shape).movedim(0, dim);
}

// The sum over the group of x, this rank's slice along `dim` kept.
torch::Tensor reduce_scatter_along(const torch::Tensor& x, int64_t dim, C10dGroup& group) {
  const torch::Tensor first = dim_first(x, dim);
  TORCH_CHECK(first.size(0) % group.size() == 0, "sequence parallelism: dimension ", dim,
              " of size ", first.size(0), " does not split into ", group.size(), " ranks");
  std::vector<int64_t> shape = first.sizes().vec();
  shape[0] /= group.size();
  torch::Tensor shard = torch::empty({first.numel() / group.size()}, first.options());
  group.reduce_scatter_sum(first.reshape({-1}), shard);
  return shard.view(shape).movedim(0, dim);
}

torch::Tensor slice_along(const torch::Tensor& x, int64_t dim, const C10dGroup& group) {
  const int64_t length = x.size(dim) / group.size();
  TORCH_CHECK(x.size(dim) % group.size() == 0, "sequence parallelism: dimension ", dim, " of size ",
              x.size(dim), " does not split into ", group.size(), " ranks");
  return x.narrow(dim, group.rank() * length, length).contiguous();
}

struct GatherSequence : torch::autograd::Function<GatherSequence> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t dim,
                               const std::shared_ptr<C10dGroup>& group) {
    save_group(ctx, group);
    ctx->saved_data["dim"] = dim;
    return all_gather_along(x, dim, *group);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {reduce_scatter_along(grads[0], ctx->saved_data["dim"].toInt(), saved_group(ctx)),
            torch::Tensor(), torch::Tensor()};
  }
};

struct ReduceScatterSequence : torch::autograd::Function<ReduceScatterSequence> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t dim,
                               const std::shared_ptr<C10dGroup>& group) {
    save_group(ctx, group);
    ctx->saved_data["dim"] = dim;
    return reduce_scatter_along(x, dim, *group);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {all_gather_along(grads[0], ctx->saved_data["dim"].toInt(), saved_group(ctx)),
            torch::Tensor(), torch::Tensor()};
  }
};

struct ScatterSequence : torch::autograd::Function<ScatterSequence> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t dim,
                               const std::shared_ptr<C10dGroup>& group) {
    save_group(ctx, group);
    ctx->saved_data["dim"] = dim;
    return slice_along(x, dim, *group);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {all_gather_along(grads[0], ctx->saved_data["dim"].toInt(), saved_group(ctx)),
            torch::Tensor(), torch::Tensor()};
  }
};

// Per-token loss of vocabulary-split logits; see vocab_parallel_cross_entropy.
struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, int64_t vocab_start,
                               const std::shared_ptr<C10dGroup>& group) {
    const torch::Tensor x = logits.to(torch::kFloat32);
    const int64_t width = x.size(1);
    // The max only shifts the exponentials (any common value would do); no gradient flows it.
    torch::Tensor max = std::get<0>(x.max(1));
    if (group) max = std::get<0>(gathered(max, *group).max(0));
    const torch::Tensor shifted = x - max.unsqueeze(1);
    const torch::Tensor exp = shifted.exp();
    torch::Tensor sum_exp = exp.sum(1);
    const torch::Tensor in_range = (targets >= vocab_start) & (targets < vocab_start + width);
    const torch::Tensor local = torch::where(in_range, targets - vocab_start, 0);
    torch::Tensor target_logit =
        shifted.gather(1, local.unsqueeze(1)).squeeze(1) * in_range.to(torch::kFloat32);
    if (group) {
      std::vector<torch::Tensor> sums{sum_exp, target_logit};
      group->allreduce_sum(sums);
    }
    ctx->save_for_backward({exp / sum_exp.unsqueeze(1), local, in_range});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return sum_exp.log() - target_logit;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    torch::Tensor grad = saved[0].clone();  // softmax over the whole vocabulary, this slice
    grad.scatter_add_(1, saved[1].unsqueeze(1), -saved[2].to(torch::kFloat32).unsqueeze(1));
    grad.mul_(grads[0].to(torch::kFloat32).unsqueeze(1));
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

Slice even_slice(int64_t total, int parts, int index, const std::string& what) {
  PIPETRAIN_CHECK_INPUT(parts >= 1 && index >= 0 && index < parts, "slice ", index, " of ", parts,
                        " parts of the ", what, " does not exist");
  PIPETRAIN_CHECK_INPUT(total % parts == 0, "tensor parallelism ", parts, " does not divide the ",
                        what, " (", total, ")");
  const int64_t length = total / parts;
  return Slice{index * length, length};
}

namespace {

// sum_over_replicas' autograd function.
struct SumOverReplicas : torch::autograd::Function<SumOverReplicas> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& w, int64_t replicas,
                               const std::shared_ptr<C10dGroup>& group) {
    save_group(ctx, group);
    ctx->saved_data["replicas"] = replicas;
    return w.view_as(w);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    C10dGroup& group = saved_group(ctx);
    const int64_t replicas = ctx->saved_data["replicas"].toInt();
    const torch::Tensor g = grads[0].contiguous();
    const int64_t part = group.rank() / replicas;
    std::vector<int64_t> shape = g.sizes().vec();
    shape.insert(shape.begin(), group.size() / replicas);
    std::vector<torch::Tensor> slots{torch::zeros(shape, g.options())};
    slots[0][part].copy_(g);
    group.allreduce_sum(slots);
    return {slots[0][part], torch::Tensor(), torch::Tensor()};
  }
};

// sequence_parallel_linears' autograd function. `tensors`: x_slice, then the n weights, then the
// biases of the weights whose `has_bias` is 1, in order.
struct SequenceParallelLinears : torch::autograd::Function<SequenceParallelLinears> {
  static tensor_list forward(AutogradContext* ctx, at::TensorList tensors, int64_t n,
                             std::vector<int64_t> has_bias,
                             const std::shared_ptr<C10dGroup>& group) {
    save_group(ctx, group);
    const torch::Tensor full = all_gather_along(tensors[0], 1, *group);
    tensor_list outputs;
    size_t next_bias = 1 + static_cast<size_t>(n);
    for (int64_t i = 0; i < n; ++i) {
      const torch::Tensor bias =
          has_bias[static_cast<size_t>(i)] ? tensors[next_bias++] : torch::Tensor();
      outputs.push_back(torch::linear(full, tensors[1 + static_cast<size_t>(i)], bias));
    }
    // The slice, not `full`: the backward gathers it again where the weights want gradients.
    ctx->save_for_backward(tensor_list(tensors.begin(), tensors.begin() + 1 + n));
    ctx->saved_data["has_bias"] = has_bias;
    return outputs;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    C10dGroup& group = saved_group(ctx);
    const tensor_list saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const auto n = static_cast<int64_t>(saved.size()) - 1;
    const std::vector<int64_t> has_bias = ctx->saved_data["has_bias"].toIntVector();
    int64_t biases = 0;
    for (int64_t b : has_bias) biases += b;
    // One gradient per tensor of the list, then none for n, has_bias and the group.
    tensor_list out(static_cast<size_t>(1 + n + biases + 3));
    // Each output's dtype is the one the forward computed in (bf16 under autocast): the products
    // run in it and each result goes back to its input's dtype, as autocast's casts do.
    if (ctx->needs_input_grad(0)) {  // I: the input's gradient, reduce-scattered back to slices
      torch::Tensor full_grad;
      for (int64_t i = 0; i < n; ++i) {
        const torch::Tensor& gy = grads[static_cast<size_t>(i)];
        if (!gy.defined()) continue;
        const torch::Tensor& w = saved[1 + static_cast<size_t>(i)];
        const torch::Tensor term = gy.matmul(w.to(gy.scalar_type())).to(x.scalar_type());
        full_grad = full_grad.defined() ? full_grad + term : term;
      }
      if (full_grad.defined()) out[0] = reduce_scatter_along(full_grad, 1, group);
    }
    bool weights_wanted = false;
    for (int64_t k = 1; k < 1 + n + biases; ++k) {
      weights_wanted = weights_wanted || ctx->needs_input_grad(static_cast<size_t>(k));
    }
    if (weights_wanted) {  // W: the whole sequence again
      const torch::Tensor full = all_gather_along(x, 1, group);
      size_t next_bias = 1 + static_cast<size_t>(n);
      for (int64_t i = 0; i < n; ++i) {
        const torch::Tensor& gy = grads[static_cast<size_t>(i)];
        const size_t w_index = 1 + static_cast<size_t>(i);
        const size_t b_index = has_bias[static_cast<size_t>(i)] ? next_bias++ : 0;
        if (!gy.defined()) continue;
        const torch::Tensor& w = saved[w_index];
        const torch::Tensor gy2 = gy.reshape({-1, gy.size(-1)});
        if (ctx->needs_input_grad(w_index)) {
          const torch::Tensor x2 = full.reshape({-1, full.size(-1)}).to(gy.scalar_type());
          out[w_index] = gy2.t().mm(x2).to(w.scalar_type());
        }
        if (b_index > 0 && ctx->needs_input_grad(b_index)) {
          out[b_index] = gy2.sum(0).to(w.scalar_type());
        }
      }
    }
    return out;
  }
};

}  // namespace

std::vector<torch::Tensor> sequence_parallel_linears(const torch::Tensor& x,
                                                     const std::vector<torch::Tensor>& weights,
                                                     const std::vector<torch::Tensor>& biases,
                                                     const TensorParallel& tp) {
  PIPETRAIN_CHECK_INPUT(biases.empty() || biases.size() == weights.size(),
                        "sequence_parallel_linears: ", biases.size(), " biases for ",
                        weights.size(), " weights");
  const auto bias_of = [&](size_t i) { return biases.empty() ? torch::Tensor() : biases[i]; };
  if (!tp.split() || !tp.sequence_parallel) {
    const torch::Tensor in = enter_tensor_parallel(x, tp);
    std::vector<torch::Tensor> outputs;
    for (size_t i = 0; i < weights.size(); ++i) {
      outputs.push_back(autocast_linear(in, weights[i], bias_of(i)));
    }
    return outputs;
  }
  std::vector<torch::Tensor> tensors{x};
  std::vector<int64_t> has_bias;
  for (const torch::Tensor& w : weights) tensors.push_back(w);
  for (size_t i = 0; i < weights.size(); ++i) {
    has_bias.push_back(bias_of(i).defined() ? 1 : 0);
    if (bias_of(i).defined()) tensors.push_back(bias_of(i));
  }
  return SequenceParallelLinears::apply(at::TensorList(tensors),
                                        static_cast<int64_t>(weights.size()), has_bias, tp.group);
}

torch::Tensor sum_over_replicas(const torch::Tensor& w, int replicas, const TensorParallel& tp) {
  if (!tp.split() || replicas <= 1) return w;
  TORCH_CHECK(tp.size() % replicas == 0, "sum_over_replicas: ", replicas,
              " replicas do not divide a tensor-parallel group of ", tp.size());
  return SumOverReplicas::apply(w, static_cast<int64_t>(replicas), tp.group);
}

torch::Tensor copy_to_tensor_parallel(const torch::Tensor& x, const TensorParallel& tp) {
  return tp.split() ? CopyToGroup::apply(x, tp.group) : x;
}

torch::Tensor reduce_from_tensor_parallel(const torch::Tensor& x, const TensorParallel& tp) {
  return tp.split() ? ReduceFromGroup::apply(x, tp.group) : x;
}

torch::Tensor gather_from_tensor_parallel(const torch::Tensor& x, const TensorParallel& tp) {
  return tp.split() ? GatherFromGroup::apply(x, tp.group) : x;
}

torch::Tensor gather_sequence(const torch::Tensor& x, int64_t dim, const TensorParallel& tp) {
  return tp.split() ? GatherSequence::apply(x, dim, tp.group) : x;
}

torch::Tensor reduce_scatter_sequence(const torch::Tensor& x, int64_t dim,
                                      const TensorParallel& tp) {
  return tp.split() ? ReduceScatterSequence::apply(x, dim, tp.group) : x;
}

torch::Tensor scatter_sequence(const torch::Tensor& x, int64_t dim, const TensorParallel& tp) {
  return tp.split() ? ScatterSequence::apply(x, dim, tp.group) : x;
}

torch::Tensor enter_tensor_parallel(const torch::Tensor& x, const TensorParallel& tp) {
  return tp.sequence_parallel ? gather_sequence(x, 1, tp) : copy_to_tensor_parallel(x, tp);
}

torch::Tensor leave_tensor_parallel(const torch::Tensor& x, const TensorParallel& tp) {
  return tp.sequence_parallel ? reduce_scatter_sequence(x, 1, tp)
                              : reduce_from_tensor_parallel(x, tp);
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits,
                                           const torch::Tensor& targets, int64_t vocab_start,
                                           const TensorParallel& tp) {
  PIPETRAIN_CHECK_INPUT(
      logits.dim() == 2 && targets.dim() == 1 && logits.size(0) == targets.size(0),
      "vocab_parallel_cross_entropy expects logits [N, V/tp] and targets [N], "
      "got ",
      logits.sizes(), " and ", targets.sizes());
  return VocabParallelCrossEntropy::apply(logits, targets, vocab_start,
                                          tp.split() ? tp.group : nullptr);
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in_, int64_t out_, bool bias_,
                                                   TensorParallel tp_, bool gather_output_,
                                                   torch::TensorOptions options_)
    : in(in_),
      out(out_),
      has_bias(bias_),
      gather_output(gather_output_),
      tp(std::move(tp_)),
      options(options_) {
  reset();
}

void ColumnParallelLinearImpl::reset() {
  const Slice slice = rows();
  weight = register_parameter("weight", torch::zeros({slice.length, in}, options));
  if (has_bias) bias = register_parameter("bias", torch::zeros({slice.length}, options));
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  const torch::Tensor y =
      autocast_linear(copy_to_tensor_parallel(x, tp), weight, has_bias ? bias : torch::Tensor());
  return gather_output ? gather_from_tensor_parallel(y, tp) : y;
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in_, int64_t out_, bool bias_,
                                             TensorParallel tp_, torch::TensorOptions options_)
    : in(in_), out(out_), has_bias(bias_), tp(std::move(tp_)), options(options_) {
  reset();
}

void RowParallelLinearImpl::reset() {
  const Slice slice = columns();
  weight = register_parameter("weight", torch::zeros({out, slice.length}, options));
  if (has_bias) bias = register_parameter("bias", torch::zeros({out}, options));
}

torch::Tensor row_parallel_linear(const torch::Tensor& x, const torch::Tensor& weight,
                                  const torch::Tensor& bias, const TensorParallel& tp) {
  if (!tp.split()) return autocast_linear(x, weight, bias);  // one fused op
  const torch::Tensor y = leave_tensor_parallel(autocast_linear(x, weight), tp);
  return bias.defined() ? y + bias : y;
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  return row_parallel_linear(x, weight, has_bias ? bias : torch::Tensor(), tp);
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t vocab_, int64_t dim_,
                                                       TensorParallel tp_,
                                                       std::optional<int64_t> padding_idx_,
                                                       torch::TensorOptions options_)
    : vocab(vocab_), dim(dim_), tp(std::move(tp_)), padding_idx(padding_idx_), options(options_) {
  reset();
}

void VocabParallelEmbeddingImpl::reset() {
  weight = register_parameter("weight", torch::zeros({vocab_rows().length, dim}, options));
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& ids) {
  return vocab_parallel_embedding(ids, weight, vocab_rows().start, padding_idx, tp);
}

torch::Tensor vocab_parallel_embedding(const torch::Tensor& ids, const torch::Tensor& weight,
                                       int64_t vocab_start, std::optional<int64_t> padding_idx,
                                       const TensorParallel& tp) {
  const Slice rows{vocab_start, weight.size(0)};
  // padding_idx as embedding_dense_backward takes it: a row index of this table, -1 for none.
  auto local_padding = [&](int64_t id) -> int64_t {
    return id >= rows.start && id < rows.start + rows.length ? id - rows.start : -1;
  };
  if (!tp.split()) {
    return at::embedding(weight, ids, padding_idx ? local_padding(*padding_idx) : -1);
  }
  const torch::Tensor in_range = (ids >= rows.start) & (ids < rows.start + rows.length);
  const torch::Tensor local = torch::where(in_range, ids - rows.start, 0);
  const torch::Tensor found =
      at::embedding(weight, local, padding_idx ? local_padding(*padding_idx) : -1) *
      in_range.unsqueeze(-1).to(weight.scalar_type());
  return leave_tensor_parallel(found, tp);  // with sequence parallelism: ids' dimension 1 split
}

}  // namespace pipetrain::parallel
