// The child side of `pipetrain bench`: one configuration timed in a fresh process, its result one
// JSON object (the report's row before ratios). A fresh process per configuration makes
// getrusage's process-wide, monotonic ru_maxrss that configuration's peak, and keeps runs from
// disturbing one another through allocator caches or thread pools.
//
// One step, for every runtime: zero_grad, forward + loss + backward of the whole mini-batch, SGD
// step. Efficiency of a pipelined row = the median over the timed steps of replay(step) / step
// time (schedule/replay.h): the step as its schedule would run with each compute action taking
// what it measured in that step and no waits beyond its dependencies.
#pragma once

#include <nlohmann/json.hpp>

#include "bench_options.h"

namespace pipetrain::bench {

// The marker of a child's result line on its stdout.
inline constexpr const char* kResultPrefix = "PIPETRAIN_BENCH_RESULT ";

// Times `config` in this process (libtorch, libtorch-microbatched, inprocess) or, for a
// multiprocess row, launches its K ranks of this executable (`child_arguments --rank-worker`,
// which the program dispatches to run_rank) and merges their result lines into one row. Throws
// pipetrain::BadInput for an unknown runtime.
nlohmann::json run_config_here(const BenchOptions& options, const Config& config);

// One rank of a multiprocess configuration, in the torchrun environment: prints one result line
// (kResultPrefix + JSON) with its step times and their parts, every compute action's duration per
// timed step, the shortest receive, its stages' stash accounting and its peak RSS. Returns the
// process exit code.
int run_rank(const BenchOptions& options, const Config& config);

}  // namespace pipetrain::bench
