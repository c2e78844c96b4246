// recommend_plan() (recommend.h): profiler + planner in one call.
#include "pipetrain/partition/recommend.h"

#include <algorithm>

#include <torch/torch.h>

#include "pipetrain/base/check.h"

namespace pipetrain::partition {

int threads_per_rank(int ranks) {
  return std::max(1, at::get_num_threads() / std::max(ranks, 1));
}

PlanReport recommend_report(torch::nn::Sequential& model, const torch::Tensor& sample_batch,
                            const PlannerOptions& planner, ProfileOptions profile,
                            ModelProfile* profile_out) {
  PIPETRAIN_CHECK_INPUT(planner.ranks >= 1 && planner.ranks <= static_cast<int>(model->size()),
                        "recommend_plan: ", planner.ranks, " ranks for a model of ", model->size(),
                        " layers; use between 1 and ", model->size(), " ranks");
  if (profile.intra_op_threads() == 0) profile.intra_op_threads(threads_per_rank(planner.ranks));
  ModelProfile measured = profile_sequential(model, sample_batch, profile);
  PlanReport report = plan_pipeline(measured, planner);
  if (profile_out) *profile_out = std::move(measured);
  return report;
}

Plan recommend_plan(torch::nn::Sequential& model, const torch::Tensor& sample_batch, int ranks,
                    std::int64_t memory_limit_bytes) {
  PlannerOptions planner;
  planner.ranks = ranks;
  planner.memory_limit_bytes = memory_limit_bytes;
  planner.top = 1;
  const PlanReport report = recommend_report(model, sample_batch, planner);
  PIPETRAIN_CHECK_INPUT(
      report.found(), "recommend_plan: no plan for ", ranks, " ranks fits ",
      format_bytes(memory_limit_bytes), " per rank; the smallest limit that works is ",
      format_bytes(report.smallest_fitting_limit), " (", report.smallest_fitting_plan.describe(),
      "): raise the limit or use more ranks");
  return report.recommended();
}

}  // namespace pipetrain::partition
