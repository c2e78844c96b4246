// run_evaluation, run_generation and run_export (job/run_job.h): the commands that read a model
// or a checkpoint without training it.
//
//   eval      a checkpoint of `train` on the held-out split of its data (the model, its options
//             and the data default to the checkpoint's metadata), or a Hugging Face model's loss
//             and perplexity over every sample of a token file or every row of an indexed dataset
//   generate  greedy decoding through the pipeline (models/generate.h)
//   export    a pipetrain checkpoint of a Hugging Face model as transformers saves it
#include <cstdio>

#include <sstream>
#include "pipetrain/base/format_text.h"

#include <nlohmann/json.hpp>

#include "job_internal.h"
#include "pipetrain/job/job_fields.h"
#include "pipetrain/job/run_job.h"
#include "pipetrain/job/training_setup.h"
#include "pipetrain/models/generate.h"
#include "pipetrain/models/llama_export.h"
#include "pipetrain/train/checkpoint.h"
#include "pipetrain/train/document_batches.h"
#include "pipetrain/train/sharded_checkpoint.h"
#include "pipetrain/train/token_batches.h"

namespace pipetrain::job {
namespace {

using detail::as_bad_input;

InferenceSpec inference_spec(const JobConfig& job) {
  InferenceSpec spec;
  spec.checkpoint = job.inference.checkpoint;
  spec.stages = job.pipeline.stages.value_or(1);
  spec.device = job.pipeline.device;
  return spec;
}

// A Hugging Face model's mean loss per target id over every sample of the token file, or over
// every counted target of an indexed dataset's rows.
std::string evaluate_tokens(const JobConfig& job, const ModelDataSpec& spec) {
  check_model_data_spec(spec);
  const BuiltData data = build_data(spec);
  if (data.document_sources.size() > 1) {
    throw BadInput("eval reads one dataset: give --data-path one PREFIX (got a blend of " +
                   std::to_string(data.document_sources.size()) + ")");
  }
  InferenceModel model(spec, data, inference_spec(job));
  check_data_against_model(model.model, data);
  const int64_t batch = job.eval.batch_size;
  const std::string& checkpoint = job.inference.checkpoint;
  const std::string weights = checkpoint.empty() ? "" : " (weights of " + checkpoint + ")";
  if (!data.document_sources.empty()) {
    ModelDataSpec in_order = spec;
    in_order.shuffle = false;  // every row once, in stored order
    const train::DocumentBatches rows(data.document_sources,
                                      document_batch_options(in_order, model.model, data, batch));
    const train::DocumentEvaluation e = train::evaluate_documents(
        [&](const data::Batch& b) { return model.forward(b.inputs[0], b.layout); }, rows, batch);
    return format_text("model %s%s, data %s (%lld documents, --pack %s)\n", spec.model.c_str(),
                       weights.c_str(), spec.data_path.front().c_str(),
                       static_cast<long long>(data.documents), spec.packing.c_str()) +
           format_text("eval loss %.6f nats, perplexity %.4f (%lld rows, %lld counted targets)\n",
                       e.loss, e.perplexity, static_cast<long long>(e.rows),
                       static_cast<long long>(e.counted_targets));
  }
  const train::TokenEvaluation e = train::evaluate_tokens(
      [&](const torch::Tensor& x) { return model.forward(x); }, *data.tokens, data.seq_len, batch);
  return format_text("model %s%s, data %s\n", spec.model.c_str(), weights.c_str(),
                     spec.token_file.c_str()) +
         format_text("eval loss %.6f nats, perplexity %.4f (%lld samples, %lld tokens)\n", e.loss,
                     e.perplexity, static_cast<long long>(e.samples),
                     static_cast<long long>(e.tokens));
}

// The model a checkpoint was trained as: its metadata's model_options.hf_config.
models::LlamaConfig exported_config(const std::string& path, const nlohmann::json& metadata) {
  const nlohmann::json& options = metadata.value("model_options", nlohmann::json());
  if (!options.is_object() || !options.contains("hf_config")) {
    throw BadInput("CHECKPOINT " + path +
                   " was not written by training a Hugging Face --model (its metadata has no "
                   "model_options.hf_config)");
  }
  return as_bad_input("CHECKPOINT " + path, [&] {
    return models::parse_llama_config(options["hf_config"], path + " (hf_config)");
  });
}

}  // namespace

JobResult run_evaluation(const JobConfig& job, JobObserver& observer) {
  check_fields(job, Command::kEval);
  ModelDataSpec spec = model_data_spec(job);
  if (is_hf_model(spec.model)) {
    observer.on_result(evaluate_tokens(job, spec));
    return {};
  }
  const std::string& path = job.inference.checkpoint;
  if (path.empty()) {
    throw BadInput(
        "--checkpoint is required (a checkpoint of `pipetrain train`), but for a Hugging Face "
        "--model DIR, which is evaluated with its own weights");
  }
  train::Checkpoint checkpoint;
  try {
    checkpoint = train::load_any_checkpoint(path);
  } catch (const pipetrain::FileError& error) {
    throw BadInput("--checkpoint: " + std::string(error.what()));
  } catch (const train::CheckpointError& error) {
    throw BadInput("--checkpoint " + path + ": " + error.what());
  }
  // What the job leaves at its defaults comes from the checkpoint's metadata.
  const JobConfig defaults;
  const nlohmann::json& meta = checkpoint.metadata;
  if (job.model.name == defaults.model.name && meta.contains("model")) spec.model = meta["model"];
  if (job.model.options == defaults.model.options && meta.contains("model_options")) {
    spec.model_options = meta["model_options"].dump();
  }
  if (job.data.name == defaults.data.name && meta.contains("data")) spec.data = meta["data"];
  check_model_data_spec(spec);
  BuiltData data = build_data(spec);
  BuiltModel model = build_model(spec, data);
  try {
    train::restore_model(checkpoint, *model.sequential, train::NameMatch::kExact);
  } catch (const train::CheckpointError& error) {
    throw BadInput("--checkpoint " + path + " does not fit --model " + spec.model + ": " +
                   error.what());
  }
  check_data_against_model(model, data);
  std::optional<train::Evaluation> e = evaluate(model, data, job.eval.batch_size);
  if (!e) throw BadInput("--data " + data.name + " has no held-out split to evaluate on");
  observer.on_result(format_text("checkpoint %s (step %lld), model %s, data %s\n", path.c_str(),
                                 static_cast<long long>(checkpoint.step), model.name.c_str(),
                                 data.name.c_str()) +
                     describe_evaluation(*e, data) + "\n");
  return {};
}

JobResult run_generation(const JobConfig& job, JobObserver& observer) {
  check_fields(job, Command::kGenerate);
  ModelDataSpec spec = model_data_spec(job);
  spec.data = "tokens";  // the combination check_model_data_spec asks of a language model
  if (!is_hf_model(spec.model)) {
    throw BadInput("--model " + spec.model +
                   " is not a Hugging Face model directory (config.json and safetensors)");
  }
  const std::vector<int64_t>& prompt = job.generate.prompt_tokens;
  if (prompt.empty()) throw BadInput("--prompt-tokens is required: the prompt's ids");
  const models::LlamaConfig config = hf_config(spec);
  for (int64_t id : prompt) {
    if (id < 0 || id >= config.vocab_size) {
      throw BadInput("--prompt-tokens holds " + std::to_string(id) +
                     ", not an id of the vocabulary (0.." + std::to_string(config.vocab_size - 1) +
                     ")");
    }
  }
  const int64_t max_new_tokens = job.generate.max_new_tokens;
  as_bad_input("--max-new-tokens", [&] {
    models::check_sequence_length(config, static_cast<int64_t>(prompt.size()) + max_new_tokens,
                                  spec.model);
  });
  InferenceModel model(spec, BuiltData{}, inference_spec(job));
  const std::vector<int64_t> ids =
      models::generate_greedy([&](const torch::Tensor& x) { return model.forward(x); }, prompt,
                              max_new_tokens, config.eos_token_ids);
  std::ostringstream text;
  for (size_t i = 0; i < ids.size(); ++i) text << (i ? "," : "") << ids[i];
  observer.on_result(text.str() + "\n");
  return {};
}

JobResult run_export(const JobConfig& job, JobObserver& observer) {
  check_fields(job, Command::kExportHf);
  const ExportSettings& e = job.export_hf;
  if (e.checkpoint.empty() || e.out.empty()) {
    throw BadInput(
        "export-hf needs CHECKPOINT and OUT: the checkpoint to read and the directory "
        "to write");
  }
  const std::string flag = "CHECKPOINT " + e.checkpoint;
  const models::HfSaveOptions save = models::HfSaveOptions().dtype(e.dtype);
  int64_t step = 0;
  std::vector<std::string> files;
  if (as_bad_input(flag, [&] { return train::resolve_sharded_checkpoint(e.checkpoint); })) {
    // Sharded: read and written one tensor at a time, nothing held whole.
    const train::ShardedCheckpoint checkpoint =
        as_bad_input(flag, [&] { return train::ShardedCheckpoint::open(e.checkpoint); });
    const models::LlamaConfig config =
        exported_config(e.checkpoint, checkpoint.index().state.value("metadata", nlohmann::json()));
    step = checkpoint.index().state.value("step", int64_t{0});
    files = as_bad_input("OUT",
                         [&] { return models::export_llama_hf(checkpoint, e.out, config, save); });
  } else {
    const train::Checkpoint checkpoint =
        as_bad_input(flag, [&] { return train::load_checkpoint(e.checkpoint); });
    const models::LlamaConfig config = exported_config(e.checkpoint, checkpoint.metadata);
    step = checkpoint.step;
    files = as_bad_input(
        "OUT", [&] { return models::save_llama_hf(e.out, config, checkpoint.parameters, save); });
  }
  observer.on_result(format_text("exported step %lld of %s to %s (%zu files, %s)\n",
                                 static_cast<long long>(step), e.checkpoint.c_str(), e.out.c_str(),
                                 files.size(), e.dtype.c_str()));
  return {};
}

}  // namespace pipetrain::job
