// Residual connections as stash/pop layer pairs (skip_layers.h).
#include "skip_layers.h"

#include "pipetrain/stage/skip.h"

namespace pipetrain::examples {

torch::Tensor StashSkipImpl::forward(torch::Tensor input) {
  pipetrain::stash(name_, input);
  return input;
}

void StashSkipImpl::pretty_print(std::ostream& stream) const {
  stream << "pipetrain::examples::StashSkip(" << name_ << ")";
}

AddSkipImpl::AddSkipImpl(AddSkipOptions options_) : options(std::move(options_)) {
  reset();
}

void AddSkipImpl::reset() {
  TORCH_CHECK(options.projection_in() >= 0 && options.projection_stride() > 0, "AddSkip('",
              options.name(), "'): projection_in must be >= 0 and stride > 0");
  if (options.projection_in() > 0) {
    TORCH_CHECK(options.projection_out() > 0, "AddSkip('", options.name(), "'): a projection from ",
                options.projection_in(), " channels needs projection_out > 0");
    projection = register_module(
        "projection", torch::nn::Conv2d(torch::nn::Conv2dOptions(options.projection_in(),
                                                                 options.projection_out(), 1)
                                            .stride(options.projection_stride())));
  }
}

torch::Tensor AddSkipImpl::forward(torch::Tensor input) {
  torch::Tensor skip = pipetrain::pop(options.name());
  if (projection) skip = projection->forward(skip);
  TORCH_CHECK(skip.sizes() == input.sizes(), "AddSkip('", options.name(), "'): the skip has shape ",
              skip.sizes(), " but the main path has ", input.sizes(),
              "; give AddSkipOptions a projection (projection_in/out/stride) to match them");
  return input + skip;
}

void AddSkipImpl::pretty_print(std::ostream& stream) const {
  stream << "pipetrain::examples::AddSkip(" << options.name();
  if (options.projection_in() > 0) {
    stream << ", projection " << options.projection_in() << "->" << options.projection_out()
           << " stride " << options.projection_stride();
  }
  stream << ")";
}

}  // namespace pipetrain::examples
