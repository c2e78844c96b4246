// The shape of a training run (train/run_layout.h).
#include "pipetrain/runtime/run_layout.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <thread>

#include <c10/util/StringUtil.h>

#include "pipetrain/base/error.h"
#include "pipetrain/base/message_of.h"
#include "pipetrain/parallel/mesh.h"
#include "pipetrain/runtime/distributed.h"
#include "pipetrain/schedule/checkpoint_mode.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/text_format.h"
#include "pipetrain/stage/device.h"
#include "pipetrain/stage/precision.h"

namespace pipetrain {
namespace {

[[noreturn]] void fail(const std::string& message) {
  throw BadInput(message);
}

// A custom schedule from --schedule-file, checked against the other flags and the processes.
schedule::Schedule load_custom(const PipelineRequest& r, const RunLayout& layout) {
  schedule::Schedule custom;
  try {
    custom = schedule::load_schedule(r.schedule_file);
  } catch (const std::exception& error) {
    fail("--schedule-file: " + message_of(error));
  }
  if (r.stages_given && r.stages != custom.num_ranks) {
    fail("--stages " + std::to_string(r.stages) + " but --schedule-file " + r.schedule_file +
         " has " + std::to_string(custom.num_ranks) + " ranks; drop --stages or make them agree");
  }
  if (r.chunks > 0 && r.chunks != custom.num_microbatches) {
    fail("--chunks " + std::to_string(r.chunks) + " but --schedule-file " + r.schedule_file +
         " has " + std::to_string(custom.num_microbatches) +
         " micro-batches; drop --chunks or make them agree");
  }
  if (layout.multi_process && custom.num_ranks != layout.pipeline_ranks) {
    fail("--schedule-file " + r.schedule_file + " has " + std::to_string(custom.num_ranks) +
         " ranks but the run has " + std::to_string(layout.pipeline_ranks) +
         " pipeline processes; start --nproc " +
         std::to_string(custom.num_ranks * layout.replicas) + " (x --dp) or use a schedule for " +
         std::to_string(layout.pipeline_ranks) + " ranks");
  }
  return custom;
}

// options.balance and options.stages from --balance, or K x V even stages.
void set_stages(const PipelineRequest& r, const RunLayout& layout, int64_t layers, int64_t ranks,
                PipeOptions& options) {
  const int64_t stages = ranks * options.virtual_stages();
  if (r.balance.empty()) {
    if (stages > layers) {
      fail(std::to_string(ranks) + " ranks x " + std::to_string(options.virtual_stages()) +
           " virtual stages = " + std::to_string(stages) + " stages but the model has only " +
           std::to_string(layers) + " layers; use fewer --stages or --virtual");
    }
    options.stages(stages);
    return;
  }
  int64_t sum = 0;
  for (int64_t b : r.balance) sum += b;
  if (sum != layers) {
    fail("--balance sums to " + std::to_string(sum) + " layers but the model has " +
         std::to_string(layers) + "; the entries must sum to the layer count");
  }
  const auto count = static_cast<int64_t>(r.balance.size());
  if (count % options.virtual_stages() != 0) {
    fail("--balance has " + std::to_string(count) + " stages, not a multiple of --virtual " +
         std::to_string(options.virtual_stages()));
  }
  if (layout.multi_process && count != stages) {
    fail("--balance has " + std::to_string(count) + " stages but the run has " +
         std::to_string(stages) + " (pipeline processes x --virtual)");
  }
  options.balance(r.balance);
  options.stages(count);
}

}  // namespace

void check_pipeline_request(const PipelineRequest& r) {
  if (r.chunks < 0) fail("--chunks must be at least 1, got " + std::to_string(r.chunks));
  if (r.virtual_stages < 1) {
    fail("--virtual must be at least 1, got " + std::to_string(r.virtual_stages));
  }
  if (r.stages < 1) fail("--stages must be at least 1, got " + std::to_string(r.stages));
  for (int64_t layers : r.balance) {
    if (layers < 1) {
      fail("--balance entries must be at least 1 layer each, got " + std::to_string(layers));
    }
  }
  if (r.dp < 1) fail("--dp must be at least 1, got " + std::to_string(r.dp));
  if (r.tp < 1) fail("--tp must be at least 1, got " + std::to_string(r.tp));
  if (r.cp < 1) fail("--cp must be at least 1, got " + std::to_string(r.cp));
  if (!(r.bucket_mb > 0) || !std::isfinite(r.bucket_mb)) {
    fail("--bucket-size must be a positive number of MiB, got " + c10::str(r.bucket_mb));
  }
  if (r.pp < 0) fail("--pp must be at least 1, got " + std::to_string(r.pp));
  if (r.threads < 0) fail("--threads must be >= 0, got " + std::to_string(r.threads));
  if (!(r.timeout >= kMinTimeoutSeconds && r.timeout <= kMaxTimeoutSeconds)) {
    fail("--timeout must be from " + c10::str(kMinTimeoutSeconds) + " to " +
         c10::str(kMaxTimeoutSeconds) + " seconds, got " + c10::str(r.timeout));
  }
  if (r.device != "cpu" && r.device != "cuda") {
    fail("unknown --device '" + r.device + "'; valid: cpu, cuda");
  }
  if (r.precision == Precision::kFloat16 && !on_cuda(r)) {
    fail(
        "--precision fp16 needs CUDA stages (float16 trains with dynamic loss scaling on the "
        "GPU): give --device cuda, or use --precision bf16");
  }
  if (r.offload_activations && r.checkpoint == "never") {
    fail(
        "--offload-activations moves the inputs that checkpointed micro-batches keep until "
        "their backward, and --checkpoint never checkpoints none; use --checkpoint except_last "
        "or always");
  }
  if (r.offload_activations && r.checkpoint == "except_last" && r.chunks == 1) {
    fail(
        "--offload-activations moves the inputs that checkpointed micro-batches keep until "
        "their backward, and --checkpoint except_last with --chunks 1 checkpoints none; use "
        "--chunks 2 or more, or --checkpoint always");
  }
}

torch::Device process_device(const PipelineRequest& r, int local_rank) {
  if (r.devices.empty()) {
    return on_cuda(r) ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank))
                      : torch::Device(torch::kCPU);
  }
  if (local_rank < 0 || local_rank >= static_cast<int>(r.devices.size())) {
    throw BadInput("--devices lists " + std::to_string(r.devices.size()) +
                   " devices, one per process of this machine, and has none for local rank " +
                   std::to_string(local_rank));
  }
  const std::string& name = r.devices[static_cast<size_t>(local_rank)];
  try {
    return torch::Device(name);
  } catch (const std::exception&) {
    throw BadInput("--devices: '" + name + "' is not a device name (cpu, cuda:0, cuda:1, ...)");
  }
}

