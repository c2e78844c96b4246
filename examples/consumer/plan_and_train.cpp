// Concept: planning (partition/profiler.h, partition/planner.h). The profiler measures each
// layer's forward and backward times and activation bytes at a few micro-batch sizes; the planner
// searches schedules x micro-batch counts x checkpoint modes x virtual stages, balances the layers
// over the stages for each, simulates the step, and ranks the plans. The recommended plan (its
// schedule, balance, micro-batches, virtual stages and checkpoint mode) is then run on a Pipe.
// (partition/recommend.h's recommend_plan does both steps in one call.)
//
// Which plan wins depends on this machine's timings; every plan must train the same weights.
// Check: the weights after 3 steps equal plain sequential training of a copy (same_weights.h).
#include <cstdio>
#include <string>

#include <pipetrain/partition/planner.h>
#include <pipetrain/partition/profiler.h>
#include <pipetrain/runtime/pipe.h>
#include <pipetrain/tune/plan_options.h>
#include <torch/torch.h>

#include "same_weights.h"

namespace partition = pipetrain::partition;

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential model(
      torch::nn::Linear(32, 128), torch::nn::ReLU(), torch::nn::Linear(128, 128), torch::nn::ReLU(),
      torch::nn::Linear(128, 128), torch::nn::ReLU(), torch::nn::Linear(128, 8));
  auto reference = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());

  // [1] Profile with a batch shaped like the training mini-batches (few, short trials: a demo).
  const partition::ModelProfile profile = partition::profile_sequential(
      model, torch::randn({64, 32}), partition::ProfileOptions().max_sizes(3).repeats(3));
  // [2] Plan for 2 ranks, no memory limit, every schedule family. A model this small trains
  // fastest unpipelined (one micro-batch); 4 or 8 micro-batches make the plan a pipeline.
  partition::PlannerOptions planner;
  planner.ranks = 2;
  planner.microbatch_counts = {4, 8};
  planner.top = 5;
  const partition::PlanReport report = partition::plan_pipeline(profile, planner);
  if (!report.found()) {
    std::printf("the planner found no plan\n");
    return 1;
  }
  for (const partition::Plan& plan : report.ranked) {
    std::printf("  %-40s predicted %.3f ms, bubble %.0f%%\n", plan.describe().c_str(),
                plan.predicted_step_seconds * 1e3, plan.bubble_fraction * 100);
  }
  const partition::Plan& plan = report.recommended();
  std::printf("recommended: %s\n", plan.describe().c_str());

  // [3] The plan as PipeOptions: its balance, chunks, schedule, virtual stages, checkpoint mode.
  pipetrain::Pipe pipe(model, pipetrain::tune::pipe_options_for(plan));

  // Trained beside a sequential copy on the same batches, it ends with the same weights.
  return consumer::trains_as_sequential(pipe, reference, /*lr=*/0.05, /*rows=*/64, 32, 8) ? 0 : 1;
}
