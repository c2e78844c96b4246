// The shape of a training run: how a request for a pipeline (what `pipetrain train`'s pipeline
// flags say, or what a C++ program fills in) becomes processes, pipeline ranks, replicas,
// micro-batches, devices and the PipeOptions every rank runs.
//
//   PipelineRequest --check_pipeline_request--> (BadInput naming the flag: --stages, --chunks, ...)
//         |
//         +--layout_of(world)--> RunLayout {world, pipeline ranks K, replicas R}
//         |                        one process: K = --stages (worker threads), R = 1
//         |                        processes:   K = --pp (default world / --dp), R = --dp
//         |                                     (x --cp: a replica per context-parallel rank)
//         +--pipe_options(layout, layers)--> PipeOptions: stages = K x V or --balance, chunks
//                                            (default 2K, 1 without a pipeline), the schedule (a
//                                            family or --schedule-file), devices (--device cuda:
//                                            rank r on cuda:(r mod GPUs); --devices: one each)
//
// Messages name the flags of `pipetrain train` that set each field, so the CLI prints them as
// they are and a C++ caller reads which field to change.
//
// Thread-safety: pure functions of plain values (pipe_options reads --schedule-file).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/runtime/pipe.h"
#include "pipetrain/stage/precision.h"

namespace pipetrain {

struct PipelineRequest {
  int64_t stages = 1;  // --stages: pipeline ranks K of a one-process run
  bool stages_given = false;
  std::vector<int64_t> balance;            // --balance: layers per stage (K x V entries); {}: even
  int64_t chunks = 0;                      // --chunks: 0 = 1 without a pipeline, else 2 x K
  int64_t virtual_stages = 1;              // --virtual: V
  std::string schedule = "1f1b";           // --schedule: a family of schedule::schedule_names()
  std::string schedule_file;               // --schedule-file: a custom schedule instead
  std::string checkpoint = "except_last";  // --checkpoint: always, except_last, never
  Precision precision = Precision::kFloat32;  // --precision: fp32, bf16, fp16 (CUDA stages)
  bool offload_activations = false;           // --offload-activations
  double timeout = 300;                       // --timeout: seconds a wait between ranks may take
  int threads = 0;                   // --threads per rank; 0: the cores shared among the ranks
  int pp = 0;                        // --pp: pipeline ranks of a multi-process run; 0: world/dp
  int dp = 1;                        // --dp: data-parallel replicas
  int tp = 1;                        // --tp: tensor-parallel ranks per pipeline rank
  int cp = 1;                        // --cp: context-parallel ranks per data-parallel replica
  bool cp_ulysses = false;           // --cp-method ulysses (else ring)
  std::string device = "cpu";        // --device: cpu or cuda
  std::vector<std::string> devices;  // --devices: one per rank of a one-process run
  bool overlap_grad_reduce = false;  // --overlap-grad-reduce (PipeOptions)
  bool ep_overlap = false;           // --ep-overlap (PipeOptions::overlap_expert_exchanges)
  double bucket_mb = 25;             // --bucket-size: MiB per gradient bucket of the overlap
};

// Where this process stands: world size, pipeline ranks, replicas (1 x 1 in one process).
struct RunLayout {
  bool multi_process = false;
  int world = 1;
  int pipeline_ranks = 1;    // K
  int replicas = 1;          // R
  int tensor_parallel = 1;   // T: processes per pipeline rank (parallel/mesh.h)
  int expert_parallel = 1;   // E: replicas a mixture's experts are split over (divides R)
  int context_parallel = 1;  // C: replicas that split each sequence (divides R = dp x C)
};

// Ranges and combinations of the fields on their own (counts, names, precision on the device,
// offload with checkpointing). Throws BadInput naming the flag.
void check_pipeline_request(const PipelineRequest& request);

// True when the request puts a rank on a CUDA device.
bool on_cuda(const PipelineRequest& request);

// The stages' device of the process with this LOCAL_RANK in a multi-process run: the
// `local_rank`-th of `devices` where they are given (one per process of the machine, so that
// several may share a GPU over gloo), else cuda:LOCAL_RANK under --device cuda, else the CPU.
// Throws BadInput naming --devices when it lists no device for this local rank or names none.
torch::Device process_device(const PipelineRequest& request, int local_rank);

// The layout of a run of `world` processes. Throws BadInput when pp x tp x dp x cp is not the
// world, --pp, --tp, --dp or --cp are given to one process, or --stages disagrees with the
// processes.
RunLayout layout_of(const PipelineRequest& request, int world);

// Micro-batches per mini-batch.
int64_t chunks_of(const PipelineRequest& request, const RunLayout& layout);
// One stage, one micro-batch, one process: plain sequential training.
bool is_sequential(const PipelineRequest& request, const RunLayout& layout);
// Intra-op threads of each pipeline rank of this process.
int threads_per_rank(const PipelineRequest& request, const RunLayout& layout);

// The Pipe (or DistributedPipe) options for a Sequential of `layers` layers. Throws BadInput
// naming the flag for a balance that does not fit, more stages than layers, a schedule file
// that disagrees with the other flags or the processes, a schedule family that cannot take the
// shape, or devices that cannot be used.
PipeOptions pipe_options(const PipelineRequest& request, const RunLayout& layout, int64_t layers);
// --bucket-size's MiB as PipeOptions::bucket_bytes: at least one byte, at most 2^62.
int64_t bucket_bytes_of(double mib);

// One line saying what runs the steps: "4 stages on 2 ranks (2 processes: 2 pipeline x 1
// data-parallel) (balance 3 2 2 2), 4 micro-batches, schedule 1f1b, checkpoint never, bf16".
// `balance`: the stages' layer counts (empty: not shown).
std::string describe_pipeline(const PipeOptions& options, const std::vector<int64_t>& balance,
                              const RunLayout& layout);

}  // namespace pipetrain
