// profile_llama: the planner's and the memory model's profile (partition/profile.h) of a
// Llama-family model, measured without building the whole model.
//
//   built (random init)         embedding, ONE decoder layer, final norm, head    4 entries
//   profiled on `sample`        ids [B, T] (profile_sequential: times, activation bytes, ...)
//   expanded                    layers = [embedding, decoder x L, norm, head]     L + 3 entries
//
// Every decoder layer of a config is the same computation on the same shapes, so one measured
// layer stands for each of them: times, parameter, activation and boundary bytes. Memory held at
// once: the embedding and head tables (one table when tied) and one layer, with its gradients;
// a Llama-3.2-1B-shaped config (1.2 B parameters) profiles in about 1.3 GB instead of 20.
//
// With `table_rows` > 0 and a larger vocabulary, the table is not built whole either: the model
// is profiled twice, on vocabularies of table_rows / 2 and table_rows rows (the sample's ids taken
// modulo the smaller), and the embedding's and head's figures are extended to the config's
// vocabulary on the line through the two. Every byte figure of those layers (parameters, saved
// tensors, logits) is affine in the vocabulary, so the line gives the bytes of the whole table's
// profile; their times are extended the same way, with the two measurements' noise multiplied
// by (vocabulary - table_rows / 2) / (table_rows / 2): for the memory check, not for plans.
// `mlp_rows` > 0 does the same for the decoder layer's MLP: profiled at widths (intermediate
// sizes) of mlp_rows / 2 and mlp_rows, its figures extended to the config's width (every byte
// figure of the layer is affine in it: the three projections' parameters and the MLP's saved
// tensors). The two cuts share the two measurements. A Qwen2-1.5B-shaped layer (8960 wide) is
// 46.8 M parameters; at a width of 1024, 15.8 M.
//
// Thread-safety: uses torch's intra-op threads; not concurrently with training.
#pragma once

#include <cstdint>

#include <torch/types.h>

#include "pipetrain/models/llama_config.h"
#include "pipetrain/parallel/expert_parallel.h"
#include "pipetrain/parallel/tensor_parallel.h"
#include "pipetrain/partition/profile.h"
#include "pipetrain/partition/profiler.h"
#include "pipetrain/stage/precision.h"

namespace pipetrain::models {

// REQUIRES sample int64 ids [B, T] below the vocabulary. Throws what profile_sequential throws,
// and ModelConfigError for a config make_llama refuses. `tp`: the layers as one tensor-parallel
// rank builds them (LlamaBuildOptions::tensor_parallel); a group that runs in this process alone,
// C10dGroup::mirror (transport/c10d.h), profiles a rank's slices, shapes and allocations. The
// profile's times are then the rank's compute without the collectives' wait. `table_rows`,
// `mlp_rows`: as above (0: the whole vocabulary, the whole width); rounded down to a multiple of
// 2 x the tensor-parallel ranks, and at least that. `cp`: the attention as one context-parallel
// rank runs it (a mirror group: its ring's blocks and buffers, the sample its tokens of each row).
partition::ModelProfile profile_llama(const LlamaConfig& config, const torch::Tensor& sample,
                                      const partition::ProfileOptions& options = {},
                                      uint64_t seed = 0, const parallel::TensorParallel& tp = {},
                                      std::int64_t table_rows = 0, std::int64_t mlp_rows = 0,
                                      const parallel::ExpertParallel& ep = {},
                                      const parallel::ContextParallel& cp = {});

// The profile of a model of `config.num_hidden_layers` layers from one measured on `measured`
// layers (entries: embedding, decoder x measured, norm, head): the last measured decoder layer
// stands for the missing ones. Numbers the entries as the Sequential does ("3:LlamaDecoderLayer").
partition::ModelProfile expand_llama_profile(const partition::ModelProfile& profile,
                                             const LlamaConfig& config);

// Routing imbalance under expert parallelism. A profile runs a mixture's layer as one ep rank
// holds it fed by identical members (balanced routing: the rank's experts receive as many
// (token, choice) rows as its own tokens make, T x k). Routing is dropless, so a rank receives
// what its group's tokens choose: the rows on the rank holding the busiest experts are F x T x k,
// F the rank's imbalance, at most ep x min(k, experts / ep) / k (every token of the group choosing
// this rank's experts as often as it can; parallel::routing_imbalance_bound). At ep 1 every rank
// computes its own T x k rows whatever the routing. The expert's saved tensors grow with F; the
// rows the combine brings back to the sender do not.
//
// The bytes one routed row keeps on the expert's rank until the backward (the expert's saved
// tensors for one row of `config`'s expert width), measured by running one expert forward on 64
// rows at `precision` under an allocation counter.
std::int64_t expert_row_bytes(const LlamaConfig& config, Precision precision);
// Adds (imbalance - 1) x T x k x expert_row_bytes to every MoE layer's activation bytes (and
// their split-backward forms) at each measured micro-batch size, T = rows x `tokens_per_row`.
// Throws BadInput naming the value when imbalance is below 1 or above the bound, or given (> 1)
// with ep 1 or a dense model.
void apply_routing_imbalance(partition::ModelProfile& profile, const LlamaConfig& config,
                             std::int64_t tokens_per_row, int ep, double imbalance,
                             Precision precision);

}  // namespace pipetrain::models
