// A linear that keeps its parameters, not their autocast casts (pipetrain/stage/autocast_linear.h).
#include "pipetrain/stage/autocast_linear.h"

#include <ATen/ExpandUtils.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/torch.h>

namespace pipetrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Autocast's rule: it casts floating-point arguments other than double to the compute dtype.
torch::Tensor cast(const torch::Tensor& t, c10::ScalarType dtype) {
  return t.defined() && t.is_floating_point() && t.scalar_type() != torch::kDouble &&
                 t.scalar_type() != dtype
             ? t.to(dtype)
             : t;
}

class CastOnUseLinear : public torch::autograd::Function<CastOnUseLinear> {
 public:
  // `placed_bias`: the bias, or an empty tensor where there is none (Function::apply takes no
  // undefined tensor).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& placed_bias,
                               bool has_bias, int64_t dtype) {
    const torch::Tensor bias = has_bias ? placed_bias : torch::Tensor();
    const auto compute = static_cast<c10::ScalarType>(dtype);
    const torch::Tensor xc = cast(x, compute);
    ctx->save_for_backward({xc, weight});
    ctx->saved_data["dtype"] = dtype;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["bias"] = bias.defined();
    if (bias.defined()) {
      ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias.scalar_type());
      ctx->saved_data["bias_sizes"] = bias.sizes().vec();
    }
    return torch::linear(xc, cast(weight, compute), cast(bias, compute));
  }

  // The formulas autograd applies to torch::linear's graph under autocast: a contiguous input is
  // folded to [rows, in] and multiplied by the weight's transpose (addmm with a bias, mm
  // without); mm's gradients (torch's mm_mat1_backward, mm_mat2_backward) pick their operands'
  // order by the operands' layouts; an expanded bias's gradient is summed to its shape; each cast
  // sends its gradient back in the dtype it was cast from.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& xc = saved[0];
    const torch::Tensor& weight = saved[1];
    const auto compute = static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
    const torch::Tensor mat2 = cast(weight, compute).t();  // the forward's bits again
    const torch::Tensor mat1 = xc.reshape({-1, xc.size(-1)});
    const torch::Tensor grad = grads[0].reshape({mat1.size(0), mat2.size(1)});
    torch::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) {
      const bool column_major = mat1.stride(0) == 1 && mat1.stride(1) == mat1.size(0);
      dx = (column_major ? mat2.mm(grad.t()).t() : grad.mm(mat2.t())).reshape(xc.sizes());
      dx = dx.to(static_cast<c10::ScalarType>(ctx->saved_data["x_dtype"].toInt()));
    }
    if (ctx->needs_input_grad(1)) {
      const bool column_major = mat2.stride(0) == 1 && mat2.stride(1) == mat2.size(0);
      dw = (column_major ? grad.t().mm(mat1).t() : mat1.t().mm(grad)).t().to(weight.scalar_type());
    }
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) {
      const std::vector<int64_t> sizes = ctx->saved_data["bias_sizes"].toIntVector();
      db = at::sum_to(grad, sizes)
               .to(static_cast<c10::ScalarType>(ctx->saved_data["bias_dtype"].toInt()));
    }
    return {dx, dw, db, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor autocast_linear(const torch::Tensor& x, const torch::Tensor& weight,
                              const torch::Tensor& bias) {
  const c10::DeviceType device = x.device().type();
  if (!at::autocast::is_autocast_enabled(device) || !torch::GradMode::is_enabled() ||
      weight.scalar_type() != torch::kFloat32 || x.dim() < 2 || !x.is_contiguous() ||
      !(x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()))) {
    return torch::linear(x, weight, bias);
  }
  return CastOnUseLinear::apply(x, weight, bias.defined() ? bias : torch::empty({0}),
                                bias.defined(),
                                static_cast<int64_t>(at::autocast::get_autocast_dtype(device)));
}

}  // namespace pipetrain
