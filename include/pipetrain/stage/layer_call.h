// Calling one layer of a torch::nn::Sequential with the values that flow between layers.
//
// Between layers a value is a tuple of tensors (std::vector<torch::Tensor>; one tensor is a tuple
// of size 1). A layer is an AnyModule; it is called with 1-4 tensors, and may return a Tensor, a
// std::vector<Tensor> or a std::tuple<Tensor, Tensor>. Anything else is a clear error: pipetrain
// moves only tensors across stage boundaries.
//
// Thread-safety: stateless; concurrent calls on different layers are safe.
#pragma once

#include <string>
#include <vector>

#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

namespace pipetrain {

// Runs `layer` on `inputs`. `name` (the layer's name in the Sequential) appears in errors.
// REQUIRES: 1 <= inputs.size() <= 4.
std::vector<torch::Tensor> call_layer(torch::nn::AnyModule& layer, const std::string& name,
                                      const std::vector<torch::Tensor>& inputs);

// Where `model` fails on `inputs`, for an error message: ", at layer 'name' (layer l of L,
// TypeName, which got [shape])" for the first layer that throws when the first two rows run
// through the layers one at a time (without gradients, skips in a context as the stages run
// them); "" when none does.
std::string where_forward_fails(torch::nn::Sequential& model, const torch::Tensor& inputs);

}  // namespace pipetrain
