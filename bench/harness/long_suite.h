// `pipetrain bench --suite long` (issue 64): long sequences split by context parallelism. A
// Llama of 2 layers (the llama suite's width, 8 heads over 4 key/value heads) trained by
// `pipetrain train` in child processes on one world of 4 processes, at each of --seq-lens:
//
//   cp 1      --dp 4: each rank a whole row of T tokens (batch 4)
//   ring cp C --dp 4/C --cp C, C = 2, 4: each rank T / C tokens of its replica's row (batch 4/C),
//             the ring's passes beside each block's compute; at cp 4 also with
//             --cp-serial-passes (each pass waited for at once): the ring's waiting time with and
//             without the overlap
//   ulysses   --dp 4/C --cp C --cp-method ulysses, C = 2, 4
//
// Every rank holds one row's worth of tokens at cp 1 and 1/C of it at cp C, so the rows compare
// what a rank keeps per token it computes: step time, tokens/s (the mini-batch's over the step),
// the largest process's peak resident memory, and the ring's waiting time (the run's "ring
// attention:" line, means over ranks and steps, warm-up included). SGD at lr 0.01, nothing
// recomputed, one micro-batch per replica; step: rank 0's median after warm-up.
//
// The peer: torch's own context parallelism (torch.distributed.tensor.experimental's
// context_parallel, ring attention) on Gloo, bench/torch_context_parallel.py, where it runs on
// the CPU; where it does not, the report says why (a note, not a row).
//
// Thread-safety: runs children one at a time from the calling thread.
#pragma once

#include <nlohmann/json.hpp>

#include "bench_options.h"

namespace pipetrain::bench {

// Runs the suite's rows; the report (rows, notes) as JSON.
nlohmann::json run_long_suite(const BenchOptions& options);

// The report as a table.
void print_long_report(const nlohmann::json& report);

}  // namespace pipetrain::bench
