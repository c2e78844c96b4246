// The tokens each expert received, step by step (pipetrain/models/routing.h).
#include "pipetrain/models/routing.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "pipetrain/base/check.h"

namespace pipetrain::models {

void RoutingRecorder::set_enabled(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  enabled_ = on;
}

bool RoutingRecorder::enabled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return enabled_;
}

void RoutingRecorder::add(std::int64_t layer, const std::vector<std::int64_t>& counts) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::int64_t>& sum = open_[layer];
  if (sum.size() < counts.size()) sum.resize(counts.size(), 0);
  for (size_t e = 0; e < counts.size(); ++e) sum[e] += counts[e];
}

void RoutingRecorder::end_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  steps_.push_back(std::move(open_));
  open_.clear();
}

std::vector<RoutingRecorder::Counts> RoutingRecorder::steps() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return steps_;
}

RoutingRecorder::Counts RoutingRecorder::last_step() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return steps_.empty() ? Counts{} : steps_.back();
}

void RoutingRecorder::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  open_.clear();
  steps_.clear();
}

RoutingRecorder& routing_recorder() {
  static RoutingRecorder recorder;
  return recorder;
}

double routing_imbalance(const std::vector<std::int64_t>& counts) {
  if (counts.empty()) return 0;
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  if (total == 0) return 0;
  const double mean = static_cast<double>(total) / static_cast<double>(counts.size());
  return static_cast<double>(*std::max_element(counts.begin(), counts.end())) / mean;
}

std::vector<std::int64_t> flatten_routing(const std::vector<RoutingRecorder::Counts>& steps) {
  std::vector<std::int64_t> flat = {static_cast<std::int64_t>(steps.size())};
  for (const auto& step : steps) {
    flat.push_back(static_cast<std::int64_t>(step.size()));
    for (const auto& [layer, counts] : step) {
      flat.push_back(layer);
      flat.push_back(static_cast<std::int64_t>(counts.size()));
      flat.insert(flat.end(), counts.begin(), counts.end());
    }
  }
  return flat;
}

std::vector<RoutingRecorder::Counts> unflatten_routing(const std::vector<std::int64_t>& flat) {
  size_t at = 0;
  auto next = [&] {
    PIPETRAIN_CHECK_INPUT(at < flat.size(), "routing counts: ", flat.size(),
                          " values end before their structure does");
    return flat[at++];
  };
  std::vector<RoutingRecorder::Counts> steps(
      static_cast<size_t>(std::max<std::int64_t>(next(), 0)));
  for (auto& step : steps) {
    const std::int64_t layers = next();
    for (std::int64_t i = 0; i < layers; ++i) {
      const std::int64_t layer = next();
      const std::int64_t experts = next();
      std::vector<std::int64_t>& counts = step[layer];
      for (std::int64_t e = 0; e < experts; ++e) counts.push_back(next());
    }
  }
  return steps;
}

void merge_routing(std::vector<RoutingRecorder::Counts>& into,
                   const std::vector<RoutingRecorder::Counts>& more) {
  if (into.size() < more.size()) into.resize(more.size());
  for (size_t s = 0; s < more.size(); ++s) {
    for (const auto& [layer, counts] : more[s]) {
      std::vector<std::int64_t>& sum = into[s][layer];
      if (sum.size() < counts.size()) sum.resize(counts.size(), 0);
      for (size_t e = 0; e < counts.size(); ++e) sum[e] += counts[e];
    }
  }
}

std::string routing_report(const std::vector<RoutingRecorder::Counts>& steps, std::int64_t every) {
  char number[32];
  auto fixed = [&](double x) {
    std::snprintf(number, sizeof number, "%.3f", x);
    return std::string(number);
  };
  std::map<std::int64_t, std::vector<double>> by_layer;  // layer -> imbalance per step
  std::map<std::int64_t, std::vector<std::int64_t>> totals;
  for (const auto& step : steps) {
    for (const auto& [layer, counts] : step) {
      by_layer[layer].push_back(routing_imbalance(counts));
      std::vector<std::int64_t>& total = totals[layer];
      if (total.size() < counts.size()) total.resize(counts.size(), 0);
      for (size_t e = 0; e < counts.size(); ++e) total[e] += counts[e];
    }
  }
  std::string text =
      "routing: each MoE layer's busiest expert's tokens over the mean (1: balanced), over " +
      std::to_string(steps.size()) + " steps\n";
  for (const auto& [layer, values] : by_layer) {
    const auto worst = std::max_element(values.begin(), values.end());
    const double mean =
        std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
    text += "routing: layer " + std::to_string(layer) + ": mean " + fixed(mean) + ", worst " +
            fixed(*worst) + " (step " + std::to_string(worst - values.begin() + 1) + "), last " +
            fixed(values.back()) + "; tokens per expert over the run:";
    for (std::int64_t t : totals[layer]) text += " " + std::to_string(t);
    text += "\n";
  }
  const std::int64_t n = static_cast<std::int64_t>(steps.size());
  for (std::int64_t s = 0; s < n; ++s) {
    if (every > 0 && (s + 1) % every != 0 && s + 1 != n) continue;
    text += "routing: step " + std::to_string(s + 1) + ":";
    for (const auto& [layer, counts] : steps[static_cast<size_t>(s)]) {
      text += " layer " + std::to_string(layer) + " " + fixed(routing_imbalance(counts));
    }
    text += "\n";
  }
  return text;
}

}  // namespace pipetrain::models
