// Parameters read only through autocast's casts (pipetrain/stage/autocast_parameters.h).
#include "pipetrain/stage/autocast_parameters.h"

#include <functional>
#include <map>
#include <set>

#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

namespace pipetrain {
namespace {

// The parameters `module` itself names as read only through autocast's casts.
std::set<const void*> cast_by(const torch::nn::Module& module) {
  std::set<const void*> named;
  auto add = [&](const torch::Tensor& t) {
    if (t.defined()) named.insert(t.unsafeGetTensorImpl());
  };
  if (const auto* linear = dynamic_cast<const torch::nn::LinearImpl*>(&module)) {
    add(linear->weight);
    add(linear->bias);
  } else if (const auto* conv1 = dynamic_cast<const torch::nn::Conv1dImpl*>(&module)) {
    add(conv1->weight);
    add(conv1->bias);
  } else if (const auto* conv2 = dynamic_cast<const torch::nn::Conv2dImpl*>(&module)) {
    add(conv2->weight);
    add(conv2->bias);
  } else if (const auto* conv3 = dynamic_cast<const torch::nn::Conv3dImpl*>(&module)) {
    add(conv3->weight);
    add(conv3->bias);
  }
  if (const auto* declared = dynamic_cast<const AutocastCastParameters*>(&module)) {
    for (const torch::Tensor& t : declared->autocast_cast_parameters()) add(t);
  }
  return named;
}

}  // namespace

std::vector<torch::Tensor> autocast_cast_parameters(const torch::nn::Module& root) {
  // Whether every module registering a parameter had it named by itself or an ancestor.
  std::map<const void*, bool> qualifies;
  std::vector<torch::Tensor> order;
  std::function<void(const torch::nn::Module&, std::set<const void*>)> visit =
      [&](const torch::nn::Module& module, std::set<const void*> named) {
        const std::set<const void*> own = cast_by(module);
        named.insert(own.begin(), own.end());
        for (const auto& item : module.named_parameters(/*recurse=*/false)) {
          const torch::Tensor& p = item.value();
          const void* key = p.unsafeGetTensorImpl();
          auto [it, fresh] = qualifies.emplace(key, true);
          if (fresh) order.push_back(p);
          it->second = it->second && named.count(key) > 0;
        }
        for (const auto& child : module.children()) visit(*child, named);
      };
  visit(root, {});
  std::vector<torch::Tensor> result;
  for (const torch::Tensor& p : order) {
    if (qualifies.at(p.unsafeGetTensorImpl())) result.push_back(p);
  }
  return result;
}

std::set<const void*> narrowable_parameters(const torch::nn::Module& root) {
  std::set<const void*> narrowable;
  for (const torch::Tensor& p : autocast_cast_parameters(root)) {
    if (p.scalar_type() == torch::kFloat) narrowable.insert(p.unsafeGetTensorImpl());
  }
  return narrowable;
}

}  // namespace pipetrain
