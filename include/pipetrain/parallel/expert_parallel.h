// Expert parallelism (Megatron's expert-data-parallel layout): a mixture's experts split over
// the E ranks of an expert-parallel group carved out of the data-parallel replicas, the dense
// weights replicated as data parallelism replicates them.
//
//   dp 4, ep 2 (replicas of one pipeline rank and tp rank):
//     replica          0      1      2      3
//     expert-parallel  {0, 1}        {2, 3}          consecutive replicas: one group each
//     experts held     0..n/2 n/2..n 0..n/2 n/2..n   group rank g: [g n/E, (g+1) n/E)
//     expert-data-par. {0, 2} {1, 3}                 the replicas holding the same experts
//
// A layer's tokens stay with their replica; each token row goes to the rank holding its expert
// (dispatch: an all-to-all of rows over the group), the expert runs there over every row it got,
// and the outputs come back the same way (combine): parallel::all_to_all_rows, differentiable,
// so an expert's weight gradient on its rank sums what the E replicas' tokens gave it. The
// expert-data-parallel sum then adds the other groups' (dense weights: the data-parallel sum).
//
// ExpertParallel{} (no group) is expert-parallel size 1: every rank holds every expert and the
// layer sends nothing. Thread-safety: a value; its group as C10dGroup (one thread at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "pipetrain/transport/c10d.h"

namespace pipetrain::parallel {

struct ExpertParallel {
  std::shared_ptr<C10dGroup> group;
  // The same members' second group, for the collectives of compute lane 1 (parallel/lane.h):
  // set where the overlap of expert exchanges runs a backward beside a forward; null otherwise.
  std::shared_ptr<C10dGroup> second;
  // The group of the calling thread's lane: `second` on lane 1 where it is set, else `group`.
  C10dGroup& group_of_lane() const;

  int size() const { return group ? group->size() : 1; }
  int rank() const { return group ? group->rank() : 0; }
  bool split() const { return size() > 1; }
  // This rank's experts of `experts`: [first, first + count).
  int64_t count(int64_t experts) const { return experts / size(); }
  int64_t first(int64_t experts) const { return rank() * count(experts); }
  bool holds(int64_t expert, int64_t experts) const {
    return expert >= first(experts) && expert < first(experts) + count(experts);
  }
};

// Throws BadInput naming the numbers when `ep` does not divide the experts or the data-parallel
// replicas `dp`, or is below 1, saying which sizes would.
void check_expert_parallel(int64_t experts, int ep, int dp);

// The most a rank's routed rows can exceed the balanced share (T x k, its own tokens' choices)
// under dropless routing at `ep`: ep x min(k, experts / ep) / k, every token of the group choosing
// this rank's experts as often as it can (models::apply_routing_imbalance).
double routing_imbalance_bound(int64_t experts, int64_t top_k, int ep);
// Throws BadInput naming the value when `imbalance` (the busiest rank's routed rows over the
// balanced share; 1: balanced, nothing to check) is given for what is not a mixture (`mixture`
// false) or at ep 1, or lies outside 1 to the bound.
void check_routing_imbalance(double imbalance, bool mixture, int64_t experts, int64_t top_k,
                             int ep);

// True for the name of a routed expert's parameter ("3.mlp.experts.5.up_proj.weight"; not a
// shared expert's): the tensors expert parallelism splits.
bool is_expert_parameter(const std::string& name);

}  // namespace pipetrain::parallel
