// ModelProfile: interpolation between measured micro-batch sizes, JSON form, synthetic profiles.
// (The "_solver" suffix puts this torch-free file in the pipetrain_schedule library, next to the
// planner that reads it; see CMakeLists.txt.)
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "pipetrain/base/error.h"
#include "pipetrain/partition/profile.h"

namespace pipetrain::partition {
namespace {

// Index p such that sizes[p] <= b <= sizes[p+1], clamped to the first/last segment.
std::size_t segment_of(const std::vector<std::int64_t>& sizes, std::int64_t b) {
  if (sizes.size() < 2) return 0;
  auto it = std::upper_bound(sizes.begin(), sizes.end(), b);
  std::size_t p = it == sizes.begin() ? 0 : static_cast<std::size_t>(it - sizes.begin()) - 1;
  return std::min(p, sizes.size() - 2);
}

double lerp(double x0, double y0, double x1, double y1, double x) {
  if (x1 == x0) return y0;
  return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
}

// Bytes, piecewise-linear like the times (exact at the measured sizes), rounded, >= 0. With one
// measured size, proportional to the size.
std::int64_t interpolate_bytes(const std::vector<std::int64_t>& sizes, std::int64_t b,
                               const std::vector<std::int64_t>& bytes_at) {
  if (sizes.size() == 1) {
    return static_cast<std::int64_t>(std::llround(
        static_cast<double>(bytes_at[0]) * static_cast<double>(b) / static_cast<double>(sizes[0])));
  }
  const std::size_t p = segment_of(sizes, b);
  const double y = lerp(static_cast<double>(sizes[p]), static_cast<double>(bytes_at[p]),
                        static_cast<double>(sizes[p + 1]), static_cast<double>(bytes_at[p + 1]),
                        static_cast<double>(b));
  return std::max<std::int64_t>(0, static_cast<std::int64_t>(std::llround(y)));
}

}  // namespace

double TransferModel::seconds(std::int64_t bytes) const {
  double time = latency_seconds;
  if (std::isfinite(bytes_per_second) && bytes_per_second > 0) {
    time += static_cast<double>(bytes) / bytes_per_second;
  }
  return time;
}

LayerCost ModelProfile::layer_cost(std::int64_t l, std::int64_t b) const {
  const auto& costs = layers.at(static_cast<std::size_t>(l)).costs;
  const std::size_t p = segment_of(microbatch_sizes, b);
  if (microbatch_sizes.size() == 1) {
    // One measurement: assume time proportional to the size.
    const double scale = static_cast<double>(b) / static_cast<double>(microbatch_sizes[0]);
    LayerCost c = costs[0];
    c.forward_seconds *= scale;
    c.backward_seconds *= scale;
    c.backward_input_seconds *= scale;
    c.backward_weight_seconds *= scale;
    c.activation_bytes = static_cast<std::int64_t>(std::llround(c.activation_bytes * scale));
    c.split_activation_bytes =
        static_cast<std::int64_t>(std::llround(c.split_activation_bytes * scale));
    c.split_first_activation_bytes =
        static_cast<std::int64_t>(std::llround(c.split_first_activation_bytes * scale));
    c.output_bytes = static_cast<std::int64_t>(std::llround(c.output_bytes * scale));
    return c;
  }
  const double x0 = static_cast<double>(microbatch_sizes[p]);
  const double x1 = static_cast<double>(microbatch_sizes[p + 1]);
  const double x = static_cast<double>(b);
  const LayerCost& c0 = costs[p];
  const LayerCost& c1 = costs[p + 1];
  auto time = [&](double LayerCost::*field) {
    return std::max(0.0, lerp(x0, c0.*field, x1, c1.*field, x));
  };
  LayerCost c;
  c.forward_seconds = time(&LayerCost::forward_seconds);
  c.backward_seconds = time(&LayerCost::backward_seconds);
  c.backward_input_seconds = time(&LayerCost::backward_input_seconds);
  c.backward_weight_seconds = time(&LayerCost::backward_weight_seconds);
  std::vector<std::int64_t> activation(costs.size()), split(costs.size()), first(costs.size()),
      output(costs.size());
  for (std::size_t q = 0; q < costs.size(); ++q) {
    activation[q] = costs[q].activation_bytes;
    split[q] = costs[q].split_activation_bytes;
    first[q] = costs[q].split_first_activation_bytes;
    output[q] = costs[q].output_bytes;
  }
  c.activation_bytes = interpolate_bytes(microbatch_sizes, b, activation);
  c.split_activation_bytes = interpolate_bytes(microbatch_sizes, b, split);
  c.split_first_activation_bytes = interpolate_bytes(microbatch_sizes, b, first);
  c.output_bytes = interpolate_bytes(microbatch_sizes, b, output);
  return c;
}

double ModelProfile::process_compute_scale_at(std::int64_t b) const {
  const auto& points = process_compute_scale;
  if (points.empty()) return 1;
  if (b <= points.front().first) return points.front().second;
  if (b >= points.back().first) return points.back().second;
  std::size_t p = 0;
  while (points[p + 1].first < b) ++p;
  const auto log_of = [](std::int64_t size) { return std::log(static_cast<double>(size)); };
  return lerp(log_of(points[p].first), points[p].second, log_of(points[p + 1].first),
              points[p + 1].second, log_of(b));
}

std::int64_t ModelProfile::input_bytes_at(std::int64_t b) const {
  return interpolate_bytes(microbatch_sizes, b, input_bytes);
}

std::int64_t ModelProfile::parameter_bytes() const {
  std::int64_t total = 0;
  for (const auto& layer : layers) total += layer.parameter_bytes;
  return total;
}

void ModelProfile::validate() const {
  if (microbatch_sizes.empty()) {
    throw BadInput("profile: no micro-batch sizes were measured; profile at least one");
  }
  for (std::size_t p = 0; p < microbatch_sizes.size(); ++p) {
    if (microbatch_sizes[p] < 1 || (p > 0 && microbatch_sizes[p] <= microbatch_sizes[p - 1])) {
      throw BadInput("profile: micro-batch sizes must be positive and ascending (size " +
                     std::to_string(microbatch_sizes[p]) + " at position " + std::to_string(p) +
                     ")");
    }
  }
  if (input_bytes.size() != microbatch_sizes.size()) {
    throw BadInput("profile: input_bytes has " + std::to_string(input_bytes.size()) +
                   " entries for " + std::to_string(microbatch_sizes.size()) +
                   " micro-batch sizes; give one per size");
  }
  if (layers.empty()) throw BadInput("profile: the model has no layers");
  if (!(step_overhead_seconds >= 0)) {
    throw BadInput("profile: step_overhead_seconds must be >= 0 (got " +
                   std::to_string(step_overhead_seconds) + ")");
  }
  if (!(measured_step_scale > 0) || measured_step_scale_ranks < 0) {
    throw BadInput("profile: measured_step_scale must be > 0 with ranks >= 0 (got " +
                   std::to_string(measured_step_scale) + " for " +
                   std::to_string(measured_step_scale_ranks) + " ranks)");
  }
  if (!(concurrent_compute_scale > 0)) {
    throw BadInput("profile: concurrent_compute_scale must be > 0 (got " +
                   std::to_string(concurrent_compute_scale) + ")");
  }
  for (std::size_t p = 0; p < process_compute_scale.size(); ++p) {
    const auto& [size, scale] = process_compute_scale[p];
    if (size < 1 || !(scale > 0) || (p > 0 && size <= process_compute_scale[p - 1].first)) {
      throw BadInput(
          "profile: process_compute_scale needs ascending positive sizes with scales > 0 (size " +
          std::to_string(size) + ", scale " + std::to_string(scale) + " at position " +
          std::to_string(p) + ")");
    }
  }
  if (!process_layer_scale.empty() && process_layer_scale.size() != layers.size()) {
    throw BadInput("profile: process_layer_scale has " +
                   std::to_string(process_layer_scale.size()) + " entries for " +
                   std::to_string(layers.size()) + " layers; give one per layer");
  }
  for (std::size_t l = 0; l < process_layer_scale.size(); ++l) {
    if (!(process_layer_scale[l] > 0)) {
      throw BadInput("profile: process_layer_scale of layer " + std::to_string(l) +
                     " must be > 0 (got " + std::to_string(process_layer_scale[l]) + ")");
    }
  }
  for (std::size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].costs.size() != microbatch_sizes.size()) {
      throw BadInput("profile: layer " + std::to_string(l) + " ('" + layers[l].name + "') has " +
                     std::to_string(layers[l].costs.size()) + " cost entries for " +
                     std::to_string(microbatch_sizes.size()) +
                     " micro-batch sizes; give one per size");
    }
  }
  if (batch_size < 1) {
    throw BadInput("profile: batch_size must be >= 1 (got " + std::to_string(batch_size) + ")");
  }
}

