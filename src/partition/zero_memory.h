// ZeRO's part of the memory model (memory.h, predict_memory): what a rank's sharded optimizer
// holds, from the layout make_pipe_sharded_optimizer builds (train/sharded_optimizer.h). Internal
// to the partition library; torch-free.
#pragma once

#include <vector>

#include "pipetrain/partition/memory.h"

namespace pipetrain::partition::detail {

// Whether the run's stages report each layer's uses and gradients (StageParameterHooks): their
// training forwards are then recorded for a split backward (the split body).
bool zero_uses_hooks(const MemoryModelOptions& options);

// Rank r's ZeRO categories for options.zero >= 1: parameters, gradients, optimizer state,
// gathered params, reduce buffers, step gradients, gather buffers and the offload's host share,
// from the parameters rank.parameters already holds (the sum of its layers').
void add_zero_memory(const ModelProfile& profile, const std::vector<int>& balance,
                     const schedule::Schedule& schedule, int r, const MemoryModelOptions& options,
                     RankMemory& rank);

}  // namespace pipetrain::partition::detail
