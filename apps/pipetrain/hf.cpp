// The Hugging Face commands: `pipetrain generate` (greedy decoding through the pipeline) and
// `pipetrain export-hf` (a pipetrain checkpoint of a Hugging Face model, written as transformers
// saves it), and the flags of the inference model (examples' InferenceModel) eval shares.
//
//   pipetrain generate --model DIR --prompt-tokens 1,2,3 --max-new-tokens N [--stages K]
//                      [--checkpoint run] [--device cpu|cuda]
//   pipetrain export-hf CHECKPOINT OUT [--dtype float32|bfloat16|float16]
//
// Exit codes (commands.h): 0, 2 for bad input (a model or checkpoint that does not fit, a prompt
// id outside the vocabulary).
#include <cstdio>
#include <memory>
#include <sstream>

#include "commands.h"
#include "hf.h"
#include "pipetrain/models/generate.h"
#include "pipetrain/models/llama_export.h"
#include "pipetrain/train/checkpoint.h"
#include "pipetrain/train/sharded_checkpoint.h"

namespace pipetrain::cli {

void add_inference_flags(CLI::App& command, InferenceArgs& args) {
  command.add_option("--checkpoint", args.checkpoint,
                     "weights from this pipetrain checkpoint (of the same --model) instead of "
                     "DIR's");
  command.add_option("--stages", args.stages, "pipeline ranks the forward runs through")
      ->capture_default_str();
  command.add_option("--device", args.device, "cpu, or cuda (rank r on cuda:(r mod GPUs))")
      ->capture_default_str();
}

namespace {

struct GenerateArgs {
  ModelDataArgs data;
  InferenceArgs inference;
  std::vector<int64_t> prompt;
  int64_t max_new_tokens = 16;
};

int run_generate(GenerateArgs& args) {
  if (!examples::is_hf_model(args.data.model)) {
    throw UsageError("--model " + args.data.model +
                     " is not a Hugging Face model directory (config.json and safetensors)");
  }
  if (args.max_new_tokens < 0) throw UsageError("--max-new-tokens must be >= 0");
  const models::LlamaConfig config = examples::hf_config(args.data);
  for (int64_t id : args.prompt) {
    if (id < 0 || id >= config.vocab_size) {
      throw UsageError("--prompt-tokens holds " + std::to_string(id) +
                       ", not an id of the vocabulary (0.." +
                       std::to_string(config.vocab_size - 1) + ")");
    }
  }
  as_usage_error("--max-new-tokens", [&] {
    models::check_sequence_length(
        config, static_cast<int64_t>(args.prompt.size()) + args.max_new_tokens, args.data.model);
  });
  InferenceModel model(args.data, BuiltData{}, args.inference);
  const std::vector<int64_t> ids =
      models::generate_greedy([&](const torch::Tensor& x) { return model.forward(x); }, args.prompt,
                              args.max_new_tokens, config.eos_token_ids);
  std::ostringstream text;
  for (size_t i = 0; i < ids.size(); ++i) text << (i ? "," : "") << ids[i];
  std::printf("%s\n", text.str().c_str());
  return 0;
}

struct ExportArgs {
  std::string checkpoint;
  std::string out;
  std::string dtype = "float32";
};

// The model a checkpoint was trained as: its metadata's model_options.hf_config.
models::LlamaConfig exported_config(const ExportArgs& args, const nlohmann::json& metadata) {
  const nlohmann::json& options = metadata.value("model_options", nlohmann::json());
  if (!options.is_object() || !options.contains("hf_config")) {
    throw UsageError("CHECKPOINT " + args.checkpoint +
                     " was not written by training a Hugging Face --model (its metadata has no "
                     "model_options.hf_config)");
  }
  return as_usage_error("CHECKPOINT " + args.checkpoint, [&] {
    return models::parse_llama_config(options["hf_config"], args.checkpoint + " (hf_config)");
  });
}

int run_export(const ExportArgs& args) {
  const models::HfSaveOptions save = models::HfSaveOptions().dtype(args.dtype);
  int64_t step = 0;
  std::vector<std::string> files;
  if (as_usage_error("CHECKPOINT " + args.checkpoint,
                     [&] { return train::resolve_sharded_checkpoint(args.checkpoint); })) {
    // Sharded: read and written one tensor at a time, nothing held whole.
    const train::ShardedCheckpoint checkpoint =
        as_usage_error("CHECKPOINT " + args.checkpoint,
                       [&] { return train::ShardedCheckpoint::open(args.checkpoint); });
    const models::LlamaConfig config =
        exported_config(args, checkpoint.index().state.value("metadata", nlohmann::json()));
    step = checkpoint.index().state.value("step", int64_t{0});
    files = as_usage_error(
        "OUT", [&] { return models::export_llama_hf(checkpoint, args.out, config, save); });
  } else {
    const train::Checkpoint checkpoint = as_usage_error(
        "CHECKPOINT " + args.checkpoint, [&] { return train::load_checkpoint(args.checkpoint); });
    const models::LlamaConfig config = exported_config(args, checkpoint.metadata);
    step = checkpoint.step;
    files = as_usage_error("OUT", [&] {
      return models::save_llama_hf(args.out, config, checkpoint.parameters, save);
    });
  }
  std::printf("exported step %lld of %s to %s (%zu files, %s)\n", static_cast<long long>(step),
              args.checkpoint.c_str(), args.out.c_str(), files.size(), args.dtype.c_str());
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<GenerateArgs>();
  auto* command = app.add_subcommand(
      "generate", "greedy decoding with a Hugging Face model through the pipeline");
  command->add_option("--model", args->data.model, "Hugging Face model directory")->required();
  command->add_option("--init", args->data.init, "checkpoint (DIR's weights) or random")
      ->capture_default_str();
  command->add_option("--seed", args->data.seed, "seed of --init random")->capture_default_str();
  command->add_option("--prompt-tokens", args->prompt, "prompt ids, comma-separated")
      ->delimiter(',')
      ->required();
  command->add_option("--max-new-tokens", args->max_new_tokens, "ids to generate at most")
      ->capture_default_str();
  add_inference_flags(*command, args->inference);
  args->data.data = "tokens";  // the combination check_model_data_spec asks of a language model
  command->callback([args, &exit_code] { exit_code = run_generate(*args); });
}

void add_export_hf_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ExportArgs>();
  auto* command = app.add_subcommand(
      "export-hf",
      "write a pipetrain checkpoint of a Hugging Face model as transformers saves it "
      "(safetensors, config.json)");
  command
      ->add_option(
          "CHECKPOINT", args->checkpoint,
          "checkpoint: a file (DIR/checkpoint.pt), a sharded DIR/step-N or DIR (its latest)")
      ->required();
  command->add_option("OUT", args->out, "output directory")->required();
  command->add_option("--dtype", args->dtype, "float32, bfloat16 or float16")
      ->capture_default_str();
  command->callback([args, &exit_code] { exit_code = run_export(*args); });
}

void add_checkpoint_info_command(CLI::App& app, int& exit_code) {
  auto path = std::make_shared<std::string>();
  auto* command = app.add_subcommand(
      "checkpoint-info",
      "print what a sharded checkpoint holds (step, the layout it was written at, tensors, bytes "
      "by file) from its index, without loading it");
  command->add_option("DIR", *path, "DIR/step-N, or DIR (its latest)")->required();
  command->callback([path, &exit_code] {
    const std::string text =
        as_usage_error("DIR " + *path, [&] { return train::describe_sharded_checkpoint(*path); });
    std::printf("%s", text.c_str());
    exit_code = 0;
  });
}

}  // namespace pipetrain::cli
