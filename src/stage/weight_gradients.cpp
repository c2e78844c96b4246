// W from the gradients I passed (src/stage/weight_gradients.h). [n] cite the header's steps.
#include "weight_gradients.h"

#include <algorithm>
#include <deque>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

namespace pipetrain {
namespace {

using torch::autograd::Edge;
using torch::autograd::Node;

// Keeps the gradients a node receives (its pre-hook; it changes nothing).
class KeepGradients : public torch::autograd::FunctionPreHook {
 public:
  explicit KeepGradients(std::shared_ptr<std::vector<torch::Tensor>> slot)
      : slot_(std::move(slot)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    *slot_ = grads;
    return grads;
  }

 private:
  std::shared_ptr<std::vector<torch::Tensor>> slot_;
};

std::shared_ptr<Node> node_of(const torch::Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return nullptr;
  return torch::autograd::impl::gradient_edge(t).function;
}

// The graph below the roots, with its edges reversed (a node -> the nodes that feed it a
// gradient), and every node's owner.
struct ReversedGraph {
  std::unordered_map<Node*, std::vector<Node*>> feeders;
  std::unordered_map<Node*, std::shared_ptr<Node>> owner;
  std::unordered_set<Node*> roots;

  explicit ReversedGraph(const std::vector<torch::Tensor>& root_tensors) {
    std::deque<Node*> queue;
    for (const torch::Tensor& r : root_tensors) {
      std::shared_ptr<Node> node = node_of(r);
      if (!node || !owner.emplace(node.get(), node).second) continue;
      roots.insert(node.get());
      queue.push_back(node.get());
    }
    while (!queue.empty()) {
      Node* node = queue.front();
      queue.pop_front();
      for (const Edge& edge : node->next_edges()) {
        if (!edge.function) continue;
        feeders[edge.function.get()].push_back(node);
        if (owner.emplace(edge.function.get(), edge.function).second) {
          queue.push_back(edge.function.get());
        }
      }
    }
  }

