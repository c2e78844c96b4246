// Memory model (memory.h): per-stage and per-rank peak bytes of a plan; byte-size text.
// (The "_solver" suffix puts this torch-free file in the pipetrain_schedule library.)
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <set>
#include <stdexcept>
#include <string>

#include "pipetrain/base/error.h"
#include "pipetrain/partition/memory.h"
#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/residency.h"
#include "pipetrain/schedule/send_release.h"
#include "zero_memory.h"

namespace pipetrain::partition {

using schedule::Op;

std::vector<StageResidency> stage_residency(const schedule::Schedule& schedule) {
  const int S = schedule.num_stages;
  const int last = schedule.num_microbatches - 1;
  std::vector<StageResidency> result(S);
  std::vector<int> live(S, 0);
  std::vector<bool> last_alive(S, false);
  for (const auto& list : schedule.actions) {
    for (const auto& a : list) {
      const int j = a.stage;
      switch (a.op) {
        case Op::kForward:
          result[j].peak_inflight = std::max(result[j].peak_inflight, ++live[j]);
          if (a.microbatch == last) last_alive[j] = true;
          break;
        case Op::kBackward:
        case Op::kBackwardInput:
          // A checkpointed micro-batch recomputes its forward right before B (or I).
          if (a.microbatch != last && last_alive[j]) result[j].last_alive_during_recompute = true;
          if (a.op == Op::kBackward) {
            --live[j];
            if (a.microbatch == last) last_alive[j] = false;
          }
          break;
        case Op::kBackwardWeight:
          --live[j];
          if (a.microbatch == last) last_alive[j] = false;
          break;
        default:
          break;  // communication holds no stash of its own
      }
    }
  }
  return result;
}

double optimizer_state_multiple(const std::string& optimizer, double momentum) {
  if (optimizer == "sgd") return momentum > 0 ? 1 : 0;
  return 2;  // adam, adamw: two moments per parameter
}

StageMemory stage_memory(std::int64_t parameter_bytes, std::int64_t input_bytes,
                         std::int64_t body_bytes, const StageResidency& residency,
                         Checkpoint checkpoint, double optimizer_state_multiple) {
  StageMemory m;
  m.parameters = parameter_bytes;
  m.gradients = parameter_bytes;
  m.optimizer_state = static_cast<std::int64_t>(
      std::llround(static_cast<double>(parameter_bytes) * optimizer_state_multiple));
  const std::int64_t n = residency.peak_inflight;
  switch (checkpoint) {
    case Checkpoint::kNever:
      m.stashed_activations = n * (input_bytes + body_bytes);
      break;
    case Checkpoint::kAlways:
      m.stashed_activations = n * input_bytes;
      m.recompute_activations = n > 0 ? body_bytes : 0;
      break;
    case Checkpoint::kExceptLast:
      // [1] the last micro-batch keeps its body; [2] another one may be recomputed meanwhile.
      m.stashed_activations = n * input_bytes + (n > 0 ? body_bytes : 0);
      m.recompute_activations = residency.last_alive_during_recompute ? body_bytes : 0;
      break;
  }
  return m;
}

StageBytes stage_bytes(const ModelProfile& profile, std::int64_t first, std::int64_t end,
                       std::int64_t microbatch_size) {
  StageBytes bytes;
  bytes.input = first == 0 ? profile.input_bytes_at(microbatch_size)
                           : profile.layer_cost(first - 1, microbatch_size).output_bytes;
  for (std::int64_t l = first; l < end; ++l) {
    bytes.parameters += profile.layers[static_cast<std::size_t>(l)].parameter_bytes;
    const LayerCost cost = profile.layer_cost(l, microbatch_size);
    // The first layer's input is the stage's leaf, kept whatever autograd saves.
    bytes.body += l == first ? cost.split_first_activation_bytes : cost.activation_bytes;
    bytes.split_body +=
        l == first ? cost.split_first_activation_bytes : cost.split_activation_bytes;
  }
  // The allocator can see a layer free more than it keeps (its input dropped); a stage's body
  // never holds less than nothing.
  bytes.body = std::max<std::int64_t>(bytes.body, 0);
  bytes.split_body = std::max<std::int64_t>(bytes.split_body, 0);
  return bytes;
}

namespace {

void check_memory_inputs(const ModelProfile& profile, const std::vector<int>& balance,
                         const schedule::Schedule& schedule, const MemoryModelOptions& options) {
  if (static_cast<int>(balance.size()) != schedule.num_stages) {
    throw BadInput("memory model: balance has " + std::to_string(balance.size()) +
                   " stages but the schedule has " + std::to_string(schedule.num_stages) +
                   "; give one layer count per stage");
  }
  std::int64_t layers = 0;
  for (int j = 0; j < schedule.num_stages; ++j) {
    if (balance[j] < 1) {
      throw BadInput("memory model: stage " + std::to_string(j) + " has " +
                     std::to_string(balance[j]) + " layers; every stage needs >= 1");
    }
    layers += balance[j];
  }
  if (layers > profile.num_layers()) {
    throw BadInput("memory model: balance asks for " + std::to_string(layers) +
                   " layers but the model has " + std::to_string(profile.num_layers()));
  }
  if (options.zero < 0 || options.zero > 3) {
    throw BadInput("memory model: ZeRO stage " + std::to_string(options.zero) +
                   " does not exist; use 0, 1, 2 or 3");
  }
  if (options.data_parallel < 1 || options.parameter_element_bytes < 1) {
    throw BadInput("memory model: data_parallel (" + std::to_string(options.data_parallel) +
                   ") and parameter_element_bytes (" +
                   std::to_string(options.parameter_element_bytes) + ") must be >= 1");
  }
  const bool checkpointed =
      options.checkpoint == Checkpoint::kAlways ||
      (options.checkpoint == Checkpoint::kExceptLast && schedule.num_microbatches > 1);
  if (options.offload && !checkpointed) {
    throw BadInput(std::string("memory model: activation offload moves the inputs that "
                               "checkpointed micro-batches keep, and checkpoint ") +
                   to_string(options.checkpoint) + " with " +
                   std::to_string(schedule.num_microbatches) +
                   " micro-batch(es) checkpoints none; use checkpoint always or except_last");
  }
}

std::int64_t align64(std::int64_t bytes) {
  return (bytes + 63) / 64 * 64;
}

// Receive buffers of rank r, in the order the rank runs its compute (a receive comes right
// before the action that needs it): the largest two consecutive receives.
void receive_bytes(const schedule::Schedule& schedule, int r,
                   const std::vector<std::int64_t>& output_bytes, RankMemory& rank) {
  std::vector<std::int64_t> received;
  const int S = schedule.num_stages;
  auto elsewhere = [&](int j) { return j >= 0 && j < S && schedule.stage_rank[j] != r; };
  for (const auto& a : schedule.actions[static_cast<std::size_t>(r)]) {
    const int j = a.stage;
    if (a.op == Op::kForward && elsewhere(j - 1)) {
      received.push_back(transport_message_bytes(output_bytes[j - 1]));
    } else if ((a.op == Op::kBackward || a.op == Op::kBackwardInput) && elsewhere(j + 1)) {
      received.push_back(transport_message_bytes(output_bytes[j]));
    }
  }
  rank.receive_buffers = received.size() == 1 ? received[0] : 0;
  for (std::size_t k = 1; k < received.size(); ++k)
    rank.receive_buffers = std::max(rank.receive_buffers, received[k - 1] + received[k]);
}

// Send buffers of every rank: before each remote send the sends released_sends() frees go
// (proven received, or the oldest beyond the send window: schedule/send_release.h), then the new
// message is held. The most held at once.
std::vector<std::int64_t> send_bytes(const SendWalk& walk,
                                     const std::vector<std::int64_t>& output_bytes) {
  std::vector<std::int64_t> peaks(walk.ranks.size(), 0);
  for (std::size_t r = 0; r < walk.ranks.size(); ++r) {
    std::vector<std::int64_t> sent;  // the rank's remote sends so far, in order
    std::int64_t held = 0;
    std::size_t freed = 0;
    for (const auto& [boundary, release] : walk.ranks[r]) {
      for (; freed < static_cast<std::size_t>(release); ++freed) held -= sent[freed];
      sent.push_back(transport_message_bytes(output_bytes[static_cast<std::size_t>(boundary)]));
      held += sent.back();
      peaks[r] = std::max(peaks[r], held);
    }
  }
  return peaks;
}

// The most bytes each rank's stages stash at once, walking the rank's list in order (list order
// is time order), micro-batch by micro-batch as the runtime holds them (stage/stage.h):
//   F i         + in_j, and + body_j unless i is checkpointed
//   B i, I i    a checkpointed i is recomputed first: + body_j, held until i is freed
//   B i, W i    - everything of i
// A split backward keeps a recomputed micro-batch's body from its I to its W, so several can be
// held at once; the closed form (stage_memory) assumes one recompute at a time.
// With offload, a checkpointed i's in_j goes to host memory after its F and comes back where the
// interpreter prefetches it (runtime/interpreter.cpp): before each action, the first B or I after
// that action in the rank's list is brought back if it is away; i's own B or I brings it back if
// nobody did. The schedule must be lowered for that (the prefetch points include communication).
struct StashPeaks {
  std::vector<std::int64_t> activations;  // per rank
  std::vector<std::int64_t> offloaded;    // per rank: its stages' peaks summed
};

StashPeaks stash_peaks(const schedule::Schedule& schedule, const std::vector<std::int64_t>& input,
                       const std::vector<std::int64_t>& body, const MemoryModelOptions& options) {
  const int M = schedule.num_microbatches;
  const Checkpoint checkpoint = options.checkpoint;
  auto checkpointed = [&](int i) {
    return checkpoint == Checkpoint::kAlways ||
           (checkpoint == Checkpoint::kExceptLast && i != M - 1);
  };
  struct Held {
    bool live = false;   // forwarded and not freed yet
    bool whole = false;  // its body is held (not checkpointed, or recomputed)
    bool away = false;   // its input waits in host memory (offload)
    std::int64_t bytes = 0;
  };
  const auto S = static_cast<std::size_t>(schedule.num_stages);
  // By (stage j, micro-batch i) at j * M + i; a rank touches only its own stages' cells.
  std::vector<Held> held(S * M);
  std::vector<std::int64_t> offloaded_now(S, 0), offloaded_peak(S, 0);
  StashPeaks peaks;
  peaks.offloaded.assign(schedule.actions.size(), 0);
  for (std::size_t r = 0; r < schedule.actions.size(); ++r) {
    const auto& list = schedule.actions[r];
    const bool frees = r < options.offload_frees_stash.size() && options.offload_frees_stash[r];
    std::int64_t now = 0, peak = 0;
    // The input of stage j's micro-batch h comes back to the device.
    auto bring_back = [&](Held& h, std::size_t j) {
      if (!h.away) return;
      h.away = false;
      offloaded_now[j] -= input[j];
      if (frees) {
        h.bytes += input[j];
        now += input[j];
      }
    };
    // [a]: the first B or I after action a (the interpreter's next_backward_), -1 if none.
    std::vector<int> next_backward(list.size(), -1);
    for (std::size_t a = list.size(); a-- > 1;) {
      const bool backward = list[a].op == Op::kBackward || list[a].op == Op::kBackwardInput;
      next_backward[a - 1] = backward ? static_cast<int>(a) : next_backward[a];
    }
    for (std::size_t k = 0; k < list.size(); ++k) {
      const auto& a = list[k];
      if (options.offload && next_backward[k] >= 0) {
        const auto& next = list[static_cast<std::size_t>(next_backward[k])];
        const auto j = static_cast<std::size_t>(next.stage);
        bring_back(held[j * M + static_cast<std::size_t>(next.microbatch)], j);
      }
      const auto j = static_cast<std::size_t>(a.stage);
      Held& h = held[j * M + static_cast<std::size_t>(a.microbatch)];
      bool goes_away = false;
      if (a.op == Op::kForward) {
        h.live = true;
        h.whole = !checkpointed(a.microbatch);
        h.bytes = input[j] + (h.whole ? body[j] : 0);
        now += h.bytes;
        goes_away = options.offload && !h.whole;
      } else if (a.op == Op::kBackward || a.op == Op::kBackwardInput) {
        bring_back(h, j);
        if (h.live && !h.whole) {  // the recompute
          h.whole = true;
          h.bytes += body[j];
          now += body[j];
        }
      } else if (a.op != Op::kBackwardWeight) {
        continue;  // communication holds no stash of its own
      }
      peak = std::max(peak, now);
      if (goes_away) {  // after the forward, as Stage::forward offloads
        h.away = true;
        offloaded_now[j] += input[j];
        offloaded_peak[j] = std::max(offloaded_peak[j], offloaded_now[j]);
        if (frees) {
          h.bytes -= input[j];
          now -= input[j];
        }
      }
      if (a.op == Op::kBackward || a.op == Op::kBackwardWeight) {
        if (h.away) offloaded_now[j] -= input[j];
        now -= h.bytes;
        h = Held{};
      }
    }
    peaks.activations.push_back(peak);
  }
  for (std::size_t j = 0; j < S; ++j) {
    peaks.offloaded[static_cast<std::size_t>(schedule.stage_rank[j])] += offloaded_peak[j];
  }
  return peaks;
}

}  // namespace

SendWalk send_walk(const schedule::Schedule& schedule) {
  const schedule::Schedule lowered =
      schedule::is_lowered(schedule) ? schedule : schedule::lower(schedule);
  const auto released = schedule::released_sends(lowered);
  SendWalk walk;
  walk.ranks.resize(lowered.actions.size());
  for (std::size_t r = 0; r < lowered.actions.size(); ++r) {
    const auto& list = lowered.actions[r];
    for (std::size_t a = 0; a < list.size(); ++a) {
      if (released[r][a] < 0) continue;
      const int j = list[a].stage;
      walk.ranks[r].emplace_back(list[a].op == Op::kSendActivation ? j : j - 1, released[r][a]);
    }
  }
  return walk;
}

namespace {

// The bytes of a mixture's experts among rank r's layers (LayerProfile::expert_parameters).
std::int64_t rank_expert_bytes(const ModelProfile& profile, const std::vector<int>& balance,
                               const schedule::Schedule& schedule, int r) {
  std::vector<int> first(balance.size(), 0);
  for (std::size_t j = 1; j < balance.size(); ++j) first[j] = first[j - 1] + balance[j - 1];
  std::int64_t bytes = 0;
  for (int j : schedule.stages_of_rank(r)) {
    for (int l = 0; l < balance[static_cast<std::size_t>(j)]; ++l) {
      const LayerProfile& layer =
          profile.layers[static_cast<std::size_t>(first[static_cast<std::size_t>(j)] + l)];
      for (std::size_t q = 0; q < layer.expert_parameters.size(); ++q) {
        if (layer.expert_parameters[q]) bytes += layer.parameter_sizes[q];
      }
    }
  }
  return bytes;
}

}  // namespace

std::int64_t transport_message_bytes(std::int64_t data_bytes) {
  return 256 + align64(data_bytes);
}

std::int64_t& RankMemory::operator[](int category) {
  switch (category) {
    case 0:
      return parameters;
    case 1:
      return gradients;
    case 2:
      return optimizer_state;
    case 3:
      return activations;
    case 4:
      return receive_buffers;
    case 5:
      return send_buffers;
    case 7:
      return gathered;
    case 6:
      return offloaded;
    case 8:
      return reduce_buffers;
    case 9:
      return step_gradients;
    case 10:
      return gather_buffers;
    case 11:
      return checkpoint_snapshot;
  }
  throw BadInput("RankMemory: no category " + std::to_string(category) + " (0..11)");
}

std::int64_t RankMemory::operator[](int category) const {
  return (*const_cast<RankMemory*>(this))[category];
}

const char* memory_category_name(int category) {
  static const char* const names[RankMemory::kCategories] = {
      "parameters",      "gradients",      "optimizer state",   "activations",
      "receive buffers", "send buffers",   "offloaded to host", "gathered params",
      "reduce buffers",  "step gradients", "gather buffers",    "ckpt snapshot"};
  if (category < 0 || category >= RankMemory::kCategories) {
    throw BadInput("memory_category_name: no category " + std::to_string(category) + " (0..11)");
  }
  return names[category];
}

std::vector<RankMemory> predict_memory(const ModelProfile& profile, const std::vector<int>& balance,
                                       std::int64_t microbatch_size,
                                       const schedule::Schedule& schedule,
                                       const MemoryModelOptions& options) {
  check_memory_inputs(profile, balance, schedule, options);
  const int S = schedule.num_stages;
  std::vector<RankMemory> ranks(static_cast<std::size_t>(schedule.num_ranks));
  std::vector<std::int64_t> input(static_cast<std::size_t>(S), 0);
  std::vector<std::int64_t> body(static_cast<std::size_t>(S), 0);
  std::vector<std::int64_t> output_bytes(static_cast<std::size_t>(S), 0);
  // Every training forward is recorded for a split backward where the schedule splits it, or
  // where ZeRO's hooks take each layer's uses and gradients.
  const bool split = schedule.splits_backward() || detail::zero_uses_hooks(options);
  std::int64_t first = 0;
  for (int j = 0; j < S; ++j) {
    const std::int64_t end = first + balance[j];
    const StageBytes bytes = stage_bytes(profile, first, end, microbatch_size);
    output_bytes[j] = profile.layer_cost(end - 1, microbatch_size).output_bytes;
    input[j] = bytes.input;
    body[j] = (split ? bytes.split_body : bytes.body) + (j == S - 1 ? options.loss_bytes : 0);
    ranks[static_cast<std::size_t>(schedule.stage_rank[j])].parameters += bytes.parameters;
    first = end;
  }
  // Offload's prefetch points include communication: walk the list the interpreter runs.
  const StashPeaks peaks = options.offload && !schedule::is_lowered(schedule)
                               ? stash_peaks(schedule::lower(schedule), input, body, options)
                               : stash_peaks(schedule, input, body, options);
  std::vector<std::int64_t> sends;
  if (options.processes) {
    sends = options.sends ? send_bytes(*options.sends, output_bytes)
                          : send_bytes(send_walk(schedule), output_bytes);
  }
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    RankMemory& rank = ranks[r];
    rank.activations = peaks.activations[r];
    rank.offloaded = peaks.offloaded[r];
    if (options.async_checkpoint) {
      // Its stages' whole parameters (before ZeRO shards them) and their state, over the replicas.
      const double state =
          static_cast<double>(rank.parameters) * (1.0 + options.optimizer_state_multiple);
      rank.checkpoint_snapshot =
          static_cast<std::int64_t>(state / std::max(options.data_parallel, 1) + 0.5);
    }
    if (options.zero > 0) {
      detail::add_zero_memory(profile, balance, schedule, static_cast<int>(r), options, rank);
    } else {
      rank.gradients = rank.parameters;
      rank.optimizer_state = static_cast<std::int64_t>(
          std::llround(static_cast<double>(rank.parameters) * options.optimizer_state_multiple));
      // The replicas' gradient sum: every gradient once (its flat copy, or its buckets); with
      // expert parallelism the experts' after the others', over their own replicas.
      if (options.data_parallel > 1) {
        const std::int64_t experts =
            options.expert_parallel > 1
                ? rank_expert_bytes(profile, balance, schedule, static_cast<int>(r))
                : 0;
        rank.reduce_buffers = std::max(
            rank.parameters - experts,
            options.data_parallel / options.expert_parallel > 1 ? experts : std::int64_t{0});
      }
    }
    if (options.processes) {
      receive_bytes(schedule, static_cast<int>(r), output_bytes, rank);
      rank.send_buffers = sends[r];
    }
  }
  return ranks;
}

