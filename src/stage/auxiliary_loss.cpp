// Auxiliary losses attached inside the pipeline (pipetrain/stage/auxiliary_loss.h).
#include "pipetrain/stage/auxiliary_loss.h"

#include <torch/torch.h>

namespace pipetrain {
namespace {

thread_local double current_weight = 1.0;

// Identity on y; the term's gradient is the scale it carries.
struct AttachTerm : torch::autograd::Function<AttachTerm> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& y,
                               const torch::Tensor& term, double scale) {
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["dtype"] = static_cast<int64_t>(term.scalar_type());
    ctx->saved_data["device"] = term.device().str();
    return y.view_as(y);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const double scale = ctx->saved_data["scale"].toDouble();
    const auto options =
        torch::TensorOptions()
            .dtype(static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt()))
            .device(torch::Device(ctx->saved_data["device"].toStringRef()));
    return {grads[0], torch::full({}, scale, options), torch::Tensor()};
  }
};

}  // namespace

AuxiliaryLossScope::AuxiliaryLossScope(double weight) : previous_(current_weight) {
  current_weight = weight;
}

AuxiliaryLossScope::~AuxiliaryLossScope() {
  current_weight = previous_;
}

double auxiliary_loss_weight() {
  return current_weight;
}

torch::Tensor attach_auxiliary_loss(const torch::Tensor& y, const torch::Tensor& term,
                                    double coefficient) {
  if (!term.requires_grad() || !torch::GradMode::is_enabled()) return y;
  return AttachTerm::apply(y, term, coefficient * current_weight);
}

}  // namespace pipetrain
