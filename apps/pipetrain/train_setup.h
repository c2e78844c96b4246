// The flags that name a model and a data set, shared by `pipetrain train` and `pipetrain eval`.
// Building them, checking them against each other and evaluating are the examples library's
// (examples/model_data.h).
#pragma once

#include <CLI/CLI.hpp>

#include "commands.h"
#include "model_data.h"
#include "pipetrain/base/message_of.h"

namespace pipetrain::cli {

using ModelDataArgs = examples::ModelDataSpec;
using examples::build_data;
using examples::build_model;
using examples::BuiltData;
using examples::BuiltModel;
using examples::check_data_against_model;
using examples::data_names;
using examples::evaluate;
using examples::join_names;
using Evaluation = train::Evaluation;

inline void check_model_data_args(const ModelDataArgs& args) {
  examples::check_model_data_spec(args);
}

// Adds --model, --model-options, --data, --data-dir, --text-file, --inputs, --targets, --loss,
// --synthetic-samples to `command`.
void add_model_data_flags(CLI::App& command, ModelDataArgs& args);

}  // namespace pipetrain::cli
