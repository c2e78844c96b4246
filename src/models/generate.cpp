// Greedy decoding (models/generate.h).
#include "pipetrain/models/generate.h"

#include <algorithm>

#include <torch/torch.h>

#include "pipetrain/base/error.h"

namespace pipetrain::models {

std::vector<int64_t> generate_greedy(
    const std::function<torch::Tensor(const torch::Tensor&)>& logits_of,
    const std::vector<int64_t>& prompt, int64_t max_new_tokens,
    const std::vector<int64_t>& stop_ids) {
  if (prompt.empty()) throw BadInput("generate: the prompt holds no token ids");
  if (max_new_tokens < 0) {
    throw BadInput("generate: max_new_tokens must be >= 0, got " + std::to_string(max_new_tokens));
  }
  torch::NoGradGuard no_grad;
  std::vector<int64_t> ids = prompt;
  std::vector<int64_t> generated;
  for (int64_t n = 0; n < max_new_tokens; ++n) {
    const torch::Tensor input =
        torch::tensor(ids, torch::kInt64).reshape({1, static_cast<int64_t>(ids.size())});
    const torch::Tensor logits = logits_of(input);
    const int64_t next = logits.select(1, logits.size(1) - 1).argmax(-1).item<int64_t>();
    ids.push_back(next);
    generated.push_back(next);
    if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) break;
  }
  return generated;
}

}  // namespace pipetrain::models
