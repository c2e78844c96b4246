// The layer adapter: tuple-of-tensors in, tuple-of-tensors out
// (include/pipetrain/stage/layer_call.h).
#include "pipetrain/stage/layer_call.h"

#include <tuple>

#include <c10/util/Exception.h>

#include "pipetrain/base/check.h"

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

}  // namespace pipetrain
