// SkipStash / SkipPopAdd (include/pipetrain/stage/skip_layers.h).
#include "pipetrain/stage/skip_layers.h"

#include "pipetrain/base/check.h"
#include "pipetrain/stage/skip.h"

namespace pipetrain {

torch::Tensor SkipStashImpl::forward(torch::Tensor input) {
  stash(name_, input);
  return input;
}

void SkipStashImpl::pretty_print(std::ostream& stream) const {
  stream << "pipetrain::SkipStash(" << name_ << ")";
}

SkipPopAddImpl::SkipPopAddImpl(SkipPopAddOptions options_) : options(std::move(options_)) {
  reset();
}

void SkipPopAddImpl::reset() {
  // A clone, not the prototype itself: Cloneable::clone() calls reset() on the copy, which must
  // get a projection of its own rather than share the original's parameters.
  projection = {};
  if (!options.projection().is_empty()) {
    projection = options.projection().clone();
    register_module("projection", projection.ptr());
  }
}

torch::Tensor SkipPopAddImpl::forward(torch::Tensor input) {
  torch::Tensor skip = pop(options.name());
  if (!projection.is_empty()) skip = projection.forward(skip);
  PIPETRAIN_CHECK_INPUT(
      skip.sizes() == input.sizes(), "SkipPopAdd('", options.name(), "'): the skip has shape ",
      skip.sizes(), " but the main path has ", input.sizes(),
      "; give SkipPopAddOptions a projection (e.g. a strided 1x1 Conv2d) to match them");
  return input + skip;
}

void SkipPopAddImpl::pretty_print(std::ostream& stream) const {
  stream << "pipetrain::SkipPopAdd(" << options.name() << ")";
}

}  // namespace pipetrain
