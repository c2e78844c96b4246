// A mixture of experts' MoE layer and its load-balancing term (pipetrain/models/llama.h: LlamaMoe,
// load_balancing_loss): the router, the experts grouped by one sort, and under expert parallelism
// the dispatch and combine of token rows over the group.
#include <torch/torch.h>

#include "pipetrain/models/llama.h"
#include "pipetrain/models/routing.h"
#include "pipetrain/parallel/all_to_all.h"
#include "pipetrain/stage/auxiliary_loss.h"
#include "pipetrain/stage/skip.h"

namespace pipetrain::models {

LlamaMoeImpl::LlamaMoeImpl(std::shared_ptr<const LlamaConfig> config_,
                           torch::TensorOptions options_, int64_t layer_,
                           parallel::ExpertParallel ep_)
    : config(std::move(config_)), options(options_), layer(layer_), ep(std::move(ep_)) {
  reset();
}

void LlamaMoeImpl::reset() {
  const LlamaConfig& c = *config;
  const bool mixtral = c.architecture == LlamaArchitecture::kMixtral;
  auto make_experts = [&] {
    std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> held;
    const int64_t first = ep.first(c.num_experts);
    for (int64_t e = first; e < first + ep.count(c.num_experts); ++e) {
      held.emplace_back(std::to_string(e), LlamaMlp(config, options, parallel::TensorParallel{},
                                                    c.expert_intermediate_size, mixtral)
                                               .ptr());
    }
    experts = register_module("experts", torch::nn::ModuleDict(held));
  };
  // transformers' order: Qwen3-MoE registers the experts first, the others the gate.
  if (c.architecture == LlamaArchitecture::kQwen3Moe) make_experts();
  gate = register_module("gate", LlamaLinear(c.hidden_size, c.num_experts, false, options));
  if (c.architecture != LlamaArchitecture::kQwen3Moe) make_experts();
  if (c.shared_expert_intermediate_size > 0) {
    shared_expert = register_module(
        "shared_expert",
        LlamaMlp(config, options, parallel::TensorParallel{}, c.shared_expert_intermediate_size));
    shared_expert_gate =
        register_module("shared_expert_gate", LlamaLinear(c.hidden_size, 1, false, options));
  }
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> LlamaMoeImpl::route(
    const torch::Tensor& x) {
  const LlamaConfig& c = *config;
  const torch::Tensor logits = gate->forward(x);  // [N, E]
  const torch::Tensor probabilities = torch::softmax(logits, -1, torch::kFloat);
  auto [weights, chosen] = probabilities.topk(c.num_experts_per_tok, -1);
  if (c.norm_topk_prob) weights = weights / weights.sum(-1, /*keepdim=*/true);
  // Qwen's routers hand the weights on in the logits' dtype; Mixtral's keeps float32.
  if (c.architecture != LlamaArchitecture::kMixtral) weights = weights.to(logits.scalar_type());
  return {weights, chosen, probabilities};
}

torch::Tensor LlamaMoeImpl::forward(const torch::Tensor& x) {
  const LlamaConfig& c = *config;
  const int64_t h = c.hidden_size;
  const torch::Tensor flat = x.reshape({-1, h});
  auto [weights, chosen, probabilities] = route(flat);
  // Group the (token, slot) pairs by expert: one stable sort, then one contiguous run each.
  torch::Tensor order, counts;
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor by_expert = chosen.reshape({-1});
    order = std::get<1>(by_expert.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
    counts = torch::bincount(by_expert, {}, c.num_experts).cpu();
  }
  // --report-routing: a training forward's tokens per expert (a recompute's counted already).
  if (is_training() && !is_recomputing() && routing_recorder().enabled()) {
    const auto count = counts.accessor<int64_t, 1>();
    routing_recorder().add(layer, std::vector<int64_t>(count.data(), count.data() + count.size(0)));
  }
  torch::Tensor out = ep.split() ? run_experts_parallel(flat, weights, order, counts)
                                 : run_experts(flat, weights, order, counts);
  if (shared_expert) {
    out = out + torch::sigmoid(shared_expert_gate->forward(flat)) * shared_expert->forward(flat);
  }
  if (c.aux_loss && is_training()) {
    out = attach_auxiliary_loss(out, load_balancing_loss_of(probabilities, chosen),
                                c.router_aux_loss_coef);
  }
  return out.reshape(x.sizes());
}

LlamaMlpImpl& LlamaMoeImpl::expert(int64_t e) const {
  auto* mlp = (*experts)[std::to_string(e)]->as<LlamaMlpImpl>();
  TORCH_CHECK(mlp != nullptr, "expert ", e, " of layer ", layer, " is not held by this rank");
  return *mlp;
}

torch::Tensor LlamaMoeImpl::run_experts(const torch::Tensor& flat, const torch::Tensor& weights,
                                        const torch::Tensor& order, const torch::Tensor& counts) {
  const LlamaConfig& c = *config;
  const int64_t k = c.num_experts_per_tok;
  const torch::Tensor flat_weights = weights.reshape({-1});
  const auto count = counts.accessor<int64_t, 1>();
  torch::Tensor out = torch::zeros_like(flat);
  int64_t start = 0;
  for (int64_t e = 0; e < c.num_experts; ++e) {
    const int64_t n = count[e];
    if (n == 0) continue;
    const torch::Tensor pairs = order.narrow(0, start, n);
    start += n;
    const torch::Tensor tokens = pairs.div(k, "floor");
    const torch::Tensor y = expert(e).forward(flat.index_select(0, tokens));
    out.index_add_(0, tokens,
                   (y * flat_weights.index_select(0, pairs).unsqueeze(1)).to(out.scalar_type()));
  }
  return out;
}

// Expert parallelism (the class comment):
//   [1] the pairs sorted by expert: member g's experts' pairs are one run, sent[g] rows
//   [2] each member's per-expert counts for this rank's experts: an all-to-all of counts
//   [3] dispatch: the rows go to their experts' members (all_to_all_rows); received from member
//       g: its rows for this rank's first expert, then its second, ...
//   [4] each local expert once over its rows from every member, the outputs back in received
//       order
//   [5] combine: the outputs go back (all_to_all_rows), in [1]'s order; weighted and added into
//       their tokens' rows in ascending expert order, as run_experts adds them
// Every member calls it in the same order (the same schedule runs on every replica), even with
// no token routed to it: the counts say what each sends.
torch::Tensor LlamaMoeImpl::run_experts_parallel(const torch::Tensor& flat,
                                                 const torch::Tensor& weights,
                                                 const torch::Tensor& order,
                                                 const torch::Tensor& counts) {
  const LlamaConfig& c = *config;
  const int64_t k = c.num_experts_per_tok;
  const int members = ep.size();
  const int64_t local = ep.count(c.num_experts);
  // The lane's copy of the group (parallel/lane.h); the backward picks its own.
  C10dGroup& group = ep.group_of_lane();
  // [1], [2]
  std::vector<int64_t> send(static_cast<size_t>(members), 0);
  const auto count = counts.accessor<int64_t, 1>();
  for (int64_t e = 0; e < c.num_experts; ++e) send[static_cast<size_t>(e / local)] += count[e];
  torch::Tensor theirs = torch::empty_like(counts);  // [member][local expert]
  group.all_to_all(counts.contiguous(), theirs);
  const auto from = theirs.accessor<int64_t, 1>();
  std::vector<int64_t> receive(static_cast<size_t>(members), 0);
  for (int g = 0; g < members; ++g) {
    for (int64_t j = 0; j < local; ++j) receive[static_cast<size_t>(g)] += from[g * local + j];
  }
  // [3]
  const torch::Tensor tokens = order.div(k, "floor");
  const torch::Tensor received = parallel::all_to_all_rows(flat.index_select(0, tokens), send,
                                                           receive, *ep.group, ep.second.get());
  // [4] the rows of local expert j: member g's run at its offset, for every g
  std::vector<torch::Tensor> outputs;
  std::vector<torch::Tensor> positions;
  {
    std::vector<int64_t> offset(static_cast<size_t>(members), 0);
    for (int g = 1; g < members; ++g) {
      offset[static_cast<size_t>(g)] =
          offset[static_cast<size_t>(g) - 1] + receive[static_cast<size_t>(g) - 1];
    }
    for (int64_t j = 0; j < local; ++j) {
      std::vector<torch::Tensor> rows;
      for (int g = 0; g < members; ++g) {
        const int64_t n = from[g * local + j];
        if (n > 0)
          rows.push_back(torch::arange(offset[static_cast<size_t>(g)],
                                       offset[static_cast<size_t>(g)] + n, torch::kLong));
        offset[static_cast<size_t>(g)] += n;
      }
      if (rows.empty()) continue;
      const torch::Tensor at = torch::cat(rows).to(flat.device());
      positions.push_back(at);
      outputs.push_back(expert(ep.first(c.num_experts) + j).forward(received.index_select(0, at)));
    }
  }
  torch::Tensor back;
  if (outputs.empty()) {
    back = received.new_empty({0, flat.size(1)});
  } else {
    const torch::Tensor all = torch::cat(positions);
    back = torch::cat(outputs).index_select(0, std::get<1>(all.sort()));
  }
  // [5]
  const torch::Tensor returned =
      parallel::all_to_all_rows(back, receive, send, *ep.group, ep.second.get());
  const torch::Tensor pair_weights = weights.reshape({-1}).index_select(0, order).unsqueeze(1);
  torch::Tensor out = torch::zeros_like(flat);
  out.index_add_(0, tokens, (returned * pair_weights).to(out.scalar_type()));
  return out;
}

torch::Tensor load_balancing_loss(const torch::Tensor& router_logits, int64_t top_k) {
  const torch::Tensor probabilities = torch::softmax(router_logits, -1, torch::kFloat);
  torch::Tensor chosen;
  {
    torch::NoGradGuard no_grad;
    chosen = std::get<1>(probabilities.topk(top_k, -1));
  }
  return load_balancing_loss_of(probabilities, chosen);
}

torch::Tensor load_balancing_loss_of(const torch::Tensor& probabilities,
                                     const torch::Tensor& chosen) {
  const int64_t n = probabilities.size(0), e = probabilities.size(1);
  torch::Tensor fraction;
  {
    torch::NoGradGuard no_grad;
    fraction = torch::zeros({e}, probabilities.options())
                   .scatter_add_(0, chosen.reshape({-1}),
                                 torch::ones({chosen.numel()}, probabilities.options()))
                   .div_(static_cast<double>(n));
  }
  return (fraction * probabilities.mean(0)).sum() * static_cast<double>(e);
}

std::vector<torch::Tensor> LlamaMoeImpl::autocast_cast_parameters() const {
  std::vector<torch::Tensor> cast = {gate->weight};
  for (const auto& expert : experts->values()) {
    for (const torch::Tensor& w : expert->as<LlamaMlp>()->autocast_cast_parameters()) {
      cast.push_back(w);
    }
  }
  if (shared_expert) {
    for (const torch::Tensor& w : shared_expert->autocast_cast_parameters()) cast.push_back(w);
    cast.push_back(shared_expert_gate->weight);
  }
  return cast;
}

}  // namespace pipetrain::models