bool on_cuda(const PipelineRequest& r) {
  return r.device == "cuda" || std::any_of(r.devices.begin(), r.devices.end(),
                                           [](const auto& d) { return d.rfind("cuda", 0) == 0; });
}

RunLayout layout_of(const PipelineRequest& r, int world) {
  RunLayout layout;
  layout.multi_process = world > 1;
  layout.world = world;
  const int cp = std::max(1, r.cp);
  if (!layout.multi_process) {
    if (r.pp > 1 || r.dp > 1 || r.tp > 1 || cp > 1) {
      fail(std::string(cp > 1 ? "--pp/--tp/--dp/--cp" : "--pp/--tp/--dp") +
           " describe a multi-process run: give --nproc " +
           std::to_string(std::max(r.pp, 1) * r.dp * std::max(r.tp, 1) * cp));
    }
    return layout;
  }
  if (world % cp != 0) {
    fail("--cp " + std::to_string(cp) + " does not divide the world of " + std::to_string(world) +
         " processes; make pp x tp x dp x cp equal the process count");
  }
  // Context parallelism: cp replicas per data-parallel replica (runtime/distributed.h).
  layout.context_parallel = cp;
  if (r.tp > 1) {
    const parallel::Mesh mesh = [&] {
      try {
        return parallel::Mesh::for_world(world / cp, r.pp, r.tp, r.dp);
      } catch (const BadInput& error) {
        if (cp == 1) throw;
        fail(std::string(error.what()) + " (the world over --cp " + std::to_string(cp) + ")");
      }
    }();
    layout.pipeline_ranks = mesh.pp;
    layout.tensor_parallel = mesh.tp;
    layout.replicas = mesh.dp * cp;
  } else {
    layout.replicas = r.dp * cp;
    layout.pipeline_ranks = r.pp > 0 ? r.pp : world / layout.replicas;
    if (layout.pipeline_ranks * layout.replicas != world) {
      const std::string context = cp > 1 ? " x --cp " + std::to_string(cp) : "";
      fail("--nproc " + std::to_string(world) + " processes do not make --pp " +
           std::to_string(layout.pipeline_ranks) + " x --dp " + std::to_string(r.dp) + context +
           "; make pp x dp" + (cp > 1 ? " x cp" : "") + " equal the process count");
    }
  }
  if (r.stages_given && r.schedule_file.empty() &&
      r.stages != layout.pipeline_ranks * r.virtual_stages) {
    fail("--stages " + std::to_string(r.stages) + " but the run has " +
         std::to_string(layout.pipeline_ranks) + " pipeline processes x --virtual " +
         std::to_string(r.virtual_stages) + "; drop --stages or make them agree");
  }
  return layout;
}

