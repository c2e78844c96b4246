// `pipetrain bench --suite moe` (issue 63): a Qwen3-MoE-shaped model trained by `pipetrain train`
// in child processes, on one world of 4 processes:
//
//   ep E    --nproc 4 --dp 4 --ep E, E = 1, 2, 4: tokens/s at each expert-parallel size, and the
//           time each rank spends inside the dispatch and combine all-to-alls
//   overlap each twice, without and with --ep-overlap (a forward of one micro-batch beside a
//           backward of another, schedule/overlap.h): dp4 ep4 under 1f1b at 4 micro-batches
//           (Megatron's combined 1F1B), and pp2 x dp2 ep2 under dualpipev at 8; the time inside
//           the all-to-alls, the part of it no compute covered (exposed), and the step, each
//           with the overlap over without it
//   pp4     --nproc 4 --stages 4 --schedule 1f1b (no ep): the pipeline row the peer matches
//   torch-pipelining   transformers' own Qwen3MoeForCausalLM under torch.distributed.pipelining
//           (bench/torch_pipelining.py --suite moe), 4 ranks, 1f1b, the same micro-batches
//
// Every row trains the same random model (moe_bench_config) with SGD at lr 0.01 on 128-id rows,
// nothing recomputed (--checkpoint never, as the peer);
// its step time is the median of `steps` steps after `warmup` (pipetrain: --summary-json's
// step_seconds, rank 0; the peer: the slowest rank's per step).
//
// Thread-safety: runs children one at a time from the calling thread.
#pragma once

#include <nlohmann/json.hpp>

#include "bench_options.h"

namespace pipetrain::bench {

// Qwen3MoeForCausalLM's config.json: hidden `width`, 4 decoder layers, 8 heads of width/8 (4
// key/value heads), 8 experts of width `width` per layer, 2 per token (renormalized), vocabulary
// 4096, untied. bench/torch_pipelining.py's moe_config is the same.
nlohmann::json moe_bench_config(int width);

// Runs the suite's rows; the report (rows, notes) as JSON.
nlohmann::json run_moe_suite(const BenchOptions& options);

// The report as a table.
void print_moe_report(const nlohmann::json& report);

}  // namespace pipetrain::bench
