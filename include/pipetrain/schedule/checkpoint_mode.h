// Checkpoint: which micro-batches keep only their stage inputs in the forward and recompute the
// rest before their backward. One enum for the runtime (PipeOptions::checkpoint) and the planner
// (partition/memory.h, Plan::checkpoint); torch-free.
//
//   kAlways      every micro-batch
//   kExceptLast  all but the last one (its backward follows its forward soonest, so recomputing
//                it would save little memory and cost a forward) -- torchgpipe's default
//   kNever       none: every activation is kept until its backward
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pipetrain {

enum class Checkpoint { kAlways, kExceptLast, kNever };

// "always", "except_last", "never".
std::string to_string(Checkpoint mode);
// Throws pipetrain::BadInput naming the text and the valid names.
Checkpoint parse_checkpoint(std::string_view text);
// never, except_last, always: the order the planner tries them in (least recompute first).
const std::vector<Checkpoint>& all_checkpoint_modes();
// True when micro-batch i of M is checkpointed under `mode`.
bool is_checkpointed(Checkpoint mode, int i, int microbatches);

}  // namespace pipetrain