void to_json(nlohmann::json& out, const ModelProfile& profile) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& layer : profile.layers) {
    nlohmann::json costs = nlohmann::json::array();
    for (const auto& c : layer.costs) {
      costs.push_back({{"forward_seconds", c.forward_seconds},
                       {"backward_seconds", c.backward_seconds},
                       {"backward_input_seconds", c.backward_input_seconds},
                       {"backward_weight_seconds", c.backward_weight_seconds},
                       {"activation_bytes", c.activation_bytes},
                       {"split_activation_bytes", c.split_activation_bytes},
                       {"split_first_activation_bytes", c.split_first_activation_bytes},
                       {"output_bytes", c.output_bytes}});
    }
    layers.push_back({{"name", layer.name},
                      {"parameter_bytes", layer.parameter_bytes},
                      {"cast_parameter_bytes", layer.cast_parameter_bytes},
                      {"parameter_sizes", layer.parameter_sizes},
                      {"shared_parameters", layer.shared_parameters},
                      {"cast_parameters", layer.cast_parameters},
                      {"expert_parameters", layer.expert_parameters},
                      {"update_seconds", layer.update_seconds},
                      {"costs", costs}});
  }
  out = {{"batch_size", profile.batch_size},
         {"microbatch_sizes", profile.microbatch_sizes},
         {"input_bytes", profile.input_bytes},
         {"intra_op_threads", profile.intra_op_threads},
         {"per_layer_overhead_seconds", profile.per_layer_overhead_seconds},
         {"calibrated", profile.calibrated},
         {"split_backward_scale", profile.split_backward_scale},
         {"concurrent_compute_scale", profile.concurrent_compute_scale},
         {"concurrent_ranks", profile.concurrent_ranks},
         {"process_compute_scale", profile.process_compute_scale},
         {"process_layer_scale", profile.process_layer_scale},
         {"step_overhead_seconds", profile.step_overhead_seconds},
         {"measured_step_scale", profile.measured_step_scale},
         {"measured_step_scale_ranks", profile.measured_step_scale_ranks},
         {"method", profile.method},
         {"precision", profile.precision},
         {"transfer",
          {{"latency_seconds", profile.transfer.latency_seconds},
           // JSON has no infinity: 0 stands for "no bandwidth limit".
           {"bytes_per_second", std::isfinite(profile.transfer.bytes_per_second)
                                    ? profile.transfer.bytes_per_second
                                    : 0.0},
           {"message_seconds", profile.transfer.message_seconds},
           {"method", profile.transfer.method}}},
         {"layers", layers}};
}