std::vector<std::int64_t> rank_peak_memory(const ModelProfile& profile,
                                           const std::vector<int>& balance,
                                           std::int64_t microbatch_size,
                                           const schedule::Schedule& schedule,
                                           const MemoryModelOptions& options) {
  std::vector<std::int64_t> totals;
  for (const RankMemory& rank :
       predict_memory(profile, balance, microbatch_size, schedule, options)) {
    totals.push_back(rank.total());
  }
  return totals;
}

std::string format_bytes(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::fabs(value) >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(text, sizeof text, "%.*f %s", value < 10 ? 2 : 1, value, units[unit]);
  }
  return text;
}

std::int64_t parse_bytes(std::string_view text) {
  std::string s;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  }
  std::size_t used = 0;
  double number = 0;
  try {
    number = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = s.substr(used);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double scale = -1;
  if (unit.empty() || unit == "b")
    scale = 1;
  else if (unit == "k" || unit == "kib")
    scale = 1024.0;
  else if (unit == "m" || unit == "mib")
    scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb")
    scale = 1e3;
  else if (unit == "mb")
    scale = 1e6;
  else if (unit == "gb")
    scale = 1e9;
  else if (unit == "tb")
    scale = 1e12;
  if (used == 0 || scale < 0 || !(number >= 0)) {
    throw BadInput("cannot read '" + std::string(text) +
                   "' as a size; write e.g. 2GiB, 512MiB, 1.5G or 1000000 (bytes)");
  }
  // Beyond what int64 counts (8 EiB; inf too) llround has no answer.
  if (!(number * scale < 0x1p63)) {
    throw BadInput("'" + std::string(text) + "' is larger than the 8 EiB a size can be");
  }
  return static_cast<std::int64_t>(std::llround(number * scale));
}

}  // namespace pipetrain::partition
