// WeightGradients: the weight half (W) of one segment's split backward from the gradients its
// input half (I) already passed, so W does not run the segment's backward a second time
// (src/stage/stage.cpp, "Split backward"; the technique of torch.distributed.pipelining's
// stage_backward_weight).
//
//   the segment's graph, roots (outputs) at the top, its input leaves at the bottom:
//
//      roots ---> ... ---> [X] ---> ... ---> inputs        I runs every node on a path to an
//                           |                              input (the "input side")
//                           +--> TBackward --> weight      W needs only the nodes that lead to
//                                                          the weights alone ("weight side")
//
//   [1] before I: the graph is walked from the roots; X, a node of the input side with an edge
//       into a weight's side, is where that weight's gradient leaves I's path. A pre-hook on X
//       keeps the gradients I passes into it.
//   [2] after I: the hooks are removed (what they kept stays).
//   [3] W: for each group of weights sharing such nodes, one engine call from the kept gradients
//       at their X nodes down to the weights: the weight side only (TBackward and the weight
//       gradient of X's own operation), never X's input side again.
//   Weights none of whose paths meet the input side (an embedding fed by token ids, a segment
//   without an input that wants a gradient) get theirs as before: one autograd::grad from the
//   segment's roots.
//
// The gradients are the same sums of the same products as a full backward's; the cost is
// memory: the gradients kept at every X wait from I to W (where the earlier W kept only the
// roots' gradients and then recomputed the rest).
//
// Ownership: holds the X nodes (shared) and their kept gradients until compute() or the
// destructor. Thread-safety: one segment, one thread (the stage's worker).
#pragma once

#include <memory>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <torch/types.h>

namespace pipetrain {

class WeightGradients {
 public:
  WeightGradients() = default;
  WeightGradients(const WeightGradients&) = delete;
  WeightGradients& operator=(const WeightGradients&) = delete;
  WeightGradients(WeightGradients&&) = default;
  WeightGradients& operator=(WeightGradients&&) = default;
  ~WeightGradients();

  // [1], before I over `roots`: finds the X nodes of `params` between `roots` and `inputs` (the
  // tensors I differentiates for) and hooks them.
  void capture(const std::vector<torch::Tensor>& roots, const std::vector<torch::Tensor>& inputs,
               const std::vector<torch::Tensor>& params);
  // [2], after I.
  void stop_capturing();
  // [3]: the gradient of each of `params` (the same list capture() got; undefined where nothing
  // flows), from the kept gradients, and from `roots` / `root_grads` for the weights no X
  // serves. Frees what was kept.
  std::vector<torch::Tensor> compute(const std::vector<torch::Tensor>& roots,
                                     const std::vector<torch::Tensor>& root_grads,
                                     const std::vector<torch::Tensor>& params);

 private:
  struct Group {
    std::vector<size_t> params;                                 // indices into capture()'s params
    std::vector<std::shared_ptr<torch::autograd::Node>> nodes;  // their X nodes
    std::vector<std::shared_ptr<std::vector<torch::Tensor>>> kept;  // per node, from its hook
  };
  std::vector<Group> groups_;
  std::vector<size_t> from_roots_;  // params no X serves
  bool hooked_ = false;
};

}  // namespace pipetrain
