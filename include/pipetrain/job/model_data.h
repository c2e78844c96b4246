// Building a job's model and data from a ModelDataSpec (made of a JobConfig's [model] and [data]
// sections: job/training_setup.h): what `pipetrain train`, `eval` and `generate` share, and what a
// C++ user calls to get the same model and data.
//
//   model: mlp|cnn|gpt|PATH.pt|DIR
//                                an example model (model_registry.h), a TorchScript module whose
//                                children are the layers (stage/torchscript.h), or a Hugging Face
//                                Llama-family checkpoint directory (config.json + safetensors;
//                                models/llama.h), its weights loaded or, with init random, drawn
//   data:  fashion-mnist|text|synthetic|tensors|tokens|indexed
//                                Fashion-MNIST (60000 train / 10000 test images), a character
//                                corpus (GPT), random 28x28 images (fast tests), X/Y tensors
//                                saved from Python (inputs/targets paths, no test split), or a
//                                token file (io/token_file.h) for a Hugging Face model, or a
//                                Megatron indexed dataset of documents (io/indexed_dataset.h),
//                                packed into rows (train/document_batches.h)
//
// Every problem with the input (unknown name, missing or corrupt file, a model that does not fit
// the data, labels out of range) is thrown as pipetrain::BadInput naming the flag.
//
// Thread-safety: plain values and free functions; build once on the main thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "pipetrain/examples/text_corpus.h"
#include "pipetrain/io/token_file.h"
#include "pipetrain/models/llama.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/train/batch_source.h"
#include "pipetrain/train/document_batches.h"
#include "pipetrain/train/evaluate.h"

