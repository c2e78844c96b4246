// The layer adapter: tuple-of-tensors in, tuple-of-tensors out
// (include/pipetrain/stage/layer_call.h).
#include "pipetrain/stage/layer_call.h"

#include <algorithm>
#include <tuple>

#include <c10/util/Exception.h>

#include "pipetrain/base/check.h"
#include "pipetrain/stage/skip.h"

namespace pipetrain {

std::vector<torch::Tensor> call_layer(torch::nn::AnyModule& layer, const std::string& name,
                                      const std::vector<torch::Tensor>& inputs) {
  torch::nn::AnyValue result = [&]() -> torch::nn::AnyValue {
    switch (inputs.size()) {
      case 1:
        return layer.any_forward(inputs[0]);
      case 2:
        return layer.any_forward(inputs[0], inputs[1]);
      case 3:
        return layer.any_forward(inputs[0], inputs[1], inputs[2]);
      case 4:
        return layer.any_forward(inputs[0], inputs[1], inputs[2], inputs[3]);
      default:
        throw BadInput(
            c10::str("layer '", name, "' would receive ", inputs.size(),
                     " tensors; pipetrain calls layers with 1 to 4 tensors: make the previous "
                     "layer return fewer (e.g. pack them with torch::stack)"));
    }
  }();
  if (auto* tensor = result.try_get<torch::Tensor>()) return {*tensor};
  if (auto* tuple = result.try_get<std::vector<torch::Tensor>>()) return *tuple;
  if (auto* pair = result.try_get<std::tuple<torch::Tensor, torch::Tensor>>()) {
    return {std::get<0>(*pair), std::get<1>(*pair)};
  }
  throw BadInput(c10::str(
      "layer '", name, "' returned a value of type ", c10::demangle(result.type_info().name()),
      "; pipetrain passes only torch::Tensor, std::vector<torch::Tensor> or "
      "std::tuple<torch::Tensor, torch::Tensor> between layers: wrap the layer so it "
      "returns one of those"));
}

std::string where_forward_fails(torch::nn::Sequential& model, const torch::Tensor& inputs) {
  torch::NoGradGuard no_grad;
  SkipContext skips;
  SkipContextGuard guard(&skips);
  std::vector<torch::Tensor> values = {inputs.slice(0, 0, std::min<int64_t>(2, inputs.size(0)))};
  const auto children = model->named_children();
  std::vector<torch::nn::AnyModule> modules(model->begin(), model->end());
  for (size_t l = 0; l < modules.size(); ++l) {
    try {
      values = call_layer(modules[l], children[l].key(), values);
    } catch (const std::exception&) {
      std::string shapes;
      for (const auto& v : values) shapes += (shapes.empty() ? "" : ", ") + c10::str(v.sizes());
      return ", at layer '" + children[l].key() + "' (layer " + std::to_string(l) + " of " +
             std::to_string(modules.size()) + ", " + modules[l].ptr()->name() + ", which got " +
             shapes + ")";
    }
  }
  return "";
}

}  // namespace pipetrain
