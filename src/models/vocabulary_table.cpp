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

// Under autocast (`compute` the autocast dtype, else the weight's own): the product runs on the
// casts of x and the weight, as torch::linear's under autocast, and the table itself (not its
// cast) is kept for the backward, which casts it again (stage/autocast_linear.h). The weight's
// gradient is computed in the compute dtype a block at a time and cast back to the weight's, as
// autograd's cast would send it back whole; the input's, over a table of more than one block, by
// the same blocks (below), so that no cast of the whole table is made in the backward.
struct TableLogits : torch::autograd::Function<TableLogits> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, int64_t compute) {
    const auto dtype = static_cast<c10::ScalarType>(compute);
    const torch::Tensor xc = x.scalar_type() == dtype ? x : x.to(dtype);
    ctx->save_for_backward({xc, weight});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    return torch::linear(xc, weight.scalar_type() == dtype ? weight : weight.to(dtype));
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const tensor_list saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];  // in the compute dtype
    torch::Tensor weight = saved[1];
    const torch::Tensor& g = grads[0];
    tensor_list result(3);
    if (!g.defined()) return result;
    const c10::ScalarType dtype = x.scalar_type();
    const int64_t vocabulary = g.size(-1);
    const int64_t hidden = x.size(-1);
    const torch::Tensor g2 = g.reshape({-1, vocabulary});
    const torch::Tensor x2 = x.reshape({-1, hidden});
    const int64_t step = block_rows(hidden, weight.element_size());
    if (ctx->needs_input_grad(0)) {
      const auto x_dtype = static_cast<c10::ScalarType>(ctx->saved_data["x_dtype"].toInt());
      if (weight.scalar_type() == dtype || vocabulary <= step) {
        const torch::Tensor cast = weight.scalar_type() == dtype ? weight : weight.to(dtype);
        result[0] = torch::matmul(g, cast).to(x_dtype);  // torch's bits
      } else {
        // The cast of a table of more than one block would be a second table (445 MiB at the
        // Qwen2-1.5B shape): the product runs a block of the vocabulary at a time, each block's
        // cast multiplied in float32 (its products exact, summed in float32 as the compute
        // dtype's product sums them, in another order) and the sum rounded to the compute dtype
        // once.
        torch::Tensor sum = torch::zeros({g2.size(0), hidden}, x2.options().dtype(torch::kFloat32));
        for (int64_t v = 0; v < vocabulary; v += step) {
          const int64_t n = std::min(step, vocabulary - v);
          sum.addmm_(g2.narrow(1, v, n).to(torch::kFloat32),
                     weight.narrow(0, v, n).to(dtype).to(torch::kFloat32));
        }
        result[0] = sum.to(dtype).to(x_dtype).reshape(x.sizes());
      }
    }
    if (!ctx->needs_input_grad(1)) return result;
    const bool in_place = InPlaceGradients::allowed(weight);
    const bool add = in_place && weight.grad().defined();
    const bool cast_back = weight.scalar_type() != dtype;
    torch::Tensor target =
        add ? weight.mutable_grad() : torch::empty({vocabulary, hidden}, weight.options());
    for (int64_t v = 0; v < vocabulary; v += step) {
      const int64_t n = std::min(step, vocabulary - v);
      const torch::Tensor block_t = g2.narrow(1, v, n).t();  // [n, tokens]
      torch::Tensor out = target.narrow(0, v, n);
      if (add) {
        out.add_(cast_back ? block_t.mm(x2).to(weight.scalar_type()) : block_t.mm(x2));
      } else if (cast_back) {
        out.copy_(block_t.mm(x2));
      } else {
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
  const c10::DeviceType device = x.device().type();
  if (at::autocast::is_autocast_enabled(device) && torch::GradMode::is_enabled() &&
      weight.scalar_type() == torch::kFloat32 && x.is_floating_point() &&
      x.scalar_type() != torch::kDouble) {
    return TableLogits::apply(x, weight,
                              static_cast<int64_t>(at::autocast::get_autocast_dtype(device)));
  }
  // Without grad mode nothing is kept; with two dtypes outside autocast, torch's own rules.
  if (at::autocast::is_autocast_enabled(device) || x.scalar_type() != weight.scalar_type()) {
    return autocast_linear(x, weight);
  }
  return TableLogits::apply(x, weight, static_cast<int64_t>(weight.scalar_type()));
}

}  // namespace pipetrain::models
