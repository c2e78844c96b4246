// The Llama embedding's lookup and the output layer's logits as autograd functions whose weight
// gradient goes into .grad() without a second vocabulary-sized tensor where the backward's caller
// allows it (pipetrain/stage/in_place_gradients.h); elsewhere they return the gradient torch's
// own operations return, with the same bits.
//
//   table_lookup(w, tokens, pad)   torch::embedding's values. Backward, in place on a CPU weight
//                                  with a .grad(): the micro-batch's gradient summed per row
//                                  used (the rows in token order, as the dense backward sums
//                                  them) and added into those rows of .grad().
//   table_logits(x, w)             torch::linear(x, w)'s values. Backward: dx = g w; dw = g^T x
//                                  a block of the vocabulary's rows at a time, written into a
//                                  new tensor or (in place) added into .grad() block by block.
//                                  (The blocked products equal the whole one's bits on the CPU,
//                                  as checked here; either way every path computes them so.)
//                                  Under autocast (a float32 w, with grad mode): on the casts
//                                  of x and w, the table itself kept for the backward and cast
//                                  again there (as stage/autocast_linear.h), dw computed in the
//                                  compute dtype by blocks and cast back to float32, as torch's
//                                  cast sends it back whole. Otherwise, with x and w of two
//                                  dtypes or no grad mode under autocast: autocast_linear.
#pragma once

#include <torch/types.h>

namespace pipetrain::models {

torch::Tensor table_lookup(const torch::Tensor& weight, const torch::Tensor& tokens,
                           int64_t padding_idx);
torch::Tensor table_logits(const torch::Tensor& x, const torch::Tensor& weight);

}  // namespace pipetrain::models
