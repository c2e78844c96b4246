#include "pipetrain/tune/plan_report.h"

#include <cstdio>
#include <sstream>

#include "pipetrain/base/check.h"
#include "pipetrain/base/format_text.h"
#include "pipetrain/tune/calibration.h"

namespace pipetrain::tune {
namespace {

namespace pp = pipetrain::partition;

std::string join_ints(const std::vector<int>& values) {
  std::string text;
  for (std::size_t j = 0; j < values.size(); ++j)
    text += (j ? "," : "") + std::to_string(values[j]);
  return text;
}

// ", as processes x1.05 at micro-batch 8 .. x0.92 at 128" (empty when not measured).
std::string process_scale_text(const pp::ModelProfile& profile) {
  std::string text;
  for (const auto& [size, scale] : profile.process_compute_scale) {
    text += (text.empty() ? ", as processes " : " .. ") + format_text("x%.2f", scale) +
            " at micro-batch " + std::to_string(size);
  }
  // Runs of equal layer scales: "; layers x0.89 (13), x1.24 (12)".
  const auto& layers = profile.process_layer_scale;
  for (std::size_t a = 0, e = 0; a < layers.size(); a = e) {
    while (e < layers.size() && layers[e] == layers[a]) ++e;
    text += (a ? ", " : "; layers ") + format_text("x%.2f", layers[a]) + " (" +
            std::to_string(e - a) + ")";
  }
  return text;
}

}  // namespace

std::string profile_text(const pp::ModelProfile& profile, std::int64_t microbatch_size) {
  std::ostringstream out;
  out << "profile: " << profile.num_layers() << " layers, batch " << profile.batch_size
      << ", micro-batch sizes measured:";
  for (auto b : profile.microbatch_sizes) out << ' ' << b;
  out << "\n  runtime overhead per layer call: "
      << (profile.calibrated
              ? format_text("%.1f us (calibrated)", profile.per_layer_overhead_seconds * 1e6) +
                    ", split backward x" + format_text("%.2f", profile.split_backward_scale) +
                    ", compute x" + format_text("%.2f", profile.concurrent_compute_scale) +
                    " with " + std::to_string(profile.concurrent_ranks) + " ranks at once" +
                    process_scale_text(profile)
              : std::string("not calibrated (--calibrate)"));
  out << "\n  " << profile.intra_op_threads << " intra-op thread(s) per stage; activations by "
      << profile.method << "; transfer "
      << format_text("%.1f", profile.transfer.latency_seconds * 1e6) << " us + "
      << format_text("%.1f", profile.transfer.message_seconds * 1e6) << " us of the sender's time ("
      << profile.transfer.method << ")";
  if (profile.step_overhead_seconds > 0) {
    out << "; " << format_text("%.2f", profile.step_overhead_seconds * 1e3)
        << " ms per step outside the schedule";
  }
  out << "\n";
  out << "  per layer at micro-batch " << microbatch_size << ":\n";
  char line[200];
  std::snprintf(line, sizeof line, "  %-22s %11s %9s %9s %9s %9s %11s\n", "layer", "params", "F ms",
                "B ms", "I ms", "W ms", "activations");
  out << line;
  for (std::int64_t l = 0; l < profile.num_layers(); ++l) {
    const pp::LayerCost c = profile.layer_cost(l, microbatch_size);
    std::snprintf(line, sizeof line, "  %-22.22s %11s %9.3f %9.3f %9.3f %9.3f %11s\n",
                  profile.layers[l].name.c_str(),
                  pp::format_bytes(profile.layers[l].parameter_bytes).c_str(),
                  c.forward_seconds * 1e3, c.backward_seconds * 1e3, c.backward_input_seconds * 1e3,
                  c.backward_weight_seconds * 1e3, pp::format_bytes(c.activation_bytes).c_str());
    out << line;
  }
  return out.str();
}

std::string plan_table_text(const pp::PlanReport& report) {
  const std::vector<pp::Plan>& plans = report.ranked;
  std::ostringstream out;
  char line[300];
  std::snprintf(line, sizeof line, "  %2s  %-16s %2s %4s %-12s %10s %7s %14s  %s\n", "#",
                "schedule", "V", "M", "checkpoint", "step ms", "bubble", "peak mem/rank",
                "balance");
  out << line;
  for (std::size_t k = 0; k < plans.size(); ++k) {
    const pp::Plan& p = plans[k];
    std::snprintf(line, sizeof line, "%s%2zu  %-16s %2d %4d %-12s %10.3f %7.3f %14s  %s%s\n",
                  k == report.recommended_index ? " *" : "  ", k + 1, p.schedule.c_str(),
                  p.virtual_stages, p.microbatches, to_string(p.checkpoint).c_str(),
                  p.predicted_step_seconds * 1e3, p.bubble_fraction,
                  pp::format_bytes(p.peak_memory_bytes).c_str(), join_ints(p.balance).c_str(),
                  p.balanced_for_memory ? " (balanced for memory)" : "");
    out << line;
  }
  return out.str();
}

std::string recommendation_text(const pp::PlanReport& report, const pp::ModelProfile& profile) {
  const pp::Plan& best = report.recommended();
  std::ostringstream out;
  if (!report.measured.empty()) {
    out << "\nmeasured (step [5]: these plans run together, in turn step by step, "
        << kMeasuredRounds << " rounds; the default stays unless a plan took under "
        << format_text("%.2f", 1 - kKeepDefaultMargin)
        << " of its time in the same turns; every prediction is scaled by x"
        << format_text("%.3f", profile.measured_step_scale)
        << " (the median of measured / predicted before it):\n";
    for (const pp::MeasuredPlan& measured : report.measured) {
      char line[240];
      std::snprintf(line, sizeof line, "  %-44.44s predicted %9.3f ms, measured %9.3f ms%s\n",
                    measured.plan.describe().c_str(), measured.plan.predicted_step_seconds * 1e3,
                    measured.measured_step_seconds * 1e3,
                    pp::same_plan(measured.plan, best) ? "  <- recommended" : "");
      out << line;
    }
  }
  out << "\nrecommended" << (report.measured.empty() ? "" : " (* above, by measurement)") << ": "
      << best.describe() << "\n  predicted "
      << format_text("%.3f", best.predicted_step_seconds * 1e3) << " ms/step, peak "
      << pp::format_bytes(best.peak_memory_bytes) << " per rank\n";
  return out.str();
}

std::string default_plan_text(const pp::Plan& fallback, int chunks) {
  return "default (1f1b, " + std::to_string(chunks) + " chunks, even balance " +
         join_ints(fallback.balance) + "): predicted " +
         format_text("%.3f", fallback.predicted_step_seconds * 1e3) + " ms/step, peak " +
         pp::format_bytes(fallback.peak_memory_bytes) + (fallback.fits ? "" : " (over the limit)") +
         "\n";
}

std::string rank_memory_text(const std::vector<pp::RankMemory>& ranks) {
  // ZeRO-3's gathered parameters and its gathers' receive buffers get a column where some rank
  // gathers any, the gradient sum's buffers where some rank has replicas or ZeRO, ZeRO 2/3's full
  // gradients during the step where some rank has them, and host memory (the offloaded category,
  // not in the total) one where some rank puts anything there.
  bool gathers = false, reduces = false, steps = false, offloads = false;
  for (const pp::RankMemory& m : ranks) {
    gathers = gathers || m.gathered > 0 || m.gather_buffers > 0;
    reduces = reduces || m.reduce_buffers > 0;
    steps = steps || m.step_gradients > 0;
    offloads = offloads || m.offloaded > 0;
  }
  std::ostringstream out;
  char line[400];
  std::snprintf(line, sizeof line, "  %4s %12s %12s %16s %12s %12s %12s%s%s%s%s %12s%s\n", "rank",
                "parameters", "gradients", "optimizer state", "activations", "receive buf",
                "send buf", gathers ? "     gathered" : "", gathers ? "   gather buf" : "",
                reduces ? "   reduce buf" : "", steps ? "   step grads" : "", "total",
                offloads ? "  host memory" : "");
  out << line;
  auto column = [](bool shown, std::int64_t bytes) {
    char text[32] = "";
    if (shown) std::snprintf(text, sizeof text, " %12s", pp::format_bytes(bytes).c_str());
    return std::string(text);
  };
  for (std::size_t k = 0; k < ranks.size(); ++k) {
    const pp::RankMemory& m = ranks[k];
    std::snprintf(
        line, sizeof line, "  %4zu %12s %12s %16s %12s %12s %12s%s%s%s%s %12s%s\n", k,
        pp::format_bytes(m.parameters).c_str(), pp::format_bytes(m.gradients).c_str(),
        pp::format_bytes(m.optimizer_state).c_str(), pp::format_bytes(m.activations).c_str(),
        pp::format_bytes(m.receive_buffers).c_str(), pp::format_bytes(m.send_buffers).c_str(),
        column(gathers, m.gathered).c_str(), column(gathers, m.gather_buffers).c_str(),
        column(reduces, m.reduce_buffers).c_str(), column(steps, m.step_gradients).c_str(),
        pp::format_bytes(m.total()).c_str(), column(offloads, m.offloaded).c_str());
    out << line;
  }
  return out.str();
}

std::vector<std::vector<pp::RankMemory>> memory_by_zero_stage(const pp::ModelProfile& profile,
                                                              const pp::Plan& plan,
                                                              pp::PlannerOptions options) {
  std::vector<std::vector<pp::RankMemory>> stages;
  for (int zero = 0; zero <= 3; ++zero) {
    options.zero = zero;
    options.reshard_after_forward = options.reshard_after_forward && zero == 3;
    stages.push_back(pp::plan_memory(profile, plan, options));
  }
  return stages;
}

std::string zero_stages_text(const std::vector<std::vector<pp::RankMemory>>& stages, int dp) {
  std::ostringstream out;
  out << "the same plan at each ZeRO stage over dp " << dp
      << " (each rank's total; in brackets its parameters, gradients and optimizer state per "
         "parameter: float32 Adam 16, 4 + 4 + 8/dp, 4 + 12/dp, 16/dp):\n";
  char line[200];
  std::snprintf(line, sizeof line, "  %4s %22s %22s %22s %22s\n", "rank", "zero 0", "zero 1",
                "zero 2", "zero 3");
  out << line;
  for (std::size_t r = 0; r < stages.front().size(); ++r) {
    // Bytes per parameter: of the rank's float32 parameters at ZeRO 0.
    const double parameters = static_cast<double>(stages.front()[r].parameters) / 4;
    std::string cells;
    for (const auto& ranks : stages) {
      const pp::RankMemory& m = ranks[r];
      char cell[40];
      std::snprintf(
          cell, sizeof cell, " %13s (%5.2f)", pp::format_bytes(m.total()).c_str(),
          parameters > 0
              ? static_cast<double>(m.parameters + m.gradients + m.optimizer_state) / parameters
              : 0.0);
      cells += cell;
    }
    std::snprintf(line, sizeof line, "  %4zu%s\n", r, cells.c_str());
    out << line;
  }
  return out.str();
}

nlohmann::json rank_memory_json(const std::vector<pp::RankMemory>& ranks) {
  nlohmann::json out = nlohmann::json::array();
  for (const pp::RankMemory& m : ranks) {
    out.push_back({{"parameters", m.parameters},
                   {"gradients", m.gradients},
                   {"optimizer_state", m.optimizer_state},
                   {"activations", m.activations},
                   {"receive_buffers", m.receive_buffers},
                   {"send_buffers", m.send_buffers},
                   {"gathered", m.gathered},
                   {"reduce_buffers", m.reduce_buffers},
                   {"step_gradients", m.step_gradients},
                   {"gather_buffers", m.gather_buffers},
                   {"offloaded", m.offloaded},
                   {"checkpoint_snapshot", m.checkpoint_snapshot},
                   {"total", m.total()}});
  }
  return out;
}

std::string verification_text(const Verification& v, const std::vector<std::string>& names) {
  PIPETRAIN_CHECK_INPUT(names.size() >= v.plans.size(), "verification_text: ", v.plans.size(),
                        " plans but ", names.size(), " names");
  std::ostringstream text;
  char line[200];
  std::snprintf(line, sizeof line, "  %-12s %-44s %10s %10s %9s\n", "plan", "", "predicted",
                "measured", "meas/pred");
  text << line;
  for (std::size_t k = 0; k < v.plans.size(); ++k) {
    const PlanVerification& m = v.plans[k];
    const pp::Plan& plan = m.plan;
    std::string by_rank, predicted_by_rank;
    for (std::size_t rank = 0; rank < m.compute_seconds_by_rank.size(); ++rank) {
      by_rank += (rank ? " / " : "") + format_text("%.3f", m.compute_seconds_by_rank[rank] * 1e3);
      if (rank < plan.busy_seconds_per_rank.size()) {
        predicted_by_rank +=
            (rank ? " / " : "") + format_text("%.3f", plan.busy_seconds_per_rank[rank] * 1e3);
      }
    }
    std::snprintf(line, sizeof line, "  %-12s %-44.44s %8.3fms %8.3fms %9.3f\n", names[k].c_str(),
                  plan.describe().c_str(), plan.predicted_step_seconds * 1e3, m.step_seconds * 1e3,
                  m.step_seconds / plan.predicted_step_seconds);
    text << line;
    // Where a gap comes from: compute slower than profiled, or time between actions.
    std::snprintf(line, sizeof line,
                  "  %-12s compute per rank %.3f ms (predicted %.3f), train_step span %.3f ms "
                  "(predicted %.3f)\n",
                  "", m.compute_seconds_per_rank * 1e3,
                  plan.makespan_seconds * (1 - plan.bubble_fraction) * 1e3, m.span_seconds * 1e3,
                  plan.makespan_seconds * 1e3);
    text << line;
    text << "  " << std::string(12, ' ') << " compute by rank " << by_rank << " ms (predicted "
         << predicted_by_rank << ")\n";
  }
  text << "  measured " << names[0] << " / " << (names.size() > 1 ? names[1] : names[0])
       << " (median of the ratios of steps run in turn): "
       << format_text("%.3f", v.first_over_second) << "\n";
  return text.str();
}

nlohmann::json verification_json(const Verification& v, const std::vector<std::string>& names) {
  PIPETRAIN_CHECK_INPUT(names.size() >= v.plans.size(), "verification_json: ", v.plans.size(),
                        " plans but ", names.size(), " names");
  nlohmann::json plans = nlohmann::json::array();
  for (std::size_t k = 0; k < v.plans.size(); ++k) {
    const PlanVerification& m = v.plans[k];
    plans.push_back({{"plan", names[k]},
                     {"measured_compute_seconds_per_rank", m.compute_seconds_per_rank},
                     {"measured_compute_seconds_by_rank", m.compute_seconds_by_rank},
                     {"measured_span_seconds", m.span_seconds},
                     {"describe", m.plan.describe()},
                     {"predicted_step_seconds", m.plan.predicted_step_seconds},
                     {"measured_step_seconds", m.step_seconds},
                     {"measured_step_seconds_per_round", m.round_step_seconds},
                     {"measured_step_seconds_each", m.each_step_seconds},
                     {"measured_over_predicted", m.step_seconds / m.plan.predicted_step_seconds},
                     {"measured_peak_stashed_bytes_per_stage", m.peak_stashed_bytes}});
  }
  return plans;
}

}  // namespace pipetrain::tune
