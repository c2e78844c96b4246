// Balance: cutting a sequence of L layers into K contiguous stages so that the most expensive
// stage is as cheap as possible (torchgpipe's "balance": the number of layers per stage).
//
// The cost of a stage is the sum of its layers' costs, plus a fixed extra on the first stage
// (e.g. the embedding or the input pipeline) and on the last (e.g. the loss). Costs may be
// times, memory, parameter counts, or all ones (uniform): the problem is the same, so one solver
// serves all; balance_by() picks the vector. The solver is exact (min over all contiguous
// partitions of the max stage cost), O(L*K) time and memory.
//
// Virtual stages: with V chunks per rank (interleaved schedules) the layers are cut into K*V
// contiguous chunks, chunk j running on rank j % K; the solver minimizes the most expensive
// chunk (each chunk is scheduled on its own), and reports per-rank totals too.
//
// Thread-safety: pure functions.
// REQUIRES: stages >= 1, virtual_stages >= 1, every cost and extra finite and >= 0, and at
// least stages * virtual_stages layers (each stage gets at least one layer). Violations throw
// pipetrain::BadInput naming the values.
#pragma once

#include <string>
#include <vector>

namespace pipetrain::partition {

struct BalanceOptions {
  double first_stage_extra = 0;  // added to stage 0's cost
  double last_stage_extra = 0;   // added to the last stage's cost (both when there is one stage)
  int virtual_stages = 1;        // V: cut into stages * V chunks
};

struct Balance {
  std::vector<int> sizes;           // layers per stage (or chunk), in order; sums to L
  std::vector<double> stage_costs;  // cost of each stage (chunk), extras included
  std::vector<double> rank_costs;   // per rank: sum of its chunks (= stage_costs when V = 1)
  double bottleneck = 0;            // max of stage_costs: the optimum

  // First layer index of each stage, size sizes.size() + 1 (last entry = L).
  std::vector<int> boundaries() const;
};

// Exact min-max contiguous partition of `layer_costs` into stages * options.virtual_stages parts.
Balance solve_balance(const std::vector<double>& layer_costs, int stages,
                      const BalanceOptions& options = {});

enum class BalanceBy { kTime, kMemory, kParameters, kUniform };

// Per-layer figures from a profiler (partition/profile.h) or written by hand; only the vector
// that balance_by() uses must be filled (kUniform uses none, but needs `layers`).
struct LayerCosts {
  int layers = 0;
  std::vector<double> time;
  std::vector<double> memory;
  std::vector<double> parameters;
};

// "time" | "memory" | "parameters" | "uniform"; throws pipetrain::BadInput listing them.
BalanceBy parse_balance_by(const std::string& name);

// solve_balance() on the chosen vector (all ones for kUniform). Throws pipetrain::BadInput
// when that vector is empty or its size differs from costs.layers.
Balance balance_by(const LayerCosts& costs, BalanceBy by, int stages,
                   const BalanceOptions& options = {});

}  // namespace pipetrain::partition
