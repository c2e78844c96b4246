// The parent side of `pipetrain bench`: every configuration of plan_configs in a child process,
// round after round, and the report (rows with ratios, checks of the issues' targets).
//
//   parent: plan configurations --> for each: run self `<child_arguments> --one ...` or a Python
//                                          |  peer; child: build model + data, warm up, time
//                                          |  `steps` steps, print one JSON line (bench_rows.h)
//           <-- parse the child's last JSON line <--+
//   parent: ratios (vs plain LibTorch, vs the Python peers), medians over rounds, checks
//
// Rows (docs/BENCHMARKS.md):
//   libtorch               the Sequential on the whole batch; T intra-op threads
//   libtorch-microbatched  the same M micro-batches one after another, loss weighted by rows /
//                          batch rows, gradients accumulating; T threads
//   inprocess              Pipe (runtime/pipe.h), K worker threads with max(1, T/K) threads each
//   torchgpipe             torchgpipe 0.0.7's GPipe via bench/torchgpipe_peer.py, K partitions on
//                          the CPU; torch.set_num_threads(T)
//   multiprocess           DistributedPipe: K ranks of this executable started by the local
//                          launcher (Gloo over loopback), max(1, T/K) threads each; step time =
//                          the slowest rank's, per step
//   torch-pipelining       torch.distributed.pipelining (PipelineStage + its schedule of the same
//                          name) via bench/torch_pipelining.py: K ranks started by the pinned
//                          torch's torchrun, Gloo over loopback, max(1, T/K) threads each
#pragma once

#include <nlohmann/json.hpp>

#include "bench_options.h"

namespace pipetrain::bench {

// Runs every configuration `options.rounds` times and returns the report: the settings, "configs"
// (one row per configuration, medians over rounds, ratio_vs_libtorch / ratio_vs_torch /
// ratio_vs_torchgpipe), "checks" (each with measured, target, pass; pass null where not run) and
// "notes". A configuration that fails keeps an "error" in its row and the run goes on. Throws
// pipetrain::BadInput for bad options or a missing Python peer.
nlohmann::json run_bench(BenchOptions options);

// Whether a row ran and has a step time.
bool row_ok(const nlohmann::json& row);

// The checks of the suite's targets (docs/BENCHMARKS.md, "Checks") on `rows`, the report's
// "configs" (medians over rounds, with their ratios): each with measured, target and pass (null
// where its rows did not run).
nlohmann::json evaluate_checks(const BenchOptions& options, const nlohmann::json& rows);

}  // namespace pipetrain::bench
