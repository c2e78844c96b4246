// The vocabulary table's lookup and logits with their weight gradients in place
// (vocabulary_table.h).
#include "vocabulary_table.h"

#include <algorithm>
#include <tuple>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "pipetrain/stage/autocast_linear.h"
#include "pipetrain/stage/in_place_gradients.h"

namespace pipetrain::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Rows of the weight gradient computed at once by table_logits' backward: about 32 MiB of them.
int64_t block_rows(int64_t hidden, int64_t element_size) {
  constexpr int64_t kBlockBytes = int64_t{32} << 20;
  return std::max<int64_t>(1, kBlockBytes / std::max<int64_t>(1, hidden * element_size));
}

struct TableLookup : torch::autograd::Function<TableLookup> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& weight,
                               const torch::Tensor& tokens, int64_t padding_idx) {
    ctx->save_for_backward({weight});  // a leaf: saved as itself, not its values
    ctx->saved_data["tokens"] = tokens;
    ctx->saved_data["padding_idx"] = padding_idx;
    ctx->saved_data["rows"] = weight.size(0);
    return torch::embedding(weight, tokens, padding_idx);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const tensor_list none(3);
    if (!ctx->needs_input_grad(0) || !grads[0].defined()) return none;
    torch::Tensor weight = ctx->get_saved_variables()[0];
    const torch::Tensor tokens = ctx->saved_data["tokens"].toTensor();
    const int64_t padding_idx = ctx->saved_data["padding_idx"].toInt();
    const int64_t rows = ctx->saved_data["rows"].toInt();
    const torch::Tensor& g = grads[0];
    // Only on the CPU: a CUDA index_add_ sums with atomics, in no fixed order.
    const bool in_place = g.is_cpu() && InPlaceGradients::allowed(weight);
    if (!in_place || !weight.grad().defined()) {
      torch::Tensor dense = at::embedding_dense_backward(g, tokens, rows, padding_idx,
                                                         /*scale_grad_by_freq=*/false);
      if (!in_place) return {dense, torch::Tensor(), torch::Tensor()};
      weight.mutable_grad() = dense;  // the first: stored, as autograd would
      return none;
    }
    torch::Tensor ids = tokens.reshape({-1});
    torch::Tensor g2 = g.reshape({ids.numel(), g.size(-1)});
    if (padding_idx >= 0) {
      const torch::Tensor keep = ids.ne(padding_idx);
      ids = ids.masked_select(keep);
      g2 = g2.index({keep});
    }
    if (ids.numel() == 0) return none;
    // Per row used, its tokens' gradients summed in token order from zero (the dense backward's
    // sum), then added to the row once.
    const auto [used, inverse, counts] =
        torch::_unique2(ids, /*sorted=*/true, /*return_inverse=*/true, /*return_counts=*/false);
    (void)counts;
    const torch::Tensor sums =
        torch::zeros({used.numel(), g2.size(1)}, g2.options()).index_add_(0, inverse, g2);
    weight.mutable_grad().index_add_(0, used, sums);
    return none;
  }
};

struct TableLogits : torch::autograd::Function<TableLogits> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight) {
    ctx->save_for_backward({x, weight});
    return torch::linear(x, weight);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const tensor_list saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    torch::Tensor weight = saved[1];
    const torch::Tensor& g = grads[0];
    tensor_list result(2);
    if (!g.defined()) return result;
    if (ctx->needs_input_grad(0)) result[0] = torch::matmul(g, weight);
    if (!ctx->needs_input_grad(1)) return result;
    const int64_t vocabulary = g.size(-1);
    const int64_t hidden = x.size(-1);
    const torch::Tensor g2 = g.reshape({-1, vocabulary});
    const torch::Tensor x2 = x.reshape({-1, hidden});
    const bool in_place = InPlaceGradients::allowed(weight);
    const bool add = in_place && weight.grad().defined();
    torch::Tensor target =
        add ? weight.mutable_grad() : torch::empty({vocabulary, hidden}, g.options());
    const int64_t step = block_rows(hidden, g.element_size());
    for (int64_t v = 0; v < vocabulary; v += step) {
      const int64_t n = std::min(step, vocabulary - v);
      const torch::Tensor block_t = g2.narrow(1, v, n).t();  // [n, tokens]
      if (add) {
        target.narrow(0, v, n).add_(block_t.mm(x2));
      } else {
        torch::Tensor out = target.narrow(0, v, n);
        torch::mm_out(out, block_t, x2);
      }
    }
    if (!in_place) {
      result[1] = target;
    } else if (!add) {
      weight.mutable_grad() = target;
    }
    return result;
  }
};

}  // namespace

torch::Tensor table_lookup(const torch::Tensor& weight, const torch::Tensor& tokens,
                           int64_t padding_idx) {
  return TableLookup::apply(weight, tokens, padding_idx);
}

torch::Tensor table_logits(const torch::Tensor& x, const torch::Tensor& weight) {
  // Under autocast the product runs on a cast of the weight, its gradient returned to autograd:
  // autocast_linear, which keeps the table rather than its cast for the backward.
  if (at::autocast::is_autocast_enabled(x.device().type()) ||
      x.scalar_type() != weight.scalar_type()) {
    return autocast_linear(x, weight);
  }
  return TableLogits::apply(x, weight);
}

}  // namespace pipetrain::models
