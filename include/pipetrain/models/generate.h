// Greedy decoding with a causal language model, whatever runs its forward: the model itself, a
// Pipe (runtime/pipe.h, forward-only through the stages) or anything that maps token ids to
// logits.
//
//   ids = prompt
//   repeat max_new_tokens times:
//     next = argmax(logits_of(ids)[0, last position])      (the first of equal maxima, as torch)
//     ids += next; stop after a stop id (the config's eos_token_id, as transformers' generate)
//
// Without a KV cache each step runs the whole sequence again: O(n^2) work for n tokens, fine for
// checking a model against transformers, not for serving.
//
// Thread-safety: calls logits_of from the calling thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <torch/types.h>

namespace pipetrain::models {

// `logits_of`: int64 ids [1, T] -> logits [1, T, V]. Returns the new ids only (at most
// max_new_tokens, ending with the stop id that ended it, if any). Throws pipetrain::BadInput for
// an empty prompt or max_new_tokens < 0.
std::vector<int64_t> generate_greedy(
    const std::function<torch::Tensor(const torch::Tensor&)>& logits_of,
    const std::vector<int64_t>& prompt, int64_t max_new_tokens,
    const std::vector<int64_t>& stop_ids = {});

}  // namespace pipetrain::models
