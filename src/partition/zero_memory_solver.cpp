// ZeRO's part of the memory model (zero_memory.h). The "_solver" suffix puts this torch-free file
// in the pipetrain_schedule library.
//
// The rank's layout, as make_pipe_sharded_optimizer lays it out (train/sharded_optimizer.cpp):
//
//   per stage j of the rank, ascending:
//     by layer (streamed gradients, or stage 3 by layer): each layer's own parameters, cut into
//     buckets (a parameter larger than a bucket is one of its own; the parameters autocast
//     casts, under bf16 at stage 3, in buckets of their own)
//     else: the stage's own parameters, cut the same way
//   last: the persistent segments: parameters other layers share (ties), and at stage 3 by layer
//   the ones under the persistence threshold
//
// Each segment is padded to a multiple of dp elements; the shard is one dp-th of each. From it:
//
//   parameters       stage 3: the shard; else every parameter
//   gradients        stage 1: every .grad() (the reduced sums are written into its slices; the
//                    offload keeps a shard of its own besides); stages 2, 3: the shard's
//   optimizer state  s x shard
//   step gradients   stages 2, 3 streamed: the persistent segments' .grad() (accumulated) and
//                    the largest layer's gradients of one micro-batch (handed over at once);
//                    accumulated: every .grad()
//   reduce buffers   the segments in flight with their buffers (padded, and the received piece
//                    where it is one of its own: stage 1, and every streamed reduction): at the
//                    step's end two consecutive ones, with --overlap-grad-reduce all of them;
//                    streaming, the two largest; stages 1, 2's step gathers two consecutive ones
//   gathered params  stage 3 by layer: the most bytes whole at once walking the unit plan
//   gather buffers   (schedule/unit_residency.h: unit_peaks), plus the persistent segments whole
//                    through the step; by stage: the stage residency plan's walks below
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "pipetrain/schedule/residency.h"
#include "pipetrain/schedule/unit_residency.h"
#include "zero_memory.h"

