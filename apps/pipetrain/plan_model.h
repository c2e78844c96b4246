// `pipetrain plan --model ...`: profile a model, search the plan space, print the ranked plans and
// the recommendation; with --verify, run the recommended and the default plan (in-process, or as
// K processes with --processes) and print predicted vs measured step times.
//
// plan.cpp owns the `plan` subcommand; it registers these extra flags with
// add_plan_model_options() and calls run_plan_for_model() when --model is given, passing its own
// --stages, --format and --output through.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace pipetrain::cli {

struct PlanModelArgs {
  std::string model;              // MODEL.pt (TorchScript) | mlp | cnn | a Hugging Face DIR
  std::string sample_shape;       // "256,784": the mini-batch (first dimension = batch size)
  int stages = 0;                 // K pipeline ranks (0: 2)
  std::string memory_limit;       // per rank, e.g. "2GiB"; empty: no limit
  std::string format = "text";    // text | json
  std::string output;             // file (written atomically); empty: stdout
  std::string optimizer = "sgd";  // sgd | momentum | adam | adamw: state 0x, 1x, 2x, 2x parameters
  std::string schedules;          // comma-separated subset of the schedules; empty: all
  int top = 10;                   // rows of the ranked table
  bool calibrate = false;         // measure the runtime's per-layer overhead first
  bool verify = false;            // run recommended and default plans, compare with predictions
  int verify_steps = 5;           // timed steps per plan (after 2 warm-up steps)
  int verify_rounds = 3;          // both plans measured once per round, alternately
  bool processes = false;         // plan for K processes over Gloo (measured transfer); --verify
                                  // then runs each plan as K processes
  std::string rank_job;           // hidden: this process is one rank of such a run (JSON)
  std::string profile_out;        // write the measured profile as JSON
  bool memory = false;            // print the recommended plan's memory per rank and category
  int zero = 0;                   // ZeRO stage of the memory model (needs dp > 1)
  bool reshard_after_forward = false;  // ZeRO 3's policy, for the memory model
  std::string zero_gradients = "stream", zero3_unit = "layer";  // train's flags, as typed
  bool offload_optimizer = false;  // ZeRO-Offload, for the memory model
  int dp = 1;                      // data-parallel replicas of each rank (memory model)
  std::string precision = "fp32";  // fp32 | bf16: what the profile runs in (memory model)
  int world = 0;  // > 0: search pp x tp x dp layouts of this many processes (tune/world_plan.h)
  int profile_repeats = 7, profile_warmup = 2;  // the profile's timed trials and untimed runs
};

void add_plan_model_options(CLI::App& command, PlanModelArgs& args);

// Returns the exit code: 0 a plan was found (and printed), 1 no plan fits the limit (the
// smallest limit that works is printed). Throws UsageError for bad flags (exit 2).
int run_plan_for_model(const PlanModelArgs& args);

}  // namespace pipetrain::cli