  // Every node from which one of `starts` is reached (the starts included).
  std::unordered_set<Node*> above(const std::vector<Node*>& starts) const {
    std::unordered_set<Node*> seen(starts.begin(), starts.end());
    std::deque<Node*> queue(starts.begin(), starts.end());
    while (!queue.empty()) {
      Node* node = queue.front();
      queue.pop_front();
      auto found = feeders.find(node);
      if (found == feeders.end()) continue;
      for (Node* feeder : found->second) {
        if (seen.insert(feeder).second) queue.push_back(feeder);
      }
    }
    return seen;
  }
};

// Smallest representative of `p` (union-find over the params that share an X node).
size_t find(std::vector<size_t>& parent, size_t p) {
  while (parent[p] != p) p = parent[p] = parent[parent[p]];
  return p;
}

}  // namespace

WeightGradients::~WeightGradients() {
  stop_capturing();
}

void WeightGradients::capture(const std::vector<torch::Tensor>& roots,
                              const std::vector<torch::Tensor>& inputs,
                              const std::vector<torch::Tensor>& params) {
  groups_.clear();
  from_roots_.clear();
  const ReversedGraph graph(roots);
  std::vector<Node*> input_nodes;
  for (const torch::Tensor& input : inputs) {
    std::shared_ptr<Node> node = node_of(input);
    if (node && graph.owner.count(node.get())) input_nodes.push_back(node.get());
  }
  const std::unordered_set<Node*> input_side = graph.above(input_nodes);
  // [1] Per weight, the input-side nodes where its gradient leaves I's path; a weight also reached
  // from a root without passing the input side (or not reached at all) takes the roots' way.
  std::vector<std::vector<Node*>> crossings(params.size());
  for (size_t p = 0; p < params.size(); ++p) {
    std::shared_ptr<Node> start = node_of(params[p]);
    bool from_roots = !start || !graph.owner.count(start.get()) || input_side.empty();
    std::unordered_set<Node*> seen{start.get()};
    std::deque<Node*> queue{start.get()};
    while (!from_roots && !queue.empty()) {
      Node* node = queue.front();
      queue.pop_front();
      if (graph.roots.count(node)) from_roots = true;  // a root above no input
      auto found = graph.feeders.find(node);
      if (found == graph.feeders.end()) continue;
      for (Node* feeder : found->second) {
        if (!seen.insert(feeder).second) continue;
        if (input_side.count(feeder)) {
          crossings[p].push_back(feeder);
        } else {
          queue.push_back(feeder);
        }
      }
    }
    if (from_roots || crossings[p].empty()) {
      from_roots_.push_back(p);
      crossings[p].clear();
    }
  }
  // Weights that share a crossing node share one engine call.
  std::vector<size_t> parent(params.size());
  std::iota(parent.begin(), parent.end(), size_t{0});
  std::unordered_map<Node*, size_t> first_user;
  for (size_t p = 0; p < params.size(); ++p) {
    for (Node* node : crossings[p]) {
      auto [it, fresh] = first_user.emplace(node, p);
      if (!fresh) parent[find(parent, p)] = find(parent, it->second);
    }
  }
  std::unordered_map<size_t, size_t> group_of;  // representative -> index in groups_
  std::unordered_set<Node*> hooked;
  for (size_t p = 0; p < params.size(); ++p) {
    if (crossings[p].empty()) continue;
    const size_t root = find(parent, p);
    auto [it, fresh] = group_of.emplace(root, groups_.size());
    if (fresh) groups_.emplace_back();
    Group& group = groups_[it->second];
    group.params.push_back(p);
    for (Node* node : crossings[p]) {
      if (!hooked.insert(node).second) continue;
      auto slot = std::make_shared<std::vector<torch::Tensor>>();
      const std::shared_ptr<Node>& owner = graph.owner.at(node);
      owner->add_pre_hook(std::make_unique<KeepGradients>(slot));
      group.nodes.push_back(owner);
      group.kept.push_back(slot);
    }
  }
  hooked_ = !hooked.empty();
}

void WeightGradients::stop_capturing() {
  if (!hooked_) return;
  // [2] Each hooked node has ours as its last pre-hook (nothing else adds any in between).
  for (Group& group : groups_) {
    for (const std::shared_ptr<Node>& node : group.nodes) {
      auto& hooks = node->pre_hooks();
      auto ours = std::find_if(hooks.rbegin(), hooks.rend(), [](const auto& hook) {
        return dynamic_cast<KeepGradients*>(hook.get()) != nullptr;
      });
      if (ours != hooks.rend()) hooks.erase(std::next(ours).base());
    }
  }
  hooked_ = false;
}

std::vector<torch::Tensor> WeightGradients::compute(const std::vector<torch::Tensor>& roots,
                                                    const std::vector<torch::Tensor>& root_grads,
                                                    const std::vector<torch::Tensor>& params) {
  stop_capturing();
  std::vector<torch::Tensor> result(params.size());
  auto& engine = torch::autograd::Engine::get_default_engine();
  for (Group& group : groups_) {  // [3]
    torch::autograd::edge_list from;
    torch::autograd::variable_list grads;
    for (size_t n = 0; n < group.nodes.size(); ++n) {
      const std::vector<torch::Tensor>& kept = *group.kept[n];
      for (size_t k = 0; k < kept.size(); ++k) {
        if (!kept[k].defined()) continue;
        from.emplace_back(group.nodes[n], static_cast<uint32_t>(k));
        grads.push_back(kept[k]);
      }
    }
    if (from.empty()) continue;  // no gradient reached these weights
    torch::autograd::edge_list to;
    for (size_t p : group.params) to.push_back(torch::autograd::impl::gradient_edge(params[p]));
    const torch::autograd::variable_list got =
        engine.execute(from, grads, /*keep_graph=*/true, /*create_graph=*/false,
                       /*accumulate_grad=*/false, to);
    for (size_t i = 0; i < group.params.size(); ++i) result[group.params[i]] = got[i];
  }
  if (!from_roots_.empty() && !roots.empty()) {
    std::vector<torch::Tensor> wanted;
    for (size_t p : from_roots_) wanted.push_back(params[p]);
    const std::vector<torch::Tensor> got =
        torch::autograd::grad(roots, wanted, root_grads, /*retain_graph=*/true,
                              /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0; i < from_roots_.size(); ++i) result[from_roots_[i]] = got[i];
  }
  groups_.clear();
  from_roots_.clear();
  return result;
}

}  // namespace pipetrain
