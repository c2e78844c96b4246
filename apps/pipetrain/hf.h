// The flags of a model for inference (examples/model_data.h, InferenceModel), shared by
// `pipetrain eval` and `pipetrain generate` (hf.cpp).
#pragma once

#include <CLI/CLI.hpp>

#include "train_setup.h"

namespace pipetrain::cli {

using examples::InferenceModel;
using InferenceArgs = examples::InferenceSpec;

// Adds --checkpoint, --stages, --device.
void add_inference_flags(CLI::App& command, InferenceArgs& args);

}  // namespace pipetrain::cli