int64_t chunks_of(const PipelineRequest& r, const RunLayout& layout) {
  if (r.chunks > 0) return r.chunks;
  const int64_t ranks = layout.multi_process ? layout.pipeline_ranks
                        : !r.balance.empty()
                            ? static_cast<int64_t>(r.balance.size()) / r.virtual_stages
                            : r.stages;
  return ranks > 1 ? 2 * ranks : 1;
}

bool is_sequential(const PipelineRequest& r, const RunLayout& layout) {
  return !layout.multi_process && r.stages == 1 && r.balance.empty() && r.virtual_stages == 1 &&
         chunks_of(r, layout) == 1 && r.schedule_file.empty();
}

int threads_per_rank(const PipelineRequest& r, const RunLayout& layout) {
  if (r.threads > 0) return r.threads;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int ranks_here = layout.multi_process ? layout.world : static_cast<int>(r.stages);
  return std::max(1, cores / std::max(1, ranks_here));
}

int64_t bucket_bytes_of(double mib) {
  return static_cast<int64_t>(std::clamp(mib * (1 << 20), 1.0, 0x1p62));
}

PipeOptions pipe_options(const PipelineRequest& r, const RunLayout& layout, int64_t layers) {
  PipeOptions options;
  options.chunks(chunks_of(r, layout))
      .virtual_stages(r.virtual_stages)
      .schedule(r.schedule)
      .timeout_seconds(r.timeout)
      .threads_per_stage(threads_per_rank(r, layout))
      .precision(r.precision)
      .offload_activations(r.offload_activations)
      .overlap_gradient_reduction(r.overlap_grad_reduce)
      .overlap_expert_exchanges(r.ep_overlap)
      // Clamped to what int64 holds: a bucket larger than every gradient is one bucket anyway.
      .bucket_bytes(bucket_bytes_of(r.bucket_mb));
  options.checkpoint(parse_checkpoint(r.checkpoint));
  int64_t ranks = layout.multi_process ? layout.pipeline_ranks : r.stages;
  if (layout.multi_process && !r.devices.empty()) {
    // One per process of this machine (process_device); a launch here starts `world` of them.
    if (static_cast<int>(r.devices.size()) != layout.world && !DistributedEnvironment::present()) {
      fail("--devices lists " + std::to_string(r.devices.size()) +
           " devices; with --nproc give one per process (" + std::to_string(layout.world) +
           "), in local rank order");
    }
    for (int k = 0; k < static_cast<int>(r.devices.size()); ++k) process_device(r, k);
  }
  if (!r.schedule_file.empty()) {
    const schedule::Schedule custom = load_custom(r, layout);
    ranks = custom.num_ranks;
    options.chunks(custom.num_microbatches)
        .virtual_stages(custom.virtual_stages())
        .schedule("custom");
    options.custom_schedule(custom);
  }
  set_stages(r, layout, layers, ranks, options);
  if (!layout.multi_process && on_cuda(r)) {
    try {
      options.devices(rank_devices(r.device, r.devices, static_cast<int>(ranks)));
    } catch (const Error& error) {
      fail("--device: " + std::string(error.what()));
    }
  }
  // A family that cannot take this shape (dualpipev with an odd K or too few micro-batches, a
  // V-shaped one with another --virtual) is bad input, named before any rank starts.
  const std::string why = schedule::shape_error(options.schedule(), static_cast<int>(ranks),
                                                static_cast<int>(options.chunks()),
                                                static_cast<int>(options.virtual_stages()));
  if (!why.empty()) fail("--schedule " + options.schedule() + ": " + why);
  return options;
}

std::string describe_pipeline(const PipeOptions& options, const std::vector<int64_t>& balance,
                              const RunLayout& layout) {
  const int64_t stages = balance.empty() ? options.stages() : static_cast<int64_t>(balance.size());
  std::ostringstream text;
  text << stages << " stages on " << stages / std::max<int64_t>(1, options.virtual_stages())
       << " ranks";
  if (layout.multi_process) {
    text << " (" << layout.world << " processes: " << layout.pipeline_ranks << " pipeline x ";
    if (layout.tensor_parallel > 1) text << layout.tensor_parallel << " tensor-parallel x ";
    text << layout.replicas / layout.context_parallel << " data-parallel";
    if (layout.context_parallel > 1)
      text << " x " << layout.context_parallel << " context-parallel";
    if (layout.expert_parallel > 1) text << ", experts over " << layout.expert_parallel;
    text << ")";
  }
  if (!balance.empty()) {
    text << " (balance";
    for (int64_t b : balance) text << " " << b;
    text << ")";
  }
  text << ", " << options.chunks() << " micro-batches, schedule " << options.schedule()
       << ", checkpoint " << to_string(options.checkpoint());
  if (options.precision() != Precision::kFloat32) text << ", " << to_string(options.precision());
  if (options.offload_activations()) text << ", activation offload";
  return text.str();
}

}  // namespace pipetrain
