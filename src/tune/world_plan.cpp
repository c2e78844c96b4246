// plan --world: pipeline x tensor x data layouts of a Llama model (tune/world_plan.h). [n] cite
// the header's steps.
#include "pipetrain/tune/world_plan.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "pipetrain/base/check.h"
#include "pipetrain/base/error.h"
#include "pipetrain/models/llama.h"
#include "pipetrain/models/llama_profile.h"
#include "pipetrain/partition/memory.h"
#include "pipetrain/runtime/launcher.h"
#include "pipetrain/train/sharded_optimizer.h"
#include "pipetrain/transport/c10d.h"
#include "pipetrain/tune/model_plan.h"

namespace pipetrain::tune {
namespace {

namespace pp = pipetrain::partition;

void progress(const WorldPlanRequest& r, const std::string& text) {
  if (r.diagnostics) r.diagnostics({Diagnostic::Kind::kProgress, text});
}

// [1] The tensor-parallel sizes the config allows, ascending.
std::vector<int> valid_tp(const models::LlamaConfig& config, int world) {
  std::vector<int> sizes;
  for (int tp = 1; tp <= world; ++tp) {
    if (world % tp != 0) continue;
    try {
      models::check_llama_tensor_parallel(config, tp);
      sizes.push_back(tp);
    } catch (const Error&) {
    }
  }
  return sizes;
}

struct Shape {
  int pp, tp, dp;
  bool sp;
  int ep = 1;
  int cp = 1;
};

// [1] cp of r splitting each sequence: 2 cp chunks (ring) or cp chunks and the heads of a tp
// rank (Ulysses), each at least a token.
bool splits_sequence(const WorldPlanRequest& r, int cp, int tp, int64_t seq) {
  const int64_t chunks = r.ulysses ? cp : 2 * cp;
  return seq % chunks == 0 && (!r.ulysses || (r.config.num_attention_heads / tp) % cp == 0);
}

std::vector<Shape> layouts_of(const WorldPlanRequest& r) {
  const int64_t batch = r.sample.size(0);
  const int64_t seq = r.sample.size(1);
  std::vector<Shape> shapes;
  for (int tp : valid_tp(r.config, r.world)) {
    for (int cp = 1; cp <= std::min(r.max_context_parallel, r.world / tp); ++cp) {
      if ((r.world / tp) % cp != 0 || (cp > 1 && !splits_sequence(r, cp, tp, seq))) continue;
      const int rest = r.world / tp / cp;
      for (int dp = 1; dp <= rest; ++dp) {
        if (rest % dp != 0 || batch % dp != 0) continue;
        const int pp = rest / dp;
        if (pp > r.config.entries()) continue;
        if (r.planner.zero > 0 && dp * cp < 2) continue;  // ZeRO shards over replicas
        shapes.push_back({pp, tp, dp, false, 1, cp});
        if (tp > 1 && (seq / cp) % tp == 0) shapes.push_back({pp, tp, dp, true, 1, cp});
        // A mixture: its experts over ep of the dp replicas, every ep dividing both.
        if (cp == 1 && models::is_moe(r.config.architecture)) {
          for (int ep = 2; ep <= dp; ++ep) {
            if (dp % ep == 0 && r.config.num_experts % ep == 0) {
              shapes.push_back({pp, tp, dp, false, ep});
            }
          }
        }
      }
    }
  }
  return shapes;
}

int64_t element_bytes(Precision precision) {
  return precision == Precision::kFloat32 ? 4 : 2;
}

double gather_seconds(const pp::TransferModel& m, int64_t bytes) {
  return m.latency_seconds + static_cast<double>(bytes) / (2 * m.bytes_per_second);
}

}  // namespace

std::vector<std::vector<double>> add_tensor_parallel_collectives(pp::ModelProfile& profile,
                                                                 bool sequence_parallel,
                                                                 const pp::TransferModel& ar,
                                                                 int64_t seq, int64_t hidden,
                                                                 Precision precision) {
  std::vector<std::vector<double>> added;
  const int64_t layers = profile.num_layers();
  for (size_t k = 0; k < profile.microbatch_sizes.size(); ++k) {
    const int64_t rows = profile.microbatch_sizes[k];
    const int64_t n = rows * seq * hidden * element_bytes(precision);
    const double all_reduce = ar.seconds(n);
    const double gather = gather_seconds(ar, n);  // all-gather or reduce-scatter
    const double loss_stats = 2 * ar.seconds(rows * seq * 4);
    std::vector<double>& per_layer = added.emplace_back();
    for (int64_t l = 0; l < layers; ++l) {
      pp::LayerCost& c = profile.layers[static_cast<size_t>(l)].costs.at(k);
      double forward = 0, backward = 0;
      if (l == 0) {  // embedding
        forward = sequence_parallel ? gather : all_reduce;
      } else if (l == layers - 1) {  // head
        forward = loss_stats + (sequence_parallel ? gather : 0);
        backward = sequence_parallel ? gather : all_reduce;
      } else if (l < layers - 2) {  // decoder layers (layers - 2 is the final norm)
        forward = sequence_parallel ? 4 * gather : 2 * all_reduce;
        backward = forward;
      }
      c.forward_seconds += forward;
      c.backward_seconds += backward;
      c.backward_input_seconds += backward;
      per_layer.push_back(forward + backward);
    }
  }
  return added;
}

namespace {

int64_t expert_parameter_bytes(const models::LlamaConfig& config, int ep) {
  // gate, up and down of each of the rank's experts, float32 master weights.
  return config.num_experts / ep * 3 * config.hidden_size * config.expert_intermediate_size * 4;
}

double add_expert_all_to_alls(pp::ModelProfile& profile, const models::LlamaConfig& config,
                              const pp::TransferModel& group, int ep, int64_t seq,
                              Precision precision) {
  double per_microbatch = 0;
  for (size_t k = 0; k < profile.microbatch_sizes.size(); ++k) {
    // What a member sends of one exchange: its (token, choice) rows for the others' experts.
    const int64_t rows = profile.microbatch_sizes[k] * seq * config.num_experts_per_tok;
    const int64_t bytes = rows * config.hidden_size * element_bytes(precision) * (ep - 1) / ep;
    const double exchange = gather_seconds(group, bytes);
    // The forward's exchange of per-expert counts before the dispatch: a message of E counts.
    const double counts = gather_seconds(group, config.num_experts * 8);
    double total = 0;
    for (int64_t l = 1; l <= config.num_hidden_layers; ++l) {
      if (!config.is_moe_layer(l - 1)) continue;
      pp::LayerCost& c = profile.layers.at(static_cast<size_t>(l)).costs.at(k);
      c.forward_seconds += counts + 2 * exchange;  // counts, dispatch, combine
      c.backward_seconds += 2 * exchange;
      c.backward_input_seconds += 2 * exchange;
      total += counts + 4 * exchange;
    }
    if (k + 1 == profile.microbatch_sizes.size()) per_microbatch = total;
  }
  return per_microbatch;
}

// [4] cp > 1: each decoder layer's ring passes or Ulysses all-to-alls (the header's sizes),
// added to its forward and backward; returns one micro-batch's at the largest measured size.
double add_context_parallel_passes(pp::ModelProfile& profile, const models::LlamaConfig& config,
                                   const pp::TransferModel& group, int cp, bool ulysses, int tp,
                                   int64_t seq, Precision precision) {
  double per_microbatch = 0;
  const int64_t layers = profile.num_layers();
  for (size_t k = 0; k < profile.microbatch_sizes.size(); ++k) {
    // One tensor of a rank's tokens at its (tp rank's) query heads.
    const int64_t block = profile.microbatch_sizes[k] * (seq / cp) *
                          (config.num_attention_heads / tp) * config.head_dim *
                          element_bytes(precision);
    double forward = 0, backward = 0;
    if (ulysses) {
      const double exchange = gather_seconds(group, block * (cp - 1) / cp);
      forward = backward = 4 * exchange;
    } else {
      forward = (cp - 1) * gather_seconds(group, 2 * block);  // k, v
      backward = cp * gather_seconds(group, 4 * block);       // k, v, dk, dv
    }
    double total = 0;
    for (int64_t l = 1; l < layers - 2; ++l) {  // the decoder layers
      pp::LayerCost& c = profile.layers.at(static_cast<size_t>(l)).costs.at(k);
      c.forward_seconds += forward;
      c.backward_seconds += backward;
      c.backward_input_seconds += backward;
      total += forward + backward;
    }
    if (k + 1 == profile.microbatch_sizes.size()) per_microbatch = total;
  }
  return per_microbatch;
}

}  // namespace

std::function<void(pp::ModelProfile&, const pp::TransferModel&)> llama_tensor_parallel_collectives(
    const models::LlamaConfig& config, int64_t seq, bool sequence_parallel, Precision precision) {
  const int64_t hidden = config.hidden_size;
  return [=](pp::ModelProfile& profile, const pp::TransferModel& allreduce) {
    add_tensor_parallel_collectives(profile, sequence_parallel, allreduce, seq, hidden, precision);
  };
}

namespace {

// [2] latency + bytes / rate for a group of `size` processes, measured unless given.
pp::TransferModel allreduce_of(const WorldPlanRequest& r, std::map<int, pp::TransferModel>& known,
                               int size, int64_t large) {
  if (size <= 1) return pp::TransferModel{0, std::numeric_limits<double>::infinity(), 0, "none"};
  auto it = known.find(size);
  if (it != known.end()) return it->second;
  if (r.rank_arguments.empty()) {
    throw BadInput("plan_world: measuring an all-reduce over " + std::to_string(size) +
                   " processes needs rank_arguments (how to start this program as a rank)");
  }
  progress(r, "plan: measuring an all-reduce over " + std::to_string(size) + " processes ...");
  std::vector<std::string> arguments = r.rank_arguments;
  arguments.push_back(allreduce_job(large).dump());
  const CollectedRun run = launch_self_collecting(size, arguments, kModelPlanRankPrefix);
  if (run.launched.exit_code != 0 || run.results.empty() || !run.results[0]) {
    throw std::runtime_error("plan --world: the all-reduce measurement over " +
                             std::to_string(size) + " processes failed (rank " +
                             std::to_string(run.launched.first_failed_rank) + " exited with " +
                             std::to_string(run.launched.exit_code) + ")");
  }
  const pp::TransferModel model =
      allreduce_model_from(nlohmann::json::parse(*run.results[0]), size);
  known[size] = model;
  return model;
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f ms", seconds * 1e3);
  return text;
}

}  // namespace

std::string WorldLayout::name() const {
  return "pp" + std::to_string(pp) + " x tp" + std::to_string(tp) + " x dp" + std::to_string(dp) +
         (ep > 1 ? " x ep" + std::to_string(ep) : "") +
         (cp > 1 ? " x cp" + std::to_string(cp) : "") + (sequence_parallel ? " sp" : "");
}

nlohmann::json allreduce_job(int64_t large_bytes) {
  return {{"mode", "allreduce"},
          {"bytes", {4096, std::max<int64_t>(large_bytes, 4 << 20)}},
          {"trips", 20}};
}

pp::TransferModel allreduce_model_from(const nlohmann::json& result, int group_size) {
  const auto& sizes = result.at("sizes");
  const double small = sizes[0].at("seconds").get<double>();
  const double large = sizes[1].at("seconds").get<double>();
  const auto extra_bytes = static_cast<double>(sizes[1].at("bytes").get<int64_t>() -
                                               sizes[0].at("bytes").get<int64_t>());
  pp::TransferModel model;
  model.latency_seconds = small;
  // A large message no slower than the small one (noise on a loaded machine): its whole time
  // counts as bandwidth, an upper bound of its cost.
  model.bytes_per_second = large > 1.2 * small
                               ? extra_bytes / (large - small)
                               : static_cast<double>(sizes[1].at("bytes").get<int64_t>()) / large;
  model.method = "all-reduce over " + std::to_string(group_size) +
                 " processes, Gloo on this machine (median of " +
                 std::to_string(result.value("trips", 0)) + ")";
  return model;
}

WorldPlanResult plan_world(const WorldPlanRequest& r) {
  if (r.sample.dim() != 2 || r.sample.scalar_type() != torch::kInt64) {
    throw BadInput("plan --world: the sample must be int64 token ids [B, T]");
  }
  PIPETRAIN_CHECK_INPUT(r.world >= 1, "--world must be >= 1 (got ", r.world, ")");
  const std::vector<Shape> shapes = layouts_of(r);  // [1]
  if (shapes.empty()) {
    std::ostringstream tps;
    for (int tp : valid_tp(r.config, r.world)) tps << (tps.tellp() > 0 ? ", " : "") << tp;
    throw BadInput("--world " + std::to_string(r.world) +
                   " has no pp x tp x dp layout for this model and batch: tp must divide the " +
                   "world and the heads, key/value heads, vocabulary and MLP width (" +
                   (tps.tellp() > 0 ? "here " + tps.str() : std::string("none does")) +
                   "), dp the batch of " + std::to_string(r.sample.size(0)) +
                   (r.planner.zero > 0 ? " (and be >= 2 under ZeRO)" : "") + ", pp at most " +
                   std::to_string(r.config.entries()) + " entries");
  }
  WorldPlanResult result;
  result.allreduce = r.allreduce;
  const int64_t seq = r.sample.size(1);
  const int64_t hidden = r.config.hidden_size;
  const int64_t largest_message = r.sample.size(0) * seq * hidden * element_bytes(r.precision);
  for (const Shape& s : shapes) {
    WorldLayout layout;
    layout.pp = s.pp;
    layout.tp = s.tp;
    layout.dp = s.dp;
    layout.sequence_parallel = s.sp;
    layout.ep = s.ep;
    layout.cp = s.cp;
    progress(r, "plan: " + layout.name() + " ...");
    // [3] A context-parallel rank's tokens of each of its replica's rows.
    const torch::Tensor rows =
        r.sample.narrow(0, 0, r.sample.size(0) / s.dp).narrow(1, 0, seq / s.cp);
    const parallel::ContextParallel cp{s.cp > 1 ? C10dGroup::mirror(s.cp) : nullptr, r.ulysses};
    const parallel::TensorParallel tp{s.tp > 1 ? C10dGroup::mirror(s.tp) : nullptr, s.sp};
    // A mixture at ep > 1: the layer as one expert-parallel rank holds it, its experts fed as
    // identical members would feed them (the mirror's all-to-all): balanced routing.
    const parallel::ExpertParallel ep{s.ep > 1 ? C10dGroup::mirror(s.ep) : nullptr, nullptr};
    pp::ModelProfile profile = models::profile_llama(r.config, rows,
                                                     pp::ProfileOptions()
                                                         .precision(r.precision)
                                                         .repeats(r.profile_repeats)
                                                         .warmup(r.profile_warmup),
                                                     0, tp, 0, 0, ep, cp);
    if (s.ep > 1 && r.routing_imbalance > 1.0) {
      models::apply_routing_imbalance(
          profile, r.config, seq / (s.sp ? s.tp : 1), s.ep,
          std::min(r.routing_imbalance,
                   parallel::routing_imbalance_bound(r.config.num_experts,
                                                     r.config.num_experts_per_tok, s.ep)),
          r.precision);
    }
    // [2] [4]
    const pp::TransferModel tp_reduce = allreduce_of(r, result.allreduce, s.tp, largest_message);
    std::vector<std::vector<double>> added;
    if (s.tp > 1) {
      added = add_tensor_parallel_collectives(profile, s.sp, tp_reduce, seq / s.cp, hidden,
                                              r.precision);
    }
    if (s.cp > 1) {
      const pp::TransferModel cp_model = allreduce_of(r, result.allreduce, s.cp, largest_message);
      layout.cp_seconds = add_context_parallel_passes(profile, r.config, cp_model, s.cp, r.ulysses,
                                                      s.tp, seq, r.precision);
    }
    if (s.ep > 1) {
      const pp::TransferModel ep_model = allreduce_of(r, result.allreduce, s.ep, largest_message);
      layout.ep_all_to_all_seconds =
          add_expert_all_to_alls(profile, r.config, ep_model, s.ep, seq, r.precision);
    }
    // [5]
    pp::PlannerOptions planner = r.planner;
    planner.ranks = s.pp;
    planner.data_parallel = s.dp * s.cp;  // ZeRO shards over both
    planner.expert_parallel = s.ep;
    planner.processes = r.world > 1;
    planner.top = 1;
    // ZeRO-3 under bf16 gathers the projections' weights narrowed (the trainer's default policy).
    planner.cast_gathers =
        train::gathers_narrowed(train::ZeroOptions().stage(planner.zero), r.precision);
    const pp::PlanReport report = pp::plan_pipeline(profile, planner);
    layout.found = report.found();
    layout.plan = report.found() ? report.recommended() : report.smallest_fitting_plan;
    layout.smallest_fitting_limit = report.smallest_fitting_limit;
    layout.pipeline_seconds = layout.plan.predicted_step_seconds;
    layout.peak_memory_bytes = layout.plan.peak_memory_bytes;
    const std::vector<pp::RankMemory> memory = layout.plan.balance.empty()
                                                   ? std::vector<pp::RankMemory>{}
                                                   : pp::plan_memory(profile, layout.plan, planner);
    for (const pp::RankMemory& rank : memory) {
      layout.model_state_bytes = std::max(layout.model_state_bytes,
                                          rank.parameters + rank.gradients + rank.optimizer_state);
    }
    if (!added.empty() && !layout.plan.balance.empty()) {
      // The collectives of the busiest stage's layers over the step's micro-batches.
      const auto size = std::find(profile.microbatch_sizes.begin(), profile.microbatch_sizes.end(),
                                  layout.plan.microbatch_size);
      const size_t k = static_cast<size_t>(size - profile.microbatch_sizes.begin());
      double busiest = 0;
      int64_t first = 0;
      for (int count : layout.plan.balance) {
        double stage = 0;
        for (int64_t l = first; l < first + count && k < added.size(); ++l) {
          stage += added[k][static_cast<size_t>(l)];
        }
        busiest = std::max(busiest, stage);
        first += count;
      }
      layout.tp_collective_seconds = busiest * layout.plan.microbatches;
    }
    // [6]
    if (s.dp * s.cp > 1) {
      const pp::TransferModel dp_reduce =
          allreduce_of(r, result.allreduce, s.dp * s.cp, largest_message);
      int64_t parameters = 0;
      for (const pp::RankMemory& rank : memory) {
        parameters = std::max(parameters, rank.parameters);
      }
      // Expert parallelism: the busiest rank's experts are summed over the dp / ep replicas
      // holding them, the rest over dp.
      int64_t experts = 0;
      if (s.ep > 1 && !layout.plan.balance.empty()) {
        int64_t most = 0, first = 0;
        for (int count : layout.plan.balance) {
          int64_t moe = 0;
          for (int64_t e = first; e < first + count; ++e) {
            if (e >= 1 && e <= r.config.num_hidden_layers && r.config.is_moe_layer(e - 1)) ++moe;
          }
          most = std::max(most, moe);
          first += count;
        }
        experts = std::min(parameters, most * expert_parameter_bytes(r.config, s.ep));
      }
      layout.dp_reduce_seconds = dp_reduce.seconds(parameters - experts);
      if (experts > 0 && s.dp / s.ep > 1) {
        layout.dp_reduce_seconds +=
            allreduce_of(r, result.allreduce, s.dp / s.ep, largest_message).seconds(experts);
      }
    }
    layout.step_seconds = layout.pipeline_seconds + layout.dp_reduce_seconds;
    std::ostringstream why;
    if (layout.found) {
      why << layout.plan.describe() << "; pipeline " << seconds_text(layout.pipeline_seconds);
      if (s.tp > 1) why << " (tp collectives " << seconds_text(layout.tp_collective_seconds) << ")";
      if (s.ep > 1) {
        why << " (expert all-to-alls " << seconds_text(layout.ep_all_to_all_seconds)
            << " per micro-batch, every layer)";
      }
      if (s.cp > 1) {
        why << " (" << (r.ulysses ? "Ulysses all-to-alls " : "ring passes ")
            << seconds_text(layout.cp_seconds) << " per micro-batch, every layer)";
      }
      if (s.dp * s.cp > 1) why << " + dp reduce " << seconds_text(layout.dp_reduce_seconds);
      why << "; peak " << pp::format_bytes(layout.peak_memory_bytes) << " per rank";
    } else {
      why << "no plan fits " << pp::format_bytes(r.planner.memory_limit_bytes)
          << " per rank; the least any needs is "
          << pp::format_bytes(layout.smallest_fitting_limit);
    }
    layout.why = why.str();
    (layout.found ? result.ranked : result.rejected).push_back(layout);
  }
  std::stable_sort(
      result.ranked.begin(), result.ranked.end(),
      [](const WorldLayout& a, const WorldLayout& b) { return a.step_seconds < b.step_seconds; });
  std::stable_sort(result.rejected.begin(), result.rejected.end(),
                   [](const WorldLayout& a, const WorldLayout& b) {
                     return a.smallest_fitting_limit < b.smallest_fitting_limit;
                   });
  return result;
}

std::string world_plan_text(const WorldPlanRequest& r, const WorldPlanResult& result, int top) {
  std::ostringstream out;
  out << "plan --world " << r.world << ": " << to_string(r.config.architecture) << ", "
      << r.config.num_hidden_layers << " layers of " << r.config.hidden_size << ", batch "
      << r.sample.size(0) << " x " << r.sample.size(1) << " ids";
  if (r.planner.memory_limit_bytes > 0) {
    out << ", limit " << pp::format_bytes(r.planner.memory_limit_bytes) << " per rank";
  }
  out << "\n";
  for (const auto& [size, model] : result.allreduce) {
    char line[200];
    std::snprintf(line, sizeof line, "all-reduce over %d processes: %.0f us + %.2f GB/s (%s)\n",
                  size, model.latency_seconds * 1e6, model.bytes_per_second / 1e9,
                  model.method.c_str());
    out << line;
  }
  out << "\n";
  char header[200];
  std::snprintf(header, sizeof header, "%-4s %-22s %10s %12s  %s\n", "rank", "layout", "step",
                "peak/rank", "why");
  out << header;
  int shown = 0;
  for (const WorldLayout& layout : result.ranked) {
    if (shown++ >= top) break;
    char line[160];
    std::snprintf(line, sizeof line, "%-4d %-22s %10s %12s  ", shown, layout.name().c_str(),
                  seconds_text(layout.step_seconds).c_str(),
                  pp::format_bytes(layout.peak_memory_bytes).c_str());
    out << line << layout.why << "\n";
  }
  for (const WorldLayout& layout : result.rejected) {
    char line[160];
    std::snprintf(line, sizeof line, "%-4s %-22s %10s %12s  ", "-", layout.name().c_str(), "-",
                  pp::format_bytes(layout.smallest_fitting_limit).c_str());
    out << line << layout.why << "\n";
  }
  if (result.ranked.empty()) {
    out << "\nno layout fits the memory limit\n";
  } else {
    const WorldLayout& best = result.ranked.front();
    out << "\nrecommended: --nproc " << r.world << " --pp " << best.pp << " --tp " << best.tp
        << " --dp " << best.dp << (best.ep > 1 ? " --ep " + std::to_string(best.ep) : "")
        << (best.cp > 1
                ? " --cp " + std::to_string(best.cp) + (r.ulysses ? " --cp-method ulysses" : "")
                : "")
        << (best.sequence_parallel ? " --sequence-parallel" : "") << " --schedule "
        << best.plan.schedule << " --chunks " << best.plan.microbatches << " --checkpoint "
        << to_string(best.plan.checkpoint) << "\n";
  }
  return out.str();
}

nlohmann::json world_plan_json(const WorldPlanRequest& r, const WorldPlanResult& result) {
  auto layout_json = [](const WorldLayout& l) {
    nlohmann::json plan;
    pp::to_json(plan, l.plan);
    return nlohmann::json{{"pp", l.pp},
                          {"tp", l.tp},
                          {"dp", l.dp},
                          {"sequence_parallel", l.sequence_parallel},
                          {"ep", l.ep},
                          {"cp", l.cp},
                          {"cp_seconds", l.cp_seconds},
                          {"fits", l.found},
                          {"step_seconds", l.step_seconds},
                          {"pipeline_seconds", l.pipeline_seconds},
                          {"tp_collective_seconds", l.tp_collective_seconds},
                          {"dp_reduce_seconds", l.dp_reduce_seconds},
                          {"peak_memory_bytes", l.peak_memory_bytes},
                          {"model_state_bytes", l.model_state_bytes},
                          {"smallest_fitting_limit", l.smallest_fitting_limit},
                          {"why", l.why},
                          {"plan", plan}};
  };
  nlohmann::json out = {{"world", r.world},
                        {"memory_limit_bytes", r.planner.memory_limit_bytes},
                        {"ranked", nlohmann::json::array()},
                        {"rejected", nlohmann::json::array()},
                        {"allreduce", nlohmann::json::array()}};
  for (const auto& l : result.ranked) out["ranked"].push_back(layout_json(l));
  for (const auto& l : result.rejected) out["rejected"].push_back(layout_json(l));
  for (const auto& [size, model] : result.allreduce) {
    out["allreduce"].push_back({{"processes", size},
                                {"latency_seconds", model.latency_seconds},
                                {"bytes_per_second", model.bytes_per_second},
                                {"method", model.method}});
  }
  return out;
}

}  // namespace pipetrain::tune
