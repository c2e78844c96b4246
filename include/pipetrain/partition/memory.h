// Memory model: the peak bytes a rank holds during one training step of a pipeline plan.
//
// Per stage j (layers [a, b) of the model), for micro-batch size m:
//   parameters   P_j = sum of the layers' parameter bytes
//   gradients    P_j                      (one gradient buffer per parameter)
//   optimizer    P_j * optimizer_state_multiple   (SGD 0, momentum 1, Adam 2)
//   activations  in = bytes of the stage input, body = the layers' activation bytes (the
//                profile's, split_activation_bytes for a split backward), held per micro-batch:
//                  F i        + in, and + body unless i is checkpointed
//                  B i / I i  a checkpointed i is recomputed first: + body
//                  B i / W i  everything of i freed
//                predict_memory() walks each rank's list in that order (list order is time
//                order) and keeps the largest sum: the rank's stages together, a split
//                backward's recomputed micro-batches held from I to W included.
//   The closed form of one stage (stage_memory, stage_residency; the planner's quick bound when
//   it balances for memory), with n = peak micro-batches in flight on j:
//     never        n * (in + body)
//     always       n * in + body           inputs only, plus one micro-batch being recomputed
//     except_last  n * in + body (+ body when the last micro-batch, which is not checkpointed,
//                  is still stashed while another one is recomputed: 1F1B yes, GPipe no)
//
// Not modelled: transient gradient buffers inside a backward, allocator fragmentation, the
// framework's own buffers. docs/MEMORY.md gives the measured agreement.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pipetrain/partition/profile.h"
#include "pipetrain/schedule/checkpoint_mode.h"
#include "pipetrain/schedule/schedule.h"
#include "pipetrain/schedule/unit_residency.h"

namespace pipetrain::partition {

// What the schedule's order implies for one stage's activation memory.
struct StageResidency {
  int peak_inflight = 0;  // micro-batches stashed at once at the peak
  // The last micro-batch (never checkpointed under except_last) is alive while another
  // micro-batch of this stage runs its backward (and so its recompute).
  bool last_alive_during_recompute = false;
};

// One entry per stage, from the compute-only order of each rank (a rank runs its list in order,
// so the list order is the time order; no timing needed).
std::vector<StageResidency> stage_residency(const schedule::Schedule& schedule);

struct StageMemory {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;
  std::int64_t stashed_activations = 0;    // held across micro-batches
  std::int64_t recompute_activations = 0;  // one micro-batch rebuilt for its backward

