// RoutingRecorder: the tokens each expert of each MoE layer received, step by step, in this
// process (what `pipetrain train --report-routing` prints, summed over the ranks).
//
// LlamaMoe adds its counts on every training forward while recording is on (recomputes are not
// counted: a checkpointed micro-batch's tokens count once); the trainer's loop closes each step
// with end_step(). A layer is numbered as transformers numbers it (model.layers.{l}).
//
// The imbalance of a layer in a step is its busiest expert's tokens over the mean (1: every
// expert as loaded as the others; E: one expert took every choice). Dropless routing (every token
// reaches its experts) bounds it by nothing but the router, which is why it is reported.
//
// Thread-safety: add() may be called from any thread (the in-process pipeline's ranks); the rest
// from the thread that runs the steps, between them.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace pipetrain::models {

class RoutingRecorder {
 public:
  using Counts = std::map<std::int64_t, std::vector<std::int64_t>>;  // layer -> per expert

  void set_enabled(bool on);
  bool enabled() const;
  // Adds `counts` (one per expert) to layer `layer` of the open step.
  void add(std::int64_t layer, const std::vector<std::int64_t>& counts);
  // Closes the open step (an empty one too).
  void end_step();
  // The closed steps, oldest first, and forgets nothing.
  std::vector<Counts> steps() const;
  // The last closed step's ({} before the first).
  Counts last_step() const;
  void clear();

 private:
  mutable std::mutex mutex_;
  bool enabled_ = false;
  Counts open_;
  std::vector<Counts> steps_;
};

// The process's recorder.
RoutingRecorder& routing_recorder();

// A layer's imbalance: max over mean of `counts` (0 where no token was routed).
double routing_imbalance(const std::vector<std::int64_t>& counts);

// Flattens steps into int64s and back (to sum them over ranks): each step, its layers, their
// counts. merge_routing adds `more` into `into` step by step (the longer list wins the length).
std::vector<std::int64_t> flatten_routing(const std::vector<RoutingRecorder::Counts>& steps);
std::vector<RoutingRecorder::Counts> unflatten_routing(const std::vector<std::int64_t>& flat);
void merge_routing(std::vector<RoutingRecorder::Counts>& into,
                   const std::vector<RoutingRecorder::Counts>& more);

// What --report-routing prints: per layer its imbalance's mean over the steps, its worst (and
// when), its last, and its experts' tokens over the run; then the imbalance of every layer at
// every `every`-th step (numbered from 1) and at the last. Lines start with "routing: ".
std::string routing_report(const std::vector<RoutingRecorder::Counts>& steps, std::int64_t every);

}  // namespace pipetrain::models
