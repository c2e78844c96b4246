// `pipetrain train`: trains a TorchScript model on tensors saved by Python, through the pipeline.
//
//   pipetrain train --model MODEL.pt --inputs X.pt --targets Y.pt --loss mse|cross-entropy
//                   --optimizer sgd --lr 0.1 [--momentum 0] --batch-size N --steps S
//                   (--stages K | --balance a,b,c) --chunks M --schedule NAME [--virtual V]
//                   [--checkpoint always|except_last|never] [--save-params OUT.pt]
//                   [--schedule-file F] [--seed 0]
//
// The command is four steps, each its own function so later flags plug into one place:
//
//   [1] parse + check flags   TrainArgs            add_train_flags, check_args
//   [2] build the model       TrainModel           build_model (TorchScript -> Sequential)
//   [3] build the data        TrainData            build_data, check_data_against_model
//   [4] run the loop          TrainSummary         build_step (Pipe or plain sequential),
//                                                  run_training_loop, save_parameters
//
// Batches are taken in order, no shuffle: step s uses rows (s*N + 0 .. s*N + N-1) mod R of the R
// data rows, so a dataset that N does not divide is read cyclically. docs/TRAIN_CLI.md has the
// reference and examples. Exit codes (commands.h): 0 done, 1 failure while training (a step threw,
// the loss is not finite), 2 bad usage or bad input (UsageError).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "commands.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/runtime/step.h"
#include "pipetrain/runtime/tensor_io.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/text_format.h"
#include "pipetrain/stage/batchnorm.h"
#include "pipetrain/stage/torchscript.h"

