// recommend_plan(): profile a Sequential, search the plan space, return the fastest plan that fits
// a per-rank memory limit. The library entry behind `pipetrain train --balance auto --schedule
// auto` and `pipetrain plan --model`.
//
//   profile_sequential (profiler.h) -> plan_pipeline (planner.h) -> report.recommended()
//
// The profile is taken with the intra-op thread count each stage's worker will have (the
// current thread count divided by the ranks, at least 1) unless profile options say otherwise.
//
// Thread-safety: runs the model (see profiler.h); do not train it meanwhile.
// REQUIRES: ranks >= 1 and <= the number of layers; the sample batch shaped like a training
// mini-batch (else pipetrain::BadInput). Throws pipetrain::BadInput when no plan fits
// memory_limit_bytes, naming the smallest limit that would work and the plan that needs it.
#pragma once

#include <cstdint>

#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include "pipetrain/partition/planner.h"
#include "pipetrain/partition/profiler.h"

namespace pipetrain::partition {

// Intra-op threads per stage worker when K ranks share this process's threads.
int threads_per_rank(int ranks);

// The full report (ranked table, search counts) for callers that print it.
PlanReport recommend_report(torch::nn::Sequential& model, const torch::Tensor& sample_batch,
                            const PlannerOptions& planner, ProfileOptions profile = {},
                            ModelProfile* profile_out = nullptr);

/// Example:
///   Plan plan = recommend_plan(model, torch::randn({256, 784}), /*ranks=*/2, 2LL << 30);
///   Pipe pipe(model, PipeOptions().balance({plan.balance.begin(), plan.balance.end()})
///                        .chunks(plan.microbatches).schedule(plan.schedule)
///                        .virtual_stages(plan.virtual_stages)
///                        .checkpoint(pipetrain::parse_checkpoint(std::string(
///                            checkpoint_name(plan.checkpoint)))));  // the runtime's enum
/// (examples/consumer/plan_and_train.cpp does this with profile_sequential and plan_pipeline.)
Plan recommend_plan(torch::nn::Sequential& model, const torch::Tensor& sample_batch, int ranks,
                    std::int64_t memory_limit_bytes = 0);

}  // namespace pipetrain::partition
