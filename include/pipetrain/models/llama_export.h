// A Llama-family model (models/llama.h) written as Hugging Face's checkpoint with no process
// gathering the model: from a sharded checkpoint (train/sharded_checkpoint.h) one tensor at a
// time, or from a running Trainer by all of its processes in parallel.
//
//   // After training, on every rank (collective):
//   models::save_llama_hf(trainer, "out", config, models::HfSaveOptions().dtype("bfloat16"));
//   // From a checkpoint, in one process:
//   models::export_llama_hf(train::ShardedCheckpoint::open("ckpt"), "out", config);
//
// Both write what save_llama_hf (models/llama.h) writes from gathered parameters, byte for byte
// (the same names, order, shards and config.json), except that the shards are cut so that each
// process writes about its share. Memory: the largest tensor and its conversion to the dtype.
// Errors: a checkpoint of another model is an io::ShardIndexError naming the tensor (CLI exit 2).
#pragma once

#include <string>
#include <vector>

#include "pipetrain/models/llama.h"
#include "pipetrain/train/sharded_checkpoint.h"
#include "pipetrain/train/trainer.h"

namespace pipetrain::models {

// The tensors of `config`'s Hugging Face checkpoint as an export of a sharded checkpoint's
// "param/<name>" tensors, and the options that write them (the tied head left out).
std::vector<train::ExportedTensor> llama_hf_export_tensors(const LlamaConfig& config);
train::SafetensorsExportOptions llama_hf_export_options(const LlamaConfig& config,
                                                        const HfSaveOptions& options);

// The Hugging Face checkpoint of the parameters in `checkpoint`, written into `directory` by this
// one process. Returns the files written, config.json last.
std::vector<std::string> export_llama_hf(const train::ShardedCheckpoint& checkpoint,
                                         const std::string& directory, const LlamaConfig& config,
                                         const HfSaveOptions& options = {});

// Collective: the trainer's model written into `directory` by every process (Trainer::
// save_safetensors); the main process writes config.json last. Returns the files, on every rank.
std::vector<std::string> save_llama_hf(train::Trainer& trainer, const std::string& directory,
                                       const LlamaConfig& config,
                                       const HfSaveOptions& options = {});

}  // namespace pipetrain::models