  std::int64_t total() const {
    return parameters + gradients + optimizer_state + stashed_activations + recompute_activations;
  }
};

// The formula above for one stage. input_bytes and body_bytes are per micro-batch.
StageMemory stage_memory(std::int64_t parameter_bytes, std::int64_t input_bytes,
                         std::int64_t body_bytes, const StageResidency& residency,
                         Checkpoint checkpoint, double optimizer_state_multiple);

// Layers [first, end) as one stage at micro-batch size m: parameter, input and body bytes.
// The stage keeps its input as a leaf, so its first layer counts as in a chain that keeps its
// input (split_first_activation_bytes); split_body is the body of a split backward (its first
// layer's split_first_activation_bytes, the others' split_activation_bytes).
struct StageBytes {
  std::int64_t parameters = 0;
  std::int64_t input = 0;
  std::int64_t body = 0;
  std::int64_t split_body = 0;
};
StageBytes stage_bytes(const ModelProfile& profile, std::int64_t first, std::int64_t end,
                       std::int64_t microbatch_size);

// ---- The whole step, per rank and category (plan --memory, train --report-memory) -------------
//
// What one pipeline rank holds at its peak, in the categories `pipetrain train --report-memory`
// measures (train/memory_report.h says how each is measured):
//
//   parameters       sum of P_j over the rank's stages (ZeRO 3: the shard; the stages' whole
//                    parameters are the gathered category)
//   gradients        ZeRO 0: P (every .grad())   1: P + shard (the reduce-scatter's output is
//                    kept)   2: shard (between steps only the shard is held; the peak during
//                    backward is still P, see train/sharded_optimizer.h)   3: shard, as 2
//   optimizer state  P * s, or shard * s under ZeRO 1, 2 and 3
//                    shard = ceil(P / element / dp) * element: the rank's parameters laid end to
//                    end, padded to a multiple of dp, one contiguous piece per replica
//   activations      the stash formula above at the schedule's residency; the body is the
//                    split body when the schedule splits its backward (I and W), and the last
//                    stage's body includes what the loss keeps (loss_bytes: a checkpointed
//                    micro-batch drops its loss with the rest and recomputes it)
//   receive buffers  one process per rank only (the c10d transport; both transport categories
//                    are 0 in one process, where tensors are handed over without a copy): the
//                    receives posted ahead -- the interpreter keeps kReceiveLookahead = 2
//                    posted, so the largest two consecutive received messages. A message = a
//                    256-byte header + the data, 64-byte aligned.
//   send buffers     the copies of sent messages: the runtime frees one once the schedule
//                    proves its receiver has it (schedule/send_release.h; the transport keeps
//                    it until then even when its send completed earlier, so the bytes do not
//                    depend on timing), or the send window of 2 frees it (widened where 2
//                    would deadlock). The most bytes held at once, walking the rank's sends:
//                    before each, the ones released_sends() frees are freed. GPipe and 1F1B
//                    hold at most 2 messages.
//   offloaded        activation offload only (MemoryModelOptions::offload): the inputs of
//                    checkpointed micro-batches waiting in host memory, per stage the most at
//                    once, summed over the rank's stages (as StageAccounting counts them). The
//                    walk runs the lowered list the interpreter runs: + in after F i; - in when
//                    i comes back, at the first action after the backward (B or I) before i's
//                    own, where the interpreter prefetches it, or at i's backward when i was
//                    forwarded later than that. Host memory: not in total(). On a rank whose
//                    stages run on a GPU (offload_frees_stash), the activations walk drops the
//                    inputs for that time too; on the CPU they stay in the stage's memory.
//   gathered         ZeRO 3 only: the most bytes of whole stage parameters at once, walking the
//                    rank's residency plan (schedule/residency.h: + P_j when an action needs
//                    stage j and it is not whole, - P_j where the plan frees it). Keeping them
//                    until the last backward, about every local stage's P_j (they overlap in
//                    time); resharding after forward, the largest one.
//   reduce buffers   the data-parallel gradient sum's flat copies, from the step's last
//                    backward (or, with --overlap-grad-reduce, each stage's) to the optimizer:
//                    with replicas (dp > 1) or any ZeRO stage, the rank's gradients laid end to
//                    end once -- ZeRO 0's all-reduce buffer or its buckets (all in flight
//                    together), ZeRO's reduce-scatter input, padded to a multiple of dp
//                    elements. With --offload-optimizer and no replicas the flat is built in
//                    host memory (the offloaded category) instead. Only during the step's end,
//                    when little else is live; counted in total() all the same.
//   step gradients   ZeRO 2 and 3 only: the full .grad() of the rank's parameters, P, which a
//                    step accumulates over its micro-batches and the reduce-scatter drops (the
//                    gradients category counts what is held between steps, the shard). At ZeRO
//                    0 and 1 the full gradients stay, and the gradients category has them.
//   gather buffers   ZeRO 3 only: the all-gathers' receive buffers in flight, from a gather's
//                    start (before the first action, or the prefetch after an action) to the
//                    wait before the action that needs the stage, walking the residency plan as
//                    for gathered. A stage's buffer is each of its segments padded to a multiple
//                    of dp elements, in the dtype it is gathered in: float32, or, with
//                    MemoryModelOptions::cast_gathers, for the bytes the stage's layers'
//                    LayerProfile::cast_parameter_bytes count, the narrowed dtype plus the
//                    narrowed copy of the rank's piece (ZeroOptions::cast_gather). Usually one
//                    stage's at a time.
struct RankMemory {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;
  std::int64_t activations = 0;
  std::int64_t receive_buffers = 0;
  std::int64_t send_buffers = 0;
  std::int64_t offloaded = 0;       // host memory (activation offload)
  std::int64_t gathered = 0;        // ZeRO-3's whole stage parameters at their peak
  std::int64_t reduce_buffers = 0;  // the gradient sum's flat copies
  std::int64_t step_gradients = 0;  // ZeRO 2/3: the full gradients during a step
  std::int64_t gather_buffers = 0;  // ZeRO 3: the all-gathers' receive buffers in flight
  // --async-checkpoint: the host copy of what the rank writes of a checkpoint (its share of the
  // parameters and the optimizer state), held while a writer thread writes it. Host memory.
  std::int64_t checkpoint_snapshot = 0;

