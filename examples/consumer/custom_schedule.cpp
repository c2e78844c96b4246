// Concept: a schedule is data (schedule/text_format.h, schedule/validate.h). A 1F1B schedule for
// 2 ranks and 4 micro-batches is written by hand in the text form (one line per rank, "jOi" =
// stage j runs op O of micro-batch i), parsed, validated (order, completeness and a dry run that
// finds deadlocks), and run by a Pipe through PipeOptions::custom_schedule. The same text can live
// in a file: schedule::load_schedule(path), or `pipetrain train --schedule-file`.
//
// Check: the weights after 3 steps equal plain sequential training of a copy (same_weights.h);
// also, a schedule with a backward before its forward must be rejected by check().
#include <cstdio>

#include <pipetrain/runtime/pipe.h>
#include <pipetrain/schedule/grid.h>
#include <pipetrain/schedule/text_format.h>
#include <pipetrain/schedule/validate.h>
#include <torch/torch.h>

#include "same_weights.h"

namespace schedule = pipetrain::schedule;

// Rank 0 runs one forward ahead (warm-up), then alternates backward and forward; rank 1, the last
// stage, runs each micro-batch's backward right after its forward. Sends and receives are added
// by the runtime (schedule/lower.h).
constexpr const char* kOneFOneB = R"(# 1f1b by hand: 2 ranks, 4 micro-batches
0F0, 0F1, 0B0, 0F2, 0B1, 0F3, 0B2, 0B3
1F0, 1B0, 1F1, 1B1, 1F2, 1B2, 1F3, 1B3
)";

int main() {
  const schedule::Schedule by_hand = schedule::parse_schedule(kOneFOneB, "1f1b-by-hand");
  schedule::validate(by_hand);  // throws ScheduleError with the rank x step grid, bad cells marked
  std::printf("%s", schedule::render_grid(by_hand).c_str());

  // validate() must catch a broken schedule: rank 1 runs the backward of micro-batch 0 first.
  const schedule::CheckResult broken =
      schedule::check(schedule::parse_schedule("0F0, 0B0\n1B0, 1F0\n"));
  if (broken) {
    std::printf("validate accepted a backward before its forward\n");
    return 1;
  }
  std::printf("a broken schedule is rejected: %s\n", broken.explanation.c_str());

  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                              torch::nn::Linear(16, 4));
  auto reference = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());
  pipetrain::Pipe pipe(
      model,
      pipetrain::PipeOptions().stages(2).chunks(4).schedule("custom").custom_schedule(by_hand));
  // Trained beside a sequential copy on the same batches, it ends with the same weights.
  return consumer::trains_as_sequential(pipe, reference, /*lr=*/0.1, /*rows=*/16, 8, 4) ? 0 : 1;
}
