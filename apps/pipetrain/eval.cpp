// `pipetrain eval`: test loss and accuracy of a checkpoint written by `pipetrain train`, or the
// loss and perplexity of a Hugging Face model on a token file.
//
//   pipetrain eval --checkpoint run [--data fashion-mnist] [--model cnn]
//                  [--model-options JSON] [--batch-size 1000]
//   pipetrain eval --model DIR --data tokens --token-file F --seq-len T [--checkpoint C]
//   pipetrain eval --model DIR --data indexed --data-path PREFIX --seq-len T [--checkpoint C]
//                  [--stages K] [--device cpu|cuda]     (every sample of F once, in order)
//
// The model is rebuilt from --model/--model-options (default: the checkpoint's metadata, so
// `--checkpoint FILE` alone is enough for a checkpoint of an example model), its parameters and
// buffers restored by name, and evaluated sequentially in eval mode on the held-out split
// (Fashion-MNIST's 10000 test images; fixed windows of the corpus for --data text).
// Exit codes: 0, 2 for a missing or unusable checkpoint, a model that does not match it, bad data.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "hf.h"
#include "pipetrain/base/atomic_file.h"
#include "pipetrain/train/checkpoint.h"
#include "pipetrain/train/document_batches.h"
#include "pipetrain/train/sharded_checkpoint.h"
#include "pipetrain/train/token_batches.h"
#include "train_setup.h"

namespace pipetrain::cli {
namespace {

struct EvalArgs {
  ModelDataArgs data;
  InferenceArgs inference;  // its checkpoint: required but for a Hugging Face model
  int64_t batch_size = 1000;
  bool model_given = false;
  bool options_given = false;
  bool data_given = false;
};

// A Hugging Face model's mean loss per target id over every sample of the token file, or over
// every counted target of an indexed dataset's rows.
int run_eval_tokens(EvalArgs& args) {
  if (args.batch_size < 1) throw UsageError("--batch-size must be at least 1");
  check_model_data_args(args.data);
  const BuiltData data = build_data(args.data);
  if (data.document_sources.size() > 1) {
    throw UsageError("eval reads one dataset: give --data-path one PREFIX (got a blend of " +
                     std::to_string(data.document_sources.size()) + ")");
  }
  InferenceModel model(args.data, data, args.inference);
  check_data_against_model(model.model, data);
  const std::string weights =
      args.inference.checkpoint.empty() ? "" : " (weights of " + args.inference.checkpoint + ")";
  if (!data.document_sources.empty()) {
    examples::ModelDataSpec spec = args.data;
    spec.shuffle = false;  // every row once, in stored order
    const train::DocumentBatches rows(
        data.document_sources,
        examples::document_batch_options(spec, model.model, data, args.batch_size));
    const train::DocumentEvaluation e = train::evaluate_documents(
        [&](const data::Batch& batch) { return model.forward(batch.inputs[0], batch.layout); },
        rows, args.batch_size);
    std::printf("model %s%s, data %s (%lld documents, --pack %s)\n", args.data.model.c_str(),
                weights.c_str(), args.data.data_path.front().c_str(),
                static_cast<long long>(data.documents), args.data.packing.c_str());
    std::printf("eval loss %.6f nats, perplexity %.4f (%lld rows, %lld counted targets)\n", e.loss,
                e.perplexity, static_cast<long long>(e.rows),
                static_cast<long long>(e.counted_targets));
    return 0;
  }
  const train::TokenEvaluation e =
      train::evaluate_tokens([&](const torch::Tensor& x) { return model.forward(x); }, *data.tokens,
                             data.seq_len, args.batch_size);
  std::printf("model %s%s, data %s\n", args.data.model.c_str(), weights.c_str(),
              args.data.token_file.c_str());
  std::printf("eval loss %.6f nats, perplexity %.4f (%lld samples, %lld tokens)\n", e.loss,
              e.perplexity, static_cast<long long>(e.samples), static_cast<long long>(e.tokens));
  return 0;
}

int run_eval(EvalArgs& args) {
  if (examples::is_hf_model(args.data.model)) return run_eval_tokens(args);
  if (args.inference.checkpoint.empty()) {
    throw UsageError(
        "--checkpoint is required (a checkpoint of `pipetrain train`), but for a "
        "Hugging Face --model DIR, which is evaluated with its own weights");
  }
  const std::string& path = args.inference.checkpoint;
  train::Checkpoint checkpoint;
  try {
    checkpoint = train::load_any_checkpoint(path);
  } catch (const pipetrain::FileError& error) {
    throw UsageError("--checkpoint: " + std::string(error.what()));
  } catch (const train::CheckpointError& error) {
    throw UsageError("--checkpoint " + path + ": " + error.what());
  }
  const nlohmann::json& meta = checkpoint.metadata;
  if (!args.model_given && meta.contains("model")) args.data.model = meta["model"];
  if (!args.options_given && meta.contains("model_options")) {
    nlohmann::json options = meta["model_options"];
    args.data.model_options = options.dump();
  }
  if (!args.data_given && meta.contains("data")) args.data.data = meta["data"];
  if (args.batch_size < 1) throw UsageError("--batch-size must be at least 1");
  check_model_data_args(args.data);
  BuiltData data = build_data(args.data);
  BuiltModel model = build_model(args.data, data);
  try {
    train::restore_model(checkpoint, *model.sequential, train::NameMatch::kExact);
  } catch (const train::CheckpointError& error) {
    throw UsageError("--checkpoint " + path + " does not fit --model " + args.data.model + ": " +
                     error.what());
  }
  check_data_against_model(model, data);
  std::optional<Evaluation> e = evaluate(model, data, args.batch_size);
  if (!e) throw UsageError("--data " + data.name + " has no held-out split to evaluate on");
  std::printf("checkpoint %s (step %lld), model %s, data %s\n", path.c_str(),
              static_cast<long long>(checkpoint.step), model.name.c_str(), data.name.c_str());
  std::printf("%s\n", examples::describe_evaluation(*e, data).c_str());
  return 0;
}

}  // namespace

void add_eval_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<EvalArgs>();
  auto* command = app.add_subcommand(
      "eval",
      "evaluate a checkpoint of `pipetrain train` on the test data, or a Hugging Face model on a "
      "token file (loss, perplexity)");
  add_model_data_flags(*command, args->data);
  add_inference_flags(*command, args->inference);
  command->add_option("--batch-size", args->batch_size, "rows per forward")->capture_default_str();
  command->add_option("--seed", args->data.seed, "seed of --data synthetic (as in training)")
      ->capture_default_str();
  command->callback([args, command, &exit_code] {
    args->model_given = command->count("--model") > 0;
    args->options_given = command->count("--model-options") > 0;
    args->data_given = command->count("--data") > 0;
    exit_code = run_eval(*args);
  });
}

}  // namespace pipetrain::cli
