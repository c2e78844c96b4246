// A Hugging Face model for inference, shared by `pipetrain eval` and `pipetrain generate` (hf.cpp):
// DIR's weights, or a pipetrain checkpoint's, in eval mode, run through --stages pipeline ranks
// (a Pipe, forward only) on --device.
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "pipetrain/runtime/pipe.h"
#include "train_setup.h"

namespace pipetrain::cli {

struct InferenceArgs {
  std::string checkpoint;  // a pipetrain checkpoint to take the weights from ("" : DIR's)
  int64_t stages = 1;
  std::string device = "cpu";
};

// Adds --checkpoint, --stages, --device.
void add_inference_flags(CLI::App& command, InferenceArgs& args);

class InferenceModel {
 public:
  // Throws UsageError naming the flag for a model, checkpoint or device that does not fit.
  InferenceModel(const ModelDataArgs& spec, const BuiltData& data, const InferenceArgs& args);
  // int64 ids [B, T] -> logits [B, T, V] on the CPU.
  torch::Tensor forward(const torch::Tensor& ids);

  BuiltModel model;

 private:
  std::optional<Pipe> pipe_;
  torch::Device device_ = torch::kCPU;
};

}  // namespace pipetrain::cli