  static constexpr int kCategories = 12;
  // The categories in report order: 0 parameters .. 5 send buffers, 6 offloaded, 7 gathered,
  // 8 reduce buffers, 9 step gradients, 10 gather buffers, 11 checkpoint snapshot.
  std::int64_t& operator[](int category);
  std::int64_t operator[](int category) const;
  // What the rank's device holds: every category but the offloaded one and the checkpoint
  // snapshot (host memory). An upper
  // bound of the peak: the gathered and activation peaks need not fall at one moment.
  std::int64_t total() const {
    return parameters + gradients + optimizer_state + activations + receive_buffers + send_buffers +
           gathered + reduce_buffers + step_gradients + gather_buffers;
  }
};
// "parameters", "gradients", "optimizer state", "activations", "receive buffers",
// "send buffers", "offloaded to host", "gathered params", "reduce buffers", "step gradients",
// "gather buffers", "ckpt snapshot".
const char* memory_category_name(int category);

// A schedule's sends as the send-buffer walk needs them, independent of the model: per rank, each
// send to another rank in list order as {the stage whose output it carries, how many of the
// rank's earlier such sends are freed before it (schedule::released_sends)}. It depends on the
// schedule alone, so a caller that predicts many balances of one schedule (the planner) works it
// out once. Throws what released_sends throws.
struct SendWalk {
  std::vector<std::vector<std::pair<int, int>>> ranks;
};
SendWalk send_walk(const schedule::Schedule& schedule);

// ZeRO's policies the model follows (train/sharded_optimizer.h's ZeroOptions and the pipe's
// overlap and bucket size, torch-free; zero_memory_policy there makes one from them).
struct ZeroMemoryPolicy {
  bool stream = true;    // stages 2, 3: each micro-batch's gradients reduce-scattered at once
  bool by_layer = true;  // stage 3: each layer gathered around its uses (false: by stage)
  bool overlap = false;  // --overlap-grad-reduce: a step's reductions in flight together
  std::int64_t bucket_bytes = std::int64_t{25} << 20;
  schedule::UnitPolicy units{std::int64_t{25} << 20, 0, 0};  // stage 3 by layer's plan
  std::int64_t persistence_threshold = 0;  // stage 3: smaller parameters stay whole
};

// The optimizer state the memory model counts per parameter byte, by the trainer's optimizer
// names (train/optimizer.h): sgd 0 (1 with momentum > 0), adam and adamw 2 (the two moments).
double optimizer_state_multiple(const std::string& optimizer, double momentum);

struct MemoryModelOptions {
  Checkpoint checkpoint = Checkpoint::kNever;
  double optimizer_state_multiple = 0;  // SGD 0, momentum 1, Adam 2
  int zero = 0;                         // ZeRO stage 0, 1, 2 or 3
  bool reshard_after_forward = false;   // ZeRO 3 by stage, freed after each action
  ZeroMemoryPolicy zero_policy;
  // ZeRO-Offload (zero >= 1): the shard's values and gradient and the optimizer state in host
  // memory (the offloaded category) instead of the rank's.
  bool offload_optimizer = false;
  // With offload_optimizer, --offload-optimizer nvme: the optimizer state in files (in no memory
  // category), the offload buffers' pool (offload_buffer_bytes a rank) in host memory instead;
  // with parameters_in_files (ZeRO 3, --offload-params nvme) the shard's values too, so neither
  // the host nor the device keeps them.
  bool optimizer_state_in_files = false;
  bool parameters_in_files = false;
  // With parameters_in_files on CPU stages: the shard's gradient in the files too (added to as
  // each reduction lands, read by the step), so the host keeps only the pool.
  bool gradients_in_files = false;
  std::int64_t offload_buffer_bytes = 0;
  int data_parallel = 1;  // replicas of each pipeline rank (dp)
  // Expert parallelism: LayerProfile::expert_parameters are held by dp / expert_parallel
  // replicas, over which their gradients are summed and ZeRO shards them.
  int expert_parallel = 1;
  bool processes = false;                    // one process per rank: the transport's buffers count
  std::int64_t parameter_element_bytes = 4;  // float32 parameters (the shard's padding)
  // ZeRO 3 under bf16/fp16 (ZeroOptions::cast_gather; train::gathers_narrowed): each layer's
  // LayerProfile::cast_parameter_bytes are all-gathered in narrowed_element_bytes per element.
  bool cast_gathers = false;
  std::int64_t narrowed_element_bytes = 2;  // bf16 or fp16
  std::int64_t loss_bytes = 0;              // what the loss keeps for backward, per micro-batch
  // Activation offload (PipeOptions::offload_activations): checkpointed micro-batches' inputs
  // wait in host memory between their forward and their prefetch (the offloaded category).
  bool offload = false;
  // With offload, per pipeline rank: its stages run on a GPU, so those inputs leave the stage's
  // memory (the activations category drops them). False, or no entry (empty: no rank), for CPU
  // stages, whose memory is the host's.
  std::vector<bool> offload_frees_stash;
  // --async-checkpoint: each rank's checkpoint snapshot, its 1/data_parallel share of its stages'
  // parameters and of their optimizer state (optimizer_state_multiple of them), in host memory.
  bool async_checkpoint = false;
  // send_walk(schedule) when the caller keeps it (processes only); null: worked out here.
  const SendWalk* sends = nullptr;
};

// Per pipeline rank: the categories above for `balance` at micro-batch size m. A data-parallel
// replica of rank r holds what rank r holds. Throws pipetrain::BadInput for a balance that does
// not fit the schedule or the profile, a zero stage outside 0..3, or dp < 1.
std::vector<RankMemory> predict_memory(const ModelProfile& profile, const std::vector<int>& balance,
                                       std::int64_t microbatch_size,
                                       const schedule::Schedule& schedule,
                                       const MemoryModelOptions& options);

// The bytes of one transport message carrying `data_bytes` (header + 64-byte aligned data).
std::int64_t transport_message_bytes(std::int64_t data_bytes);

// The total of predict_memory() per rank (what the planner compares with its limit).
// REQUIRES: balance.size() == schedule.num_stages, every entry >= 1 (pipetrain::BadInput).
std::vector<std::int64_t> rank_peak_memory(const ModelProfile& profile,
                                           const std::vector<int>& balance,
                                           std::int64_t microbatch_size,
                                           const schedule::Schedule& schedule,
                                           const MemoryModelOptions& options);

// "1.5 GiB", "512 MiB", "12 KiB", "100 B".
std::string format_bytes(std::int64_t bytes);
// "2GiB", "2 GiB", "512MiB", "1.5G", "1000000" (bytes), "64KB" (KB = 1000). Throws
// pipetrain::BadInput naming the text on anything else.
std::int64_t parse_bytes(std::string_view text);

}  // namespace pipetrain::partition
