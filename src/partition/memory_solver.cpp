// Memory model (memory.h): per-stage and per-rank peak bytes of a plan; byte-size text.
// (The "_solver" suffix puts this torch-free file in the pipetrain_schedule library.)
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "pipetrain/base/error.h"
#include "pipetrain/partition/memory.h"

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
    bytes.body += profile.layer_cost(l, microbatch_size).activation_bytes;
  }
  // The allocator can see a layer free more than it keeps (its input dropped); a stage's body
  // never holds less than nothing.
  bytes.body = std::max<std::int64_t>(bytes.body, 0);
  return bytes;
}

std::vector<std::int64_t> rank_peak_memory(const ModelProfile& profile,
                                           const std::vector<int>& balance,
                                           std::int64_t microbatch_size,
                                           const schedule::Schedule& schedule,
                                           const std::vector<StageResidency>& residency,
                                           Checkpoint checkpoint, double optimizer_state_multiple) {
  if (static_cast<int>(balance.size()) != schedule.num_stages ||
      static_cast<int>(residency.size()) != schedule.num_stages) {
    throw BadInput("rank_peak_memory: balance has " + std::to_string(balance.size()) +
                   " stages but the schedule has " + std::to_string(schedule.num_stages) +
                   "; give one layer count per stage");
  }
  std::vector<std::int64_t> held(schedule.num_ranks, 0);
  std::vector<std::int64_t> recompute(schedule.num_ranks, 0);
  std::int64_t first = 0;
  for (int j = 0; j < schedule.num_stages; ++j) {
    if (balance[j] < 1) {
      throw BadInput("rank_peak_memory: stage " + std::to_string(j) + " has " +
                     std::to_string(balance[j]) + " layers; every stage needs >= 1");
    }
    const std::int64_t end = first + balance[j];
    if (end > profile.num_layers()) {
      throw BadInput("rank_peak_memory: balance asks for " + std::to_string(end) +
                     " layers but the model has " + std::to_string(profile.num_layers()));
    }
    const StageBytes bytes = stage_bytes(profile, first, end, microbatch_size);
    const StageMemory m = stage_memory(bytes.parameters, bytes.input, bytes.body, residency[j],
                                       checkpoint, optimizer_state_multiple);
    const int r = schedule.stage_rank[j];
    held[r] += m.total() - m.recompute_activations;
    recompute[r] = std::max(recompute[r], m.recompute_activations);
    first = end;
  }
  for (int r = 0; r < schedule.num_ranks; ++r) held[r] += recompute[r];
  return held;
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
  return static_cast<std::int64_t>(std::llround(number * scale));
}

}  // namespace pipetrain::partition