void from_json(const nlohmann::json& in, ModelProfile& profile) {
  profile = ModelProfile{};
  profile.batch_size = in.at("batch_size").get<std::int64_t>();
  profile.microbatch_sizes = in.at("microbatch_sizes").get<std::vector<std::int64_t>>();
  profile.input_bytes = in.at("input_bytes").get<std::vector<std::int64_t>>();
  profile.intra_op_threads = in.value("intra_op_threads", 1);
  profile.per_layer_overhead_seconds = in.value("per_layer_overhead_seconds", 0.0);
  profile.calibrated = in.value("calibrated", profile.per_layer_overhead_seconds > 0);
  profile.split_backward_scale = in.value("split_backward_scale", 1.0);
  profile.concurrent_compute_scale = in.value("concurrent_compute_scale", 1.0);
  profile.concurrent_ranks = in.value("concurrent_ranks", 1);
  profile.step_overhead_seconds = in.value("step_overhead_seconds", 0.0);
  profile.measured_step_scale = in.value("measured_step_scale", 1.0);
  profile.measured_step_scale_ranks = in.value("measured_step_scale_ranks", 0);
  if (in.contains("process_compute_scale")) {
    profile.process_compute_scale =
        in.at("process_compute_scale").get<std::vector<std::pair<std::int64_t, double>>>();
  }
  if (in.contains("process_layer_scale")) {
    profile.process_layer_scale = in.at("process_layer_scale").get<std::vector<double>>();
  }
  profile.method = in.value("method", std::string());
  profile.precision = in.value("precision", std::string("fp32"));
  if (in.contains("transfer")) {
    const auto& t = in.at("transfer");
    profile.transfer.latency_seconds = t.value("latency_seconds", 0.0);
    const double bandwidth = t.value("bytes_per_second", 0.0);
    profile.transfer.bytes_per_second =
        bandwidth > 0 ? bandwidth : std::numeric_limits<double>::infinity();
    profile.transfer.method = t.value("method", std::string());
    profile.transfer.message_seconds = t.value("message_seconds", 0.0);
  }
  for (const auto& layer_json : in.at("layers")) {
    LayerProfile layer;
    layer.name = layer_json.value("name", std::string());
    layer.parameter_bytes = layer_json.value("parameter_bytes", std::int64_t{0});
    layer.cast_parameter_bytes = layer_json.value("cast_parameter_bytes", std::int64_t{0});
    layer.parameter_sizes = layer_json.value("parameter_sizes", std::vector<std::int64_t>{});
    layer.shared_parameters = layer_json.value("shared_parameters", std::vector<bool>{});
    layer.cast_parameters = layer_json.value("cast_parameters", std::vector<bool>{});
    layer.expert_parameters = layer_json.value("expert_parameters", std::vector<bool>{});
    if (layer.shared_parameters.size() != layer.parameter_sizes.size() ||
        layer.cast_parameters.size() != layer.parameter_sizes.size() ||
        (!layer.expert_parameters.empty() &&
         layer.expert_parameters.size() != layer.parameter_sizes.size())) {
      throw BadInput("profile: layer '" + layer.name + "' lists " +
                     std::to_string(layer.parameter_sizes.size()) + " parameter sizes, " +
                     std::to_string(layer.shared_parameters.size()) + " shared flags and " +
                     std::to_string(layer.cast_parameters.size()) + " cast flags");
    }
    layer.update_seconds = layer_json.value("update_seconds", 0.0);
    for (const auto& c : layer_json.at("costs")) {
      LayerCost cost;
      cost.forward_seconds = c.value("forward_seconds", 0.0);
      cost.backward_seconds = c.value("backward_seconds", 0.0);
      cost.backward_input_seconds = c.value("backward_input_seconds", 0.0);
      cost.backward_weight_seconds = c.value("backward_weight_seconds", 0.0);
      cost.activation_bytes = c.value("activation_bytes", std::int64_t{0});
      cost.split_activation_bytes = c.value("split_activation_bytes", cost.activation_bytes);
      cost.split_first_activation_bytes =
          c.value("split_first_activation_bytes", cost.split_activation_bytes);
      cost.output_bytes = c.value("output_bytes", std::int64_t{0});
      layer.costs.push_back(cost);
    }
    profile.layers.push_back(std::move(layer));
  }
  profile.validate();
}

