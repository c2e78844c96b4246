// SkipStash / SkipPopAdd (include/pipetrain/stage/skip_layers.h).
#include "pipetrain/stage/skip_layers.h"

#include "pipetrain/stage/skip.h"

namespace pipetrain {

torch::Tensor SkipStashImpl::forward(torch::Tensor input) {
  stash(name_, input);
  return input;
}

torch::Tensor SkipPopAddImpl::forward(torch::Tensor input) {
  return input + pop(name_);
}

}  // namespace pipetrain
