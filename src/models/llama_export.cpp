// Hugging Face output without a gather (pipetrain/models/llama_export.h).
#include "pipetrain/models/llama_export.h"

namespace pipetrain::models {

std::vector<train::ExportedTensor> llama_hf_export_tensors(const LlamaConfig& config) {
  std::vector<train::ExportedTensor> out;
  for (const HfTensorName& t : llama_hf_tensors(config)) {
    out.push_back({t.hf_name, "param/" + t.name, t.shape});
  }
  return out;
}

train::SafetensorsExportOptions llama_hf_export_options(const LlamaConfig& config,
                                                        const HfSaveOptions& options) {
  train::SafetensorsExportOptions out;
  out.dtype(parse_hf_dtype(options.dtype())).max_shard_bytes(options.max_shard_bytes());
  if (config.tie_word_embeddings) {
    out.unexported({"param/" + std::to_string(config.num_hidden_layers + 2) + ".weight"});
  }
  return out;
}

std::vector<std::string> export_llama_hf(const train::ShardedCheckpoint& checkpoint,
                                         const std::string& directory, const LlamaConfig& config,
                                         const HfSaveOptions& options) {
  const std::vector<train::ExportedTensor> tensors = llama_hf_export_tensors(config);
  const train::SafetensorsExportOptions export_options = llama_hf_export_options(config, options);
  train::export_safetensors_part(checkpoint, directory, tensors, export_options);
  train::finish_safetensors_export(directory, tensors, export_options);
  std::vector<std::string> files = train::safetensors_export_files(tensors, export_options);
  files.push_back(write_llama_hf_config(directory, config, options.dtype()));
  return files;
}

std::vector<std::string> save_llama_hf(train::Trainer& trainer, const std::string& directory,
                                       const LlamaConfig& config, const HfSaveOptions& options) {
  return trainer.save_safetensors(
      directory, llama_hf_export_tensors(config), llama_hf_export_options(config, options),
      {{"config.json", llama_config_json(config, options.dtype()).dump(2) + "\n"}});
}

}  // namespace pipetrain::models
