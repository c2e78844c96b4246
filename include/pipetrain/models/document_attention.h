// Causal attention that never crosses a document: the rows of a packed batch attend segment by
// segment (data/sequence_layout.h), so a row of short documents costs what its documents cost
// (the sum of their squared lengths), not the row's squared width.
//
//   row r:   | doc a (La) | doc b (Lb) | pad |
//   scores:  [La x La causal]  [Lb x Lb causal]   padding: no attention, output 0
//
// Each segment is one scaled_dot_product_attention call on views of q, k, v (causal, within the
// segment), and the outputs are laid back in place. When every row is a single segment (one
// document per row, then padding) the whole batch is one causal call instead: a token before the
// padding never sees it, and the padding's outputs are never read by a counted target.
//
// Thread-safety: stateless.
#pragma once

#include <torch/types.h>

#include "pipetrain/data/sequence_layout.h"

namespace pipetrain::models {

// q [B, heads, T, d], k and v [B, kv_heads, T, d] (kv_heads divides heads: grouped-query
// attention) -> [B, heads, T, d]. REQUIRES layout.rows() == B and layout.width() == T.
torch::Tensor document_causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                                        const torch::Tensor& v, const data::SequenceLayout& layout,
                                        double scale);

// The rotary tables (cos or sin, [P, d] for positions 0..P-1) at every token's position in
// `layout`: [B, 1, T, d], to multiply q [B, heads, T, d].
torch::Tensor rotary_at_positions(const torch::Tensor& table, const data::SequenceLayout& layout);

}  // namespace pipetrain::models
