// Schedule: for each rank, the ordered list of actions it runs in one training step.
//
// A generator (generators.h; one family per file in src/schedule/) produces a compute-only
// schedule (F/B/I/W). lower() (lower.h) inserts the communication actions. The runtime's single
// interpreter runs a lowered schedule for one rank, or for all ranks in one process.
//
// Placement: stage j runs on rank stage_rank[j]. Without interleaving stage j is on rank j; with
// V virtual stages per rank (Megatron's order) stage j is on rank j % K.
//
// Thread-safety: a plain value; safe to copy and to read from many threads.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "pipetrain/schedule/action.h"

namespace pipetrain::schedule {

// Limits of a schedule read from a file (text_format.h, csv_format.h): stage and micro-batch
// indices, and the S x M cells that validate() and simulate() allocate (about 30 bytes each).
// A file past them is BadInput; the generators stay far below them.
constexpr int kMaxScheduleStages = 1 << 16;
constexpr int kMaxScheduleMicrobatches = 1 << 20;
constexpr long long kMaxScheduleCells = 1LL << 24;

struct Schedule {
  std::string name;             // "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "custom", ...
  int num_ranks = 0;            // K
  int num_stages = 0;           // S = K * V
  int num_microbatches = 0;     // M
  std::vector<int> stage_rank;  // size S: rank that runs stage j
  std::vector<std::vector<Action>> actions;  // size K: rank r's actions in order

  int virtual_stages() const { return num_ranks > 0 ? num_stages / num_ranks : 0; }
  // Stages held by rank r, ascending.
  std::vector<int> stages_of_rank(int r) const;
  // True when any action is I or W (the backward is split).
  bool splits_backward() const;
  // Per stage of rank r: the index in actions[r] of its last B or W, after which the stage's
  // weight gradients are final for the step.
  std::map<int, std::size_t> last_gradient_actions(int r) const;
  // Per stage of rank r: the index in actions[r] after which its data-parallel gradient sum
  // starts: its last B or W, or the last of the sends that directly follow it. Those sends carry
  // what a neighbour waits for (1F1B's last stage sends its last input gradient right after its
  // last B); handed over first, they do not wait for the sum's packing, and the sum loses nothing,
  // since a send only hands a tensor over.
  std::map<int, std::size_t> gradient_sum_starts(int r) const;
};

}  // namespace pipetrain::schedule