namespace pipetrain::partition::detail {
namespace {

struct Segment {
  int stage = -1;
  int layer = -1;
  std::int64_t bytes = 0;
  bool narrowed = false;  // gathered in the narrowed dtype (stage 3 under bf16)
  bool streamed = false;
  int parameters = 0;
  bool expert = false;  // a mixture's experts: sharded over dp / expert_parallel replicas
};

struct Parameter {
  std::int64_t bytes = 0;
  bool narrowed = false;
  bool accumulated = false;  // a tie with another rank: reduced after the step, not streamed
  bool expert = false;
};

// The layout above for rank r. `persistent` is appended last, as the optimizer lays it out.
std::vector<Segment> rank_segments(const ModelProfile& profile, const std::vector<int>& balance,
                                   const schedule::Schedule& schedule, int r,
                                   const MemoryModelOptions& options) {
  const ZeroMemoryPolicy& policy = options.zero_policy;
  const bool stream = options.zero >= 2 && policy.stream;
  const bool by_layer = options.zero == 3 && policy.by_layer && !options.reshard_after_forward;
  const bool layer_layout = stream || by_layer;
  std::vector<Segment> segments;
  // cut_into_buckets of the kept parameters, then of the narrowed ones (the streamed ones first,
  // then those accumulated).
  // (A mixture's experts in buckets of their own, after the others of each kind.)
  auto cut = [&](int stage, int layer, const std::vector<Parameter>& parameters, bool streamed) {
    for (bool accumulated : {false, true}) {
      for (bool expert : {false, true}) {
        for (bool narrowed : {false, true}) {
          std::int64_t bytes = 0;
          bool open = false;
          for (const Parameter& p : parameters) {
            if (p.narrowed != narrowed || p.accumulated != accumulated || p.expert != expert) {
              continue;
            }
            if (!open || bytes + p.bytes > policy.bucket_bytes) {
              segments.push_back(
                  Segment{stage, layer, 0, narrowed, streamed && !accumulated, 0, expert});
              bytes = 0;
              open = true;
            }
            segments.back().bytes += p.bytes;
            ++segments.back().parameters;
            bytes += p.bytes;
          }
        }
      }
    }
  };
  std::vector<int> first_layer(balance.size(), 0);
  for (std::size_t j = 1; j < balance.size(); ++j)
    first_layer[j] = first_layer[j - 1] + balance[j - 1];
  std::vector<Parameter> persistent;
  // By layer a tied weight is its layer's, accumulated, unless the rank holds both of its layers
  // (the profile names no tensor: a tie is taken for one within the rank when another layer of
  // the rank shares a parameter of its size); that one is persistent, once.
  std::map<std::int64_t, int> shared_sizes;
  for (int j : schedule.stages_of_rank(r)) {
    for (int li = 0; li < balance[static_cast<std::size_t>(j)]; ++li) {
      const LayerProfile& layer =
          profile.layers[static_cast<std::size_t>(first_layer[static_cast<std::size_t>(j)] + li)];
      for (std::size_t q = 0; q < layer.shared_parameters.size(); ++q) {
        if (layer.shared_parameters[q]) ++shared_sizes[layer.parameter_sizes[q]];
      }
    }
  }
  std::map<std::int64_t, bool> persistent_once;
  for (int j : schedule.stages_of_rank(r)) {
    std::vector<Parameter> stage_own;
    for (int li = 0; li < balance[static_cast<std::size_t>(j)]; ++li) {
      const LayerProfile& layer =
          profile.layers[static_cast<std::size_t>(first_layer[static_cast<std::size_t>(j)] + li)];
      std::vector<Parameter> own;
      const std::size_t count = layer.parameter_sizes.empty() ? 1 : layer.parameter_sizes.size();
      for (std::size_t q = 0; q < count; ++q) {
        Parameter p;
        p.bytes = layer.parameter_sizes.empty() ? layer.parameter_bytes : layer.parameter_sizes[q];
        if (p.bytes == 0) continue;
        p.narrowed = options.cast_gathers &&
                     (layer.cast_parameters.empty() ? layer.cast_parameter_bytes == p.bytes
                                                    : static_cast<bool>(layer.cast_parameters[q]));
        p.expert = options.expert_parallel > 1 && !layer.expert_parameters.empty() &&
                   layer.expert_parameters[q];
        const bool shared = !layer.shared_parameters.empty() && layer.shared_parameters[q];
        const bool small = by_layer && p.bytes < policy.persistence_threshold;
        if (shared && layer_layout && shared_sizes[p.bytes] < 2) {
          p.accumulated = true;  // tied to another rank's copy: its layer's, reduced after the step
          own.push_back(p);
        } else if (shared) {
          if (!persistent_once[p.bytes]) persistent.push_back(p);
          persistent_once[p.bytes] = true;
        } else {
          (small ? persistent : own).push_back(p);
        }
      }
      if (layer_layout) {
        cut(j, li, own, stream);
      } else {
        stage_own.insert(stage_own.end(), own.begin(), own.end());
      }
    }
    if (!layer_layout) cut(j, -1, stage_own, false);
  }
  cut(-1, -1, persistent, false);
  return segments;
}

// ZeRO-3 by stage: the most bytes of whole stage parameters rank r holds at once, walking its
// residency plan as the interpreter follows it.
std::int64_t gathered_peak(const schedule::Schedule& schedule, int r,
                           const std::vector<std::int64_t>& stage_parameters, bool reshard) {
  const schedule::ResidencyPlan plan = schedule::parameter_residency(schedule, r, reshard);
  std::set<int> whole;
  std::int64_t held = 0, peak = 0;
  for (const schedule::ResidencyStep& step : plan.steps) {
    if (step.needs >= 0 && whole.insert(step.needs).second) {
      held += stage_parameters[static_cast<std::size_t>(step.needs)];
      peak = std::max(peak, held);
    }
    if (step.release >= 0 && whole.erase(step.release) > 0) {
      held -= stage_parameters[static_cast<std::size_t>(step.release)];
    }
  }
  return peak;
}

// ZeRO-3 by stage's gather buffers: the most receive-buffer bytes rank r has in flight at once,
// walking its residency plan as the interpreter follows it (a gather starts before the first
// action or after an action, as the prefetch; a wait before an action that needs a stage not yet
// whole starts it if nobody did; a release waits for a gather still running). A stage whole or
// in flight is not gathered again.
std::int64_t gather_buffer_peak(const schedule::Schedule& schedule, int r,
                                const std::vector<std::int64_t>& stage_buffers, bool reshard) {
  const schedule::ResidencyPlan plan = schedule::parameter_residency(schedule, r, reshard);
  std::set<int> in_flight, whole;
  std::int64_t flying = 0, peak = 0;
  auto start = [&](int j) {
    if (whole.count(j) || !in_flight.insert(j).second) return;
    flying += stage_buffers[static_cast<std::size_t>(j)];
    peak = std::max(peak, flying);
  };
  auto land = [&](int j) {
    if (in_flight.erase(j) > 0) flying -= stage_buffers[static_cast<std::size_t>(j)];
  };
  if (plan.first >= 0) start(plan.first);
  for (const schedule::ResidencyStep& step : plan.steps) {
    if (step.needs >= 0 && !whole.count(step.needs)) {
      start(step.needs);
      land(step.needs);
      whole.insert(step.needs);
    }
    if (step.release >= 0) {
      land(step.release);
      whole.erase(step.release);
    }
    if (step.prefetch >= 0) start(step.prefetch);
  }
  return peak;
}

// The most of `cost` two consecutive segments hold (one, when there is one).
std::int64_t two_consecutive(const std::vector<std::int64_t>& cost) {
  std::int64_t peak = cost.empty() ? 0 : cost.front();
  for (std::size_t k = 1; k < cost.size(); ++k) peak = std::max(peak, cost[k - 1] + cost[k]);
  return peak;
}

}  // namespace

bool zero_uses_hooks(const MemoryModelOptions& options) {
  return (options.zero >= 2 && options.zero_policy.stream) ||
         (options.zero == 3 && options.zero_policy.by_layer && !options.reshard_after_forward);
}

void add_zero_memory(const ModelProfile& profile, const std::vector<int>& balance,
                     const schedule::Schedule& schedule, int r, const MemoryModelOptions& options,
                     RankMemory& rank) {
  const int zero = options.zero;
  const ZeroMemoryPolicy& policy = options.zero_policy;
  const std::int64_t element = options.parameter_element_bytes;
  const std::int64_t wire = options.narrowed_element_bytes;
  const std::int64_t dp = options.data_parallel;
  const bool aliased = zero < 3 && !options.offload_optimizer;  // stages 1, 2 step the parameters
  const std::vector<Segment> segments = rank_segments(profile, balance, schedule, r, options);
  struct Sizes {
    std::int64_t padded = 0, piece = 0;  // bytes, in the parameters' dtype
    std::int64_t in_flight = 0;          // stage 3: its gather's buffers
  };
  std::vector<Sizes> sizes;
  std::int64_t shard = 0;
  for (const Segment& s : segments) {
    const std::int64_t elements = (s.bytes + element - 1) / element;
    // Its group's members: the replicas, or those holding the same experts.
    const std::int64_t members =
        s.expert ? std::max<std::int64_t>(1, dp / options.expert_parallel) : dp;
    const std::int64_t piece = (elements + members - 1) / members;
    Sizes z;
    z.padded = piece * members * element;
    z.piece = piece * element;
    // A gather's buffers while in flight: the padded whole, and the piece sent where it is a copy
    // of its own (narrowed; or read from the offload file, but at one replica, whose piece is
    // read into the whole's buffer).
    const bool piece_from_file = options.parameters_in_files && zero == 3 && members > 1;
    z.in_flight = s.narrowed ? piece * members * wire + piece * wire
                             : z.padded + (piece_from_file ? z.piece : 0);
    shard += z.piece;
    sizes.push_back(z);
  }
  const std::int64_t all = rank.parameters;
  rank.optimizer_state = static_cast<std::int64_t>(
      std::llround(static_cast<double>(shard) * options.optimizer_state_multiple));
  rank.gradients = zero == 1 ? all + (aliased ? 0 : shard) : shard;

  const auto alone = [&](const Segment& s) { return options.processes || s.stage >= 0; };
  // Reductions and (stages 1, 2) the step's gathers: their buffers in flight.
  std::vector<std::int64_t> at_end, gathers;
  // Streamed, by (stage, layer): the costs of its segments in order, and its gradients' bytes.
  std::map<std::pair<int, int>, std::vector<std::int64_t>> streamed;
  std::map<std::pair<int, int>, std::int64_t> layer_gradients;
  std::int64_t accumulated = 0;  // .grad() of the others
  for (std::size_t k = 0; k < segments.size(); ++k) {
    const Segment& s = segments[k];
    const Sizes& z = sizes[k];
    if (s.streamed) {
      // Received into a piece of its own, then added (the gradient in the files at one replica:
      // added to the file from the packed segment itself).
      const bool direct =
          options.gradients_in_files && options.parameters_in_files && zero == 3 && dp == 1;
      streamed[{s.stage, s.layer}].push_back(z.padded + (direct ? 0 : z.piece));
      layer_gradients[{s.stage, s.layer}] += s.bytes;
    } else {
      // One parameter needing no padding is reduced from its .grad() itself. (In one process
      // the ranks share one optimizer, which buckets a tie with its neighbours.)
      const bool in_place = s.parameters == 1 && z.padded == s.bytes && alone(s);
      // The piece is a buffer of its own where stage 1 writes it into .grad(), and where the
      // gradient is in the files with replicas (received, then written there).
      const bool own_piece = (zero == 1 && aliased) ||
                             (options.gradients_in_files && options.parameters_in_files && dp > 1);
      at_end.push_back((in_place ? 0 : z.padded) + (own_piece ? z.piece : 0));
      accumulated += s.bytes;
    }
    // Stages 1, 2's step gathers, into the parameter itself where it is one needing no padding.
    const bool into_itself = s.parameters == 1 && z.padded == s.bytes && alone(s);
    gathers.push_back((into_itself ? 0 : z.padded) + (aliased ? z.piece : 0));
  }
  std::int64_t reduce = 0;
  if (policy.overlap) {
    for (std::int64_t c : at_end) reduce += c;
  } else {
    reduce = two_consecutive(at_end);
  }
  // Streamed, in the order the rank's backwards make them: B runs a stage's layers from the
  // last, W from the first; two consecutive ones in flight (the same segment of two
  // micro-batches, where a stage has one).
  if (!streamed.empty()) {
    std::vector<std::int64_t> order;
    for (const schedule::Action& a : schedule.actions.at(static_cast<std::size_t>(r))) {
      if (a.op != schedule::Op::kBackward && a.op != schedule::Op::kBackwardWeight) continue;
      const auto first = streamed.lower_bound({a.stage, -1});
      const auto last = streamed.lower_bound({a.stage + 1, -1});
      std::vector<std::vector<std::int64_t>> layers;
      for (auto it = first; it != last; ++it) layers.push_back(it->second);
      if (a.op == schedule::Op::kBackward) std::reverse(layers.begin(), layers.end());
      for (const auto& costs : layers) order.insert(order.end(), costs.begin(), costs.end());
    }
    reduce = std::max(reduce, two_consecutive(order));
  }
  if (zero < 3) reduce = std::max(reduce, two_consecutive(gathers));
  // Without replicas an offloaded rank builds its buffers where its shard lives, the host.
  (options.offload_optimizer && dp == 1 ? rank.offloaded : rank.reduce_buffers) += reduce;
  if (zero >= 2) {
    std::int64_t largest_layer = 0;
    for (const auto& [layer, bytes] : layer_gradients)
      largest_layer = std::max(largest_layer, bytes);
    rank.step_gradients = accumulated + largest_layer;
  }

  if (zero == 3) {
    rank.parameters = shard;
    const bool by_layer = policy.by_layer && !options.reshard_after_forward;
    if (by_layer) {
      // Units: each (stage, layer)'s segments; the persistent ones whole through the step.
      std::map<std::pair<int, int>, std::size_t> unit_of;
      std::vector<std::int64_t> whole_bytes, in_flight_bytes;
      std::map<int, int> counts;
      std::int64_t persistent_whole = 0, persistent_in_flight = 0;
      for (std::size_t k = 0; k < segments.size(); ++k) {
        const Segment& s = segments[k];
        if (s.layer < 0) {
          persistent_whole += sizes[k].padded;
          persistent_in_flight += sizes[k].in_flight;
          continue;
        }
        auto [found, fresh] = unit_of.emplace(std::make_pair(s.stage, s.layer), whole_bytes.size());
        if (fresh) {
          whole_bytes.push_back(0);
          in_flight_bytes.push_back(0);
          ++counts[s.stage];
        }
        whole_bytes[found->second] += sizes[k].padded;
        in_flight_bytes[found->second] += sizes[k].in_flight;
      }
      const schedule::UnitIds ids = schedule::unit_ids(counts);
      const schedule::UnitPlan plan = schedule::plan_units(
          schedule::unit_uses(schedule, r, ids, options.checkpoint), whole_bytes, policy.units);
      const schedule::UnitPeaks peaks = schedule::unit_peaks(plan, whole_bytes, in_flight_bytes);
      // A gathered buffer becomes the parameters' storage: whole and in flight are one peak,
      // with the persistent segments whole through the step (in flight before the first use,
      // beside the first gathers).
      std::int64_t first = persistent_in_flight;
      for (schedule::UnitId x : plan.first) first += in_flight_bytes[static_cast<std::size_t>(x)];
      rank.gathered = std::max(peaks.together + persistent_whole, first);
      rank.gather_buffers = 0;
    } else {
      // By stage: each stage's segments (the persistent ones with every stage that runs first).
      std::vector<std::int64_t> stage_whole(static_cast<std::size_t>(schedule.num_stages), 0);
      std::vector<std::int64_t> stage_buffers(stage_whole.size(), 0);
      for (std::size_t k = 0; k < segments.size(); ++k) {
        const int j =
            segments[k].stage >= 0 ? segments[k].stage : schedule.stages_of_rank(r).front();
        stage_whole[static_cast<std::size_t>(j)] += segments[k].bytes;
        stage_buffers[static_cast<std::size_t>(j)] += sizes[k].in_flight;
      }
      rank.gathered = gathered_peak(schedule, r, stage_whole, options.reshard_after_forward);
      rank.gather_buffers =
          gather_buffer_peak(schedule, r, stage_buffers, options.reshard_after_forward);
    }
  }
  if (options.offload_optimizer) {
    // The host keeps the shard's float32 values (the step's), its gradient and the state; the
    // device keeps the parameters, their gradients and (ZeRO-3) the shard the gathers read.
    // In files (nvme): the state (and with the parameters, the shard's values, which the gathers
    // then read from the file) leave memory, and the pool the transfers go through comes in.
    const bool values_in_files = options.parameters_in_files && zero == 3;
    const bool gradient_in_files = values_in_files && options.gradients_in_files;
    rank.offloaded +=
        (values_in_files ? 0 : shard) + (gradient_in_files ? 0 : shard) +
        (options.optimizer_state_in_files ? options.offload_buffer_bytes : rank.optimizer_state);
    if (values_in_files) rank.parameters -= shard;
    rank.gradients -= shard;
    rank.optimizer_state = 0;
  }
}

}  // namespace pipetrain::partition::detail