namespace pipetrain::cli {
namespace {

const std::vector<std::string> kLosses = {"mse", "cross-entropy"};
const std::vector<std::string> kOptimizers = {"sgd"};
const std::vector<std::string> kCheckpoints = {"always", "except_last", "never"};

std::string join(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// c10::Error::what() carries a C++ backtrace; users get the message only.
std::string message_of(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) {
    return c10_error->what_without_backtrace();
  }
  return error.what();
}

// ---- [1] flags ----------------------------------------------------------------------------------

struct TrainArgs {
  std::string model_path;
  std::string inputs_path;
  std::string targets_path;
  std::string loss;
  std::string optimizer = "sgd";
  double lr = 0;
  double momentum = 0;
  int64_t batch_size = 0;
  int64_t steps = 0;
  int64_t stages = 1;  // K ranks; with --virtual V the model has K*V stages
  bool stages_given = false;
  std::vector<int64_t> balance;  // layers per stage (K*V entries)
  int64_t chunks = 1;
  bool chunks_given = false;
  std::string schedule = "gpipe";
  bool schedule_given = false;
  int64_t virtual_stages = 1;
  std::string checkpoint = "except_last";
  std::string save_params;
  std::string schedule_file;
  uint64_t seed = 0;
};

void add_train_flags(CLI::App& command, TrainArgs& args) {
  command
      .add_option("--model", args.model_path,
                  "TorchScript module (torch.jit.save); its children are the layers, in order")
      ->required();
  command.add_option("--inputs", args.inputs_path, "input tensor X (torch.save), rows on dim 0")
      ->required();
  command.add_option("--targets", args.targets_path, "target tensor Y (torch.save), rows on dim 0")
      ->required();
  command.add_option("--loss", args.loss, "loss: " + join(kLosses))->required();
  command.add_option("--optimizer", args.optimizer, "optimizer: " + join(kOptimizers))
      ->capture_default_str();
  command.add_option("--lr", args.lr, "learning rate (> 0)")->required();
  command.add_option("--momentum", args.momentum, "SGD momentum (>= 0)")->capture_default_str();
  command.add_option("--batch-size", args.batch_size, "rows per step N (>= 1)")->required();
  command.add_option("--steps", args.steps, "training steps S (>= 1)")->required();
  auto* stages =
      command
          .add_option(
              "--stages", args.stages,
              "pipeline ranks K (worker threads); layers split as evenly as possible. Default 1")
          ->each([&args](const std::string&) { args.stages_given = true; });
  auto* balance = command
                      .add_option("--balance", args.balance,
                                  "layers per stage, comma-separated (K*V entries summing to "
                                  "the number of layers); instead of --stages")
                      ->delimiter(',');
  stages->excludes(balance);
  command.add_option("--chunks", args.chunks, "micro-batches per mini-batch M (>= 1)")
      ->capture_default_str()
      ->each([&args](const std::string&) { args.chunks_given = true; });
  command
      .add_option(
          "--schedule", args.schedule,
          "schedule: " + join(schedule::schedule_names()) + " (custom with --schedule-file)")
      ->capture_default_str()
      ->each([&args](const std::string&) { args.schedule_given = true; });
  command
      .add_option("--virtual", args.virtual_stages, "virtual stages per rank V (interleaved-1f1b)")
      ->capture_default_str();
  command
      .add_option("--checkpoint", args.checkpoint,
                  "recompute activations for: " + join(kCheckpoints))
      ->capture_default_str();
  command.add_option("--save-params", args.save_params,
                     "write {parameter name: tensor} here at the end (torch.load reads it)");
  command.add_option("--schedule-file", args.schedule_file,
                     "custom schedule in the text form (one line of actions per rank)");
  command.add_option("--seed", args.seed, "seed for the random streams (dropout)")
      ->capture_default_str();
}

// Checks what needs no file: names and numbers. Throws UsageError.
void check_args(const TrainArgs& args) {
  auto fail = [](const std::string& message) { throw UsageError(message); };
  if (!contains(kLosses, args.loss)) {
    fail("unknown --loss '" + args.loss + "'; valid: " + join(kLosses));
  }
  if (!contains(kOptimizers, args.optimizer)) {
    fail("unknown --optimizer '" + args.optimizer + "'; valid: " + join(kOptimizers));
  }
  if (!contains(kCheckpoints, args.checkpoint)) {
    fail("unknown --checkpoint '" + args.checkpoint + "'; valid: " + join(kCheckpoints));
  }
  if (args.schedule_file.empty() && !contains(schedule::schedule_names(), args.schedule)) {
    fail("unknown --schedule '" + args.schedule + "'; valid: " + join(schedule::schedule_names()) +
         " (or give --schedule-file for a custom one)");
  }
  if (!args.schedule_file.empty() && args.schedule_given && args.schedule != "custom") {
    fail("--schedule " + args.schedule + " and --schedule-file both say which schedule to run; " +
         "give only --schedule-file (or --schedule custom)");
  }
  if (!(args.lr > 0) || !std::isfinite(args.lr)) {
    fail("--lr must be a positive number, got " + std::to_string(args.lr));
  }
  if (!(args.momentum >= 0) || !std::isfinite(args.momentum)) {
    fail("--momentum must be >= 0, got " + std::to_string(args.momentum));
  }
  if (args.batch_size < 1) {
    fail("--batch-size must be at least 1, got " + std::to_string(args.batch_size));
  }
  if (args.steps < 1) fail("--steps must be at least 1, got " + std::to_string(args.steps));
  if (args.chunks < 1) fail("--chunks must be at least 1, got " + std::to_string(args.chunks));
  if (args.virtual_stages < 1) {
    fail("--virtual must be at least 1, got " + std::to_string(args.virtual_stages));
  }
  if (args.stages < 1) {
    fail("--stages must be at least 1, got " + std::to_string(args.stages));
  }
  for (int64_t layers : args.balance) {
    if (layers < 1) {
      fail("--balance entries must be at least 1 layer each, got " + std::to_string(layers));
    }
  }
}

// ---- [2] model ----------------------------------------------------------------------------------

struct TrainModel {
  torch::nn::Sequential layers;  // shares its parameters with the TorchScript module
};

TrainModel build_model(const TrainArgs& args) {
  try {
    return TrainModel{load_torchscript_sequential(args.model_path)};
  } catch (const c10::Error& error) {
    throw UsageError("--model: " + message_of(error));
  }
}

// ---- [3] data -----------------------------------------------------------------------------------

struct TrainData {
  torch::Tensor inputs;   // X, R rows
  torch::Tensor targets;  // Y, R rows
  int64_t rows() const { return inputs.size(0); }
};

torch::Tensor load_flag_tensor(const std::string& flag, const std::string& path) {
  try {
    return load_tensor(path);
  } catch (const c10::Error& error) {
    throw UsageError(flag + ": " + message_of(error));
  }
}

TrainData build_data(const TrainArgs& args) {
  TrainData data{load_flag_tensor("--inputs", args.inputs_path),
                 load_flag_tensor("--targets", args.targets_path)};
  std::ostringstream problem;
  if (data.inputs.dim() < 1 || data.inputs.size(0) < 1) {
    problem << "--inputs " << args.inputs_path << " has shape " << data.inputs.sizes()
            << "; it needs at least one row on dim 0";
  } else if (data.targets.dim() < 1 || data.targets.size(0) != data.inputs.size(0)) {
    problem << "--inputs has " << data.inputs.size(0) << " rows but --targets has "
            << (data.targets.dim() < 1 ? 0 : data.targets.size(0)) << " (shape "
            << data.targets.sizes() << "); they must pair row by row";
  } else if (args.loss == "cross-entropy") {
    if (data.targets.scalar_type() != torch::kLong || data.targets.dim() != 1) {
      problem << "--loss cross-entropy needs --targets as class indices: a 1-D int64 tensor, got "
              << data.targets.scalar_type() << " of shape " << data.targets.sizes()
              << " (in Python: torch.save(labels.long(), path))";
    } else if (data.targets.min().item<int64_t>() < 0) {
      problem << "--targets holds the class index " << data.targets.min().item<int64_t>()
              << "; class indices must be >= 0";
    }
  } else if (args.loss == "mse" && !torch::isFloatingType(data.targets.scalar_type())) {
    problem << "--loss mse needs floating-point --targets, got " << data.targets.scalar_type();
  }
  if (!problem.str().empty()) throw UsageError(problem.str());
  return data;
}

// Rows of step s: (s*N + 0 .. N-1) mod R.
torch::Tensor batch_rows(int64_t step, int64_t batch_size, int64_t rows) {
  return (torch::arange(batch_size, torch::kLong) + step * batch_size).remainder(rows);
}

// Runs the model once (eval mode, no grad: no dropout, no running-statistics update) on the first
// rows and checks the targets against its output: the class count for cross-entropy, the shape
// for mse. Input mistakes surface here as exit 2 instead of an error inside a pipeline stage.
void check_data_against_model(const TrainArgs& args, TrainModel& model, const TrainData& data) {
  torch::Tensor output;
  const bool was_training = model.layers->is_training();
  try {
    torch::NoGradGuard no_grad;
    model.layers->eval();
    output = model.layers->forward(data.inputs.slice(0, 0, std::min<int64_t>(2, data.rows())));
    model.layers->train(was_training);
  } catch (const std::exception& error) {
    model.layers->train(was_training);
    throw UsageError("the model's forward failed on the first rows of --inputs (shape " +
                     c10::str(data.inputs.sizes()) + ", dtype " +
                     c10::str(data.inputs.scalar_type()) +
                     "); check that X matches the model's input: " + message_of(error));
  }
  if (args.loss == "cross-entropy") {
    const int64_t classes = output.dim() == 2 ? output.size(1) : -1;
    if (classes < 1) {
      throw UsageError("--loss cross-entropy needs model outputs of shape (rows, classes), got " +
                       c10::str(output.sizes()));
    }
    const int64_t largest = data.targets.max().item<int64_t>();
    if (largest >= classes) {
      throw UsageError("--targets holds the class index " + std::to_string(largest) +
                       " but the model outputs " + std::to_string(classes) +
                       " classes (valid indices 0.." + std::to_string(classes - 1) + ")");
    }
  } else if (output.sizes().slice(1) != data.targets.sizes().slice(1)) {
    throw UsageError("--loss mse: a model output row has shape " +
                     c10::str(output.sizes().slice(1)) + " but a --targets row has shape " +
                     c10::str(data.targets.sizes().slice(1)) + "; they must be equal");
  } else if (output.scalar_type() != data.targets.scalar_type()) {
    throw UsageError("--loss mse: the model outputs " + c10::str(output.scalar_type()) +
                     " but --targets is " + c10::str(data.targets.scalar_type()) +
                     "; save the targets in the model's dtype");
  }
}

// ---- [4] loop -----------------------------------------------------------------------------------

LossFn build_loss(const std::string& name) {
  if (name == "mse") {
    return [](const torch::Tensor& output, const torch::Tensor& target) {
      return torch::mse_loss(output, target);
    };
  }
  return [](const torch::Tensor& output, const torch::Tensor& target) {
    return torch::nn::functional::cross_entropy(output, target);
  };
}

std::unique_ptr<torch::optim::Optimizer> build_optimizer(const TrainArgs& args,
                                                         const TrainModel& model) {
  // Only "sgd" passes check_args today.
  return std::make_unique<torch::optim::SGD>(
      model.layers->parameters(), torch::optim::SGDOptions(args.lr).momentum(args.momentum));
}

// One training step: fills .grad() of the model's parameters and returns the mini-batch loss.
using StepFn = std::function<torch::Tensor(const torch::Tensor& x, const torch::Tensor& y)>;

struct TrainStep {
  StepFn run;
  std::string description;  // for the summary, e.g. "2 stages on 2 ranks, 4 micro-batches, 1f1b"
};

PipeOptions pipe_options(const TrainArgs& args, int64_t layers) {
  PipeOptions options;
  options.chunks(args.chunks).virtual_stages(args.virtual_stages).schedule(args.schedule);
  options.checkpoint(parse_checkpoint(args.checkpoint));
  int64_t ranks = args.stages;
  if (!args.schedule_file.empty()) {
    schedule::Schedule custom;
    try {
      custom = schedule::load_schedule(args.schedule_file);
    } catch (const std::exception& error) {
      throw UsageError("--schedule-file: " + message_of(error));
    }
    if (args.stages_given && args.stages != custom.num_ranks) {
      throw UsageError("--stages " + std::to_string(args.stages) + " but --schedule-file " +
                       args.schedule_file + " has " + std::to_string(custom.num_ranks) +
                       " ranks; drop --stages or make them agree");
    }
    if (args.chunks_given && args.chunks != custom.num_microbatches) {
      throw UsageError("--chunks " + std::to_string(args.chunks) + " but --schedule-file " +
                       args.schedule_file + " has " + std::to_string(custom.num_microbatches) +
                       " micro-batches; drop --chunks or make them agree");
    }
    ranks = custom.num_ranks;
    options.chunks(custom.num_microbatches)
        .virtual_stages(custom.virtual_stages())
        .schedule("custom");
    options.custom_schedule(custom);
  }
  const int64_t stages = ranks * options.virtual_stages();
  if (!args.balance.empty()) {
    int64_t sum = 0;
    for (int64_t b : args.balance) sum += b;
    if (sum != layers) {
      throw UsageError("--balance sums to " + std::to_string(sum) + " layers but the model has " +
                       std::to_string(layers) + "; the entries must sum to the layer count");
    }
    if (static_cast<int64_t>(args.balance.size()) % options.virtual_stages() != 0) {
      throw UsageError("--balance has " + std::to_string(args.balance.size()) +
                       " stages, not a multiple of --virtual " +
                       std::to_string(options.virtual_stages()));
    }
    options.balance(args.balance);
    options.stages(static_cast<int64_t>(args.balance.size()));
  } else {
    if (stages > layers) {
      throw UsageError(
          std::to_string(ranks) + " ranks x " + std::to_string(options.virtual_stages()) +
          " virtual stages = " + std::to_string(stages) + " stages but the model has only " +
          std::to_string(layers) + " layers; use fewer --stages or --virtual");
    }
    options.stages(stages);
  }
  return options;
}

TrainStep build_step(const TrainArgs& args, TrainModel& model) {
  LossFn loss = build_loss(args.loss);
  const bool sequential = args.stages == 1 && args.balance.empty() && args.virtual_stages == 1 &&
                          args.chunks == 1 && args.schedule_file.empty();
  if (sequential) {
    // No pipeline: the reference behaviour the pipeline must reproduce.
    torch::nn::Sequential layers = model.layers;
    return TrainStep{[layers, loss](const torch::Tensor& x, const torch::Tensor& y) mutable {
                       torch::Tensor value = loss(layers->forward(x), y);
                       value.backward();
                       return value.detach();
                     },
                     "sequential (1 stage, 1 micro-batch)"};
  }
  Pipe pipe{nullptr};
  try {
    PipeOptions options = pipe_options(args, static_cast<int64_t>(model.layers->size()));
    // TorchScript batch norms would update running statistics per micro-batch and again on
    // recompute; deferred ones update once per mini-batch, as sequential training does.
    model.layers = convert_deferred_batch_norm(model.layers, options.chunks());
    pipe = Pipe(model.layers, options);
  } catch (const c10::Error& error) {
    throw UsageError(message_of(error));
  } catch (const std::invalid_argument& error) {
    throw UsageError(error.what());
  }
  std::ostringstream description;
  description << pipe->num_stages() << " stages on " << pipe->num_ranks() << " ranks (balance";
  for (int64_t b : pipe->balance()) description << " " << b;
  description << "), " << pipe->options().chunks() << " micro-batches, schedule "
              << pipe->options().schedule() << ", checkpoint " << args.checkpoint;
  return TrainStep{[pipe, loss](const torch::Tensor& x, const torch::Tensor& y) mutable {
                     return pipe->train_step(x, y, loss);
                   },
                   description.str()};
}

struct TrainSummary {
  int64_t steps = 0;
  double first_loss = 0;
  double last_loss = 0;
  double seconds = 0;
};

// Returns nullopt after printing why when a step fails or the loss stops being finite.
std::optional<TrainSummary> run_training_loop(const TrainArgs& args, TrainModel& model,
                                              const TrainData& data, const TrainStep& step,
                                              torch::optim::Optimizer& optimizer) {
  TrainSummary summary;
  model.layers->train();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t k = 0; k < args.steps; ++k) {
    const torch::Tensor rows = batch_rows(k, args.batch_size, data.rows());
    const torch::Tensor x = data.inputs.index_select(0, rows);
    const torch::Tensor y = data.targets.index_select(0, rows);
    optimizer.zero_grad();
    double loss = 0;
    try {
      loss = step.run(x, y).item<double>();
      // Fewer micro-batches than --chunks (a short batch) leave deferred statistics uncommitted.
      commit_deferred_batch_norms(*model.layers);
      optimizer.step();
    } catch (const std::exception& error) {
      std::cerr << "pipetrain train: step " << k << " failed: " << message_of(error) << "\n";
      return std::nullopt;
    }
    std::printf("step %lld loss %.6f\n", static_cast<long long>(k), loss);
    std::fflush(stdout);
    if (!std::isfinite(loss)) {
      std::cerr << "pipetrain train: the loss is " << loss << " at step " << k
                << "; training diverged (try a smaller --lr)\n";
      return std::nullopt;
    }
    if (k == 0) summary.first_loss = loss;
    summary.last_loss = loss;
    summary.steps = k + 1;
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

void save_parameters(const std::string& path, const TrainModel& model) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& item : model.layers->named_parameters()) {
    named.emplace_back(item.key(), item.value());
  }
  save_named_tensors(path, named);
}

int run_train(const TrainArgs& args) {
  check_args(args);
  torch::manual_seed(args.seed);
  TrainModel model = build_model(args);
  TrainData data = build_data(args);
  check_data_against_model(args, model, data);
  TrainStep step = build_step(args, model);
  std::unique_ptr<torch::optim::Optimizer> optimizer = build_optimizer(args, model);

  std::printf("training %s: %zu layers, %lld rows, batch %lld, %s\n", args.model_path.c_str(),
              model.layers->size(), static_cast<long long>(data.rows()),
              static_cast<long long>(args.batch_size), step.description.c_str());
  std::optional<TrainSummary> summary = run_training_loop(args, model, data, step, *optimizer);
  if (!summary) return 1;
  std::printf("done: %lld steps in %.3f s (%.1f steps/s), loss %.6f -> %.6f\n",
              static_cast<long long>(summary->steps), summary->seconds,
              summary->seconds > 0 ? summary->steps / summary->seconds : 0.0, summary->first_loss,
              summary->last_loss);
  if (!args.save_params.empty()) {
    try {
      save_parameters(args.save_params, model);
    } catch (const c10::Error& error) {
      std::cerr << "pipetrain train: --save-params: " << message_of(error) << "\n";
      return 1;
    }
    std::printf("saved %zu parameters to %s\n", model.layers->parameters().size(),
                args.save_params.c_str());
  }
  return 0;
}

}  // namespace

void add_train_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<TrainArgs>();
  auto* command = app.add_subcommand(
      "train", "train a TorchScript model on saved tensors, pipelined (docs/TRAIN_CLI.md)");
  add_train_flags(*command, *args);
  command->callback([args, &exit_code] { exit_code = run_train(*args); });
}

}  // namespace pipetrain::cli