ModelProfile uniform_profile(std::int64_t layers, std::int64_t batch_size,
                             const UniformLayer& spec) {
  if (layers < 1 || batch_size < 1) {
    throw BadInput("uniform_profile: layers and batch_size must be >= 1 (got " +
                   std::to_string(layers) + ", " + std::to_string(batch_size) + ")");
  }
  ModelProfile profile;
  profile.batch_size = batch_size;
  profile.method = "synthetic";
  profile.microbatch_sizes = {1, batch_size};
  if (batch_size == 1) profile.microbatch_sizes = {1};
  for (std::int64_t b : profile.microbatch_sizes) {
    profile.input_bytes.push_back(spec.output_bytes_per_sample * b);
  }
  for (std::int64_t l = 0; l < layers; ++l) {
    LayerProfile layer;
    layer.name = "layer" + std::to_string(l);
    layer.parameter_bytes = spec.parameter_bytes;
    for (std::int64_t b : profile.microbatch_sizes) {
      LayerCost c;
      c.forward_seconds = spec.forward_seconds_per_sample * static_cast<double>(b);
      c.backward_seconds = spec.backward_seconds_per_sample * static_cast<double>(b);
      c.backward_input_seconds = c.backward_seconds / 2;
      c.backward_weight_seconds = c.backward_seconds / 2;
      c.activation_bytes = spec.activation_bytes_per_sample * b;
      c.split_activation_bytes = c.activation_bytes;
      c.split_first_activation_bytes = c.activation_bytes;
      c.output_bytes = spec.output_bytes_per_sample * b;
      layer.costs.push_back(c);
    }
    profile.layers.push_back(std::move(layer));
  }
  return profile;
}

}  // namespace pipetrain::partition