namespace pipetrain::job {

using examples::CharCorpus;

// Which model and which data (the fields of `pipetrain train`'s and `pipetrain eval`'s flags of the
// same names).
struct ModelDataSpec {
  std::string model = "cnn";
  std::string model_options = "{}";  // JSON object of the example model's options
  std::string data = "fashion-mnist";
  std::string data_dir;   // Fashion-MNIST directory (default: the Debian package's)
  std::string text_file;  // corpus for --data text (default: the GPL-3 text)
  std::string inputs_path;
  std::string targets_path;
  std::string loss;  // mse|cross-entropy; default: the example model's own loss
  int64_t synthetic_samples = 2048;
  uint64_t seed = 0;
  std::string init = "checkpoint";  // a Hugging Face model: checkpoint (DIR's weights) or random
  std::string token_file;           // --data tokens
  // --data indexed: Megatron's PREFIX (.idx + .bin), or a blend "W1 PREFIX1 W2 PREFIX2 ..."
  std::vector<std::string> data_path;
  int64_t seq_len = 0;   // tokens per sample (--seq-len)
  int token_bytes = 2;   // 2 (uint16 ids) or 4 (uint32)
  bool shuffle = false;  // token samples (indexed: documents or rows) in a seeded order per epoch
  // --data indexed (train/document_batches.h): how documents fill rows (split, whole, none), the
  // loss masks (one PREFIX per dataset of --data-path, in order), attention across documents,
  // the rows' widths rounded up to a multiple (0: the tensor-parallel size with sequence
  // parallelism, else 1), and --pack none's rows grouped by length.
  std::string packing = "split";
  std::vector<std::string> loss_mask_path;
  bool cross_document_attention = false;
  int64_t pad_multiple = 0;
  bool group_by_length = false;
};

// "fashion-mnist", "text", "synthetic", "tensors", "tokens", "indexed".
std::vector<std::string> data_names();

// The model, its loss and what identifies it (for checkpoint metadata).
struct BuiltModel {
  std::string name;  // "cnn" or the TorchScript path
  bool torchscript = false;
  torch::nn::Sequential sequential;
  std::vector<std::pair<std::string, std::string>> tied_parameters;  // (first name, second name)
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> loss;
  std::string loss_name;  // "cross-entropy", "mse", "gpt-cross-entropy", "causal-lm-cross-entropy"
  nlohmann::json options = nlohmann::json::object();
  // A Hugging Face model: its config (the Sequential's entries are models/llama.h's). Entries a
  // multi-process rank does not hold are meta placeholders (LlamaModel::materialized).
  std::shared_ptr<const models::LlamaConfig> llama;
  // A tensor-parallel Hugging Face model: how its parameters are cut (name -> the dimension, or
  // nullopt for a whole tensor); empty without tensor parallelism.
  std::function<std::optional<parallel::TensorSplit>(const std::string&)> tensor_parallel_split;
  // Built with values on demand (build_model's `on_demand`): those entries' parameters are
  // allocated but hold no values (their pages untouched) until fill_values(p) writes the values
  // of p's entry, all of its parameters, once (a second call for the entry does nothing). ZeRO-3
  // takes them so, a layer at a time (train::ZeroOptions::initial_values). Null otherwise.
  std::function<void(const torch::Tensor&)> fill_values;
};

// The data: training rows (or a corpus), held-out rows when the data set has them.
struct BuiltData {
  std::string name;
  torch::Tensor train_inputs, train_targets;    // empty for text
  torch::Tensor test_inputs, test_targets;      // empty when there is no test split
  std::optional<CharCorpus> corpus;             // --data text
  int64_t context = 0;                          // text: tokens per window
  std::shared_ptr<const io::TokenFile> tokens;  // --data tokens
  int64_t documents = 0;                        // --data indexed: documents in the dataset(s)
  // --data indexed: each dataset (with its loss mask) and its weight in the blend.
  std::vector<train::DocumentSource> document_sources;
  int64_t seq_len = 0;          // tokens, indexed: ids per sample (the longest row)
  bool classification = false;  // accuracy makes sense
};

// REQUIRES: spec checked by check_model_data_spec. The corpus is read before the model so that a
// GPT's vocabulary size follows the corpus. `entries`: the Sequential entries of a Hugging Face
// model this process gives memory to (nullopt: all; the others are checked against the
// checkpoint but not read).
BuiltData build_data(const ModelDataSpec& spec);
// `tp`: the tensor-parallel group a Hugging Face model is split over (models/llama.h; its loss is
// then the vocabulary-parallel one); other models refuse a split group.
// `on_demand` (a Hugging Face model): entries built without their values, which
// BuiltModel::fill_values writes when asked; ignored by other models.
// `ep` (a Hugging Face mixture): the expert-parallel group its experts are split over.
// `cp` (a Hugging Face model): the context-parallel group its sequences are split over; other
// models refuse a split group.
BuiltModel build_model(const ModelDataSpec& spec, const BuiltData& data,
                       const std::optional<std::vector<int64_t>>& entries = std::nullopt,
                       const parallel::TensorParallel& tp = {},
                       const std::vector<int64_t>& on_demand = {},
                       const parallel::ExpertParallel& ep = {},
                       const parallel::ContextParallel& cp = {});
// One tensor-parallel rank's copy of the Hugging Face model `spec` names, randomly initialised and
// split over a mirror group of `tensor_parallel` (transport/c10d.h): a rank's shapes, allocations
// and work with no collective, for profiling it in one process (the auto plan, the memory model).
// A mixture with `expert_parallel` > 1: its experts as expert-parallel rank 0 of a mirror group
// holds them; `context_parallel` > 1: the attention as context-parallel rank 0 runs it (ring, or
// Ulysses with `ulysses`), its input that rank's tokens.
BuiltModel build_mirror_model(const ModelDataSpec& spec, const BuiltData& data, int tensor_parallel,
                              bool sequence_parallel, int expert_parallel = 1,
                              int context_parallel = 1, bool ulysses = false);
// True when `model` names a Hugging Face checkpoint directory (rather than an example model or a
// TorchScript file).
bool is_hf_model(const std::string& model);
// The config of the Hugging Face model `spec` names (its config.json), read and checked; throws
// pipetrain::BadInput naming --model.
models::LlamaConfig hf_config(const ModelDataSpec& spec);
// What one training sample of `data` is worth: its tokens (token data; documents count their own
// per step) and, for a Hugging Face model, the model FLOPs of a token
// (LlamaConfig::training_flops_per_token at the sequence length); 0 where unknown. For the
// progress line's tokens/s and MFU (train/progress.h).
struct SampleCost {
  int64_t tokens = 0;
  double flops_per_token = 0;
};
SampleCost sample_cost(const BuiltModel& model, const BuiltData& data);
// Names, combinations and ranges; throws pipetrain::BadInput naming the flag.
void check_model_data_spec(const ModelDataSpec& spec);
// --data-path's values: one PREFIX (weight 1), or "W1 PREFIX1 W2 PREFIX2 ..." (a blend, weights
// > 0). Throws pipetrain::BadInput naming the flag otherwise.
std::vector<std::pair<double, std::string>> parse_data_path(const std::vector<std::string>& path);

// A model to plan for (`pipetrain plan --model`) and a random mini-batch of `sample_shape` for its
// profile: an example model's name, a TorchScript file (a name with a '.' or a '/'), or a Hugging
// Face directory, of which only the config is read (models/llama_profile.h profiles it unbuilt) and
// whose sample is token ids [B, T]. Seeds torch's generator with 0 first. Throws
// pipetrain::BadInput naming --model or --sample-shape.
struct PlanningModel {
  torch::nn::Sequential sequential;  // no layers for a Hugging Face model
  torch::Tensor sample;
  std::string description;  // "mlp", "TorchScript m.pt", "llama DIR"
  std::optional<models::LlamaConfig> llama;
  int64_t layers() const {
    return llama ? llama->entries() : static_cast<int64_t>(sequential->size());
  }
};
PlanningModel load_planning_model(const std::string& model,
                                  const std::vector<int64_t>& sample_shape);

// Runs the model on the first rows and checks it against the targets (shape, class count, dtype).
void check_data_against_model(const BuiltModel& model, const BuiltData& data);
// A mini-batch of `batch_size` rows larger than the training set would repeat rows within one step
// (tensors) or make every batch the whole set (data sets): throws pipetrain::BadInput naming
// --batch-size and the largest that fits. Text samples windows and has no such limit.
void check_batch_size(const BuiltData& data, int64_t batch_size);

// Loss and accuracy (classification) over the test split, in batches of `batch` rows
// (train::evaluate). For text: the loss over fixed windows of the corpus. nullopt when the data
// has no test split.
using Evaluation = train::Evaluation;
std::optional<Evaluation> evaluate(const BuiltModel& model, const BuiltData& data,
                                   int64_t batch = 1000);

// The data's mini-batches of `batch_size` rows as a Trainer's batch source, each a pure function
// of the step: token samples in order (or shuffled per epoch), text windows drawn from (seed,
// step), tensor rows in order, data-set rows shuffled per epoch by the seeded loader.
// --data indexed: the options of its DocumentBatches (the spec's packing, shuffle, attention,
// padding; the model's pad id). Throws pipetrain::BadInput naming --pack.
train::DocumentBatchOptions document_batch_options(const ModelDataSpec& spec,
                                                   const BuiltModel& model, const BuiltData& data,
                                                   int64_t batch_size);
std::unique_ptr<train::BatchSource> make_batches(const ModelDataSpec& spec, const BuiltModel& model,
                                                 const BuiltData& data, int64_t batch_size);

// The largest batch of inputs `evaluate(model, data, batch)` runs (the test split's first rows,
// or the corpus's windows); undefined where it evaluates nothing. The memory check counts it.
torch::Tensor evaluation_batch(const BuiltModel& model, const BuiltData& data,
                               int64_t batch = 1000);

// One line for an evaluation: "eval loss 2.3456 nats (256 windows; unigram entropy 3.1700)" for
// text, "test loss 0.3210, test accuracy 88.95% (10000 images)" for a classifier, "test loss
// 0.1234" otherwise.
std::string describe_evaluation(const Evaluation& e, const BuiltData& data);

// What an inference model runs on: the weights (a pipetrain checkpoint's, or the model's own),
// the pipeline ranks and the device (`pipetrain eval` and `generate`'s --checkpoint, --stages,
// --device).
struct InferenceSpec {
  std::string checkpoint;  // "": the model's own weights (a Hugging Face DIR's, or --init random)
  int64_t stages = 1;
  std::string device = "cpu";
};

// A model for inference: built from `spec`, its weights restored from the checkpoint when one is
// named, in eval mode, run through `stages` pipeline ranks (a Pipe, forward only) on the device.
// Throws pipetrain::BadInput naming the flag (--checkpoint, --stages, --device) that does not fit.
class InferenceModel {
 public:
  InferenceModel(const ModelDataSpec& spec, const BuiltData& data, const InferenceSpec& inference);
  // Model inputs (a Hugging Face model: int64 ids [B, T]) -> outputs (logits [B, T, V]) on the
  // CPU, without gradients; with a layout, the token rows laid out by it
  // (data/sequence_layout.h).
  torch::Tensor forward(const torch::Tensor& inputs,
                        std::shared_ptr<const data::SequenceLayout> layout = nullptr);

  BuiltModel model;

 private:
  std::optional<Pipe> pipe_;
  torch::Device device_ = torch::kCPU;
};

std::string join_names(const std::vector<std::string>& names);

}  // namespace pipetrain::job
