#include "pipetrain/stage/in_place_gradients.h"

#include <mutex>
#include <unordered_map>

namespace pipetrain {
namespace {

std::mutex& allowances_mutex() {
  static std::mutex m;
  return m;
}

// A weight's TensorImpl -> how many live scopes allow it.
std::unordered_map<const void*, int>& allowances() {
  static std::unordered_map<const void*, int> map;
  return map;
}

}  // namespace

InPlaceGradients::InPlaceGradients(const std::vector<torch::Tensor>& weights) {
  for (const torch::Tensor& w : weights) {
    if (w.defined() && w.is_leaf()) weights_.push_back(w.unsafeGetTensorImpl());
  }
  if (weights_.empty()) return;
  std::lock_guard<std::mutex> lock(allowances_mutex());
  for (const void* w : weights_) ++allowances()[w];
}

InPlaceGradients::~InPlaceGradients() {
  if (weights_.empty()) return;
  std::lock_guard<std::mutex> lock(allowances_mutex());
  for (const void* w : weights_) {
    auto it = allowances().find(w);
    if (it != allowances().end() && --it->second == 0) allowances().erase(it);
  }
}

bool InPlaceGradients::allowed(const torch::Tensor& weight) {
  if (!weight.defined() || !weight.is_leaf()) return false;
  std::lock_guard<std::mutex> lock(allowances_mutex());
  return allowances().count(weight.unsafeGetTensorImpl()) > 0;
}

}  // namespace pipetrain
