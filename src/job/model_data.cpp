// Model and data from a ModelDataSpec (model_data.h).
#include "pipetrain/job/model_data.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "job_internal.h"
#include "pipetrain/base/message_of.h"
#include "pipetrain/data/packing.h"
#include "pipetrain/examples/data_error.h"
#include "pipetrain/examples/data_loader.h"
#include "pipetrain/examples/fashion_mnist.h"
#include "pipetrain/examples/model_registry.h"
#include "pipetrain/examples/synthetic.h"
#include "pipetrain/io/indexed_dataset.h"
#include "pipetrain/runtime/tensor_io.h"
#include "pipetrain/stage/device.h"
#include "pipetrain/stage/layer_call.h"
#include "pipetrain/stage/torchscript.h"
#include "pipetrain/train/checkpoint.h"
#include "pipetrain/train/token_batches.h"
#include "pipetrain/transport/c10d.h"

namespace pipetrain::job {

using namespace pipetrain::examples;  // the example models and data sets
namespace {

using UsageError = pipetrain::BadInput;
using detail::as_bad_input;
using detail::contains;

// The eval windows of a text corpus come from their own stream, never from a training step's.
constexpr uint64_t kTextEvalSeed = 0x7e57'da7aULL;
constexpr int64_t kTextEvalWindows = 256;

bool is_torchscript_path(const std::string& model) {
  return !is_hf_model(model) &&
         (model.find('/') != std::string::npos || model.find('.') != std::string::npos);
}

torch::Tensor load_flag_tensor(const std::string& flag, const std::string& path) {
  return as_bad_input(flag, [&] { return load_tensor(path); });
}

}  // namespace

std::string join_names(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

std::vector<std::string> data_names() {
  return {"fashion-mnist", "text", "synthetic", "tensors", "tokens", "indexed"};
}

bool is_hf_model(const std::string& model) {
  std::error_code error;
  return std::filesystem::is_directory(model, error);
}

models::LlamaConfig hf_config(const ModelDataSpec& spec) {
  return as_bad_input("--model " + spec.model,
                      [&] { return models::read_llama_config(spec.model); });
}

namespace {

// The combinations of a Hugging Face --model and --data tokens.
void check_hf_spec(const ModelDataSpec& args) {
  const bool hf = is_hf_model(args.model);
  if (args.init != "checkpoint" && args.init != "random") {
    throw UsageError("unknown --init '" + args.init + "'; valid: checkpoint, random");
  }
  if (!hf && args.init != "checkpoint") {
    throw UsageError("--init " + args.init + " draws the weights of a Hugging Face --model DIR; " +
                     args.model + " is not a directory");
  }
  const bool indexed = args.data == "indexed";
  if (!indexed && (!args.loss_mask_path.empty() || args.cross_document_attention ||
                   args.group_by_length || args.packing != "split" || args.pad_multiple != 0)) {
    throw UsageError(
        "--pack, --loss-mask-path, --cross-document-attention, --pad-multiple and "
        "--group-by-length lay out documents: they need --data indexed (got --data " +
        args.data + ")");
  }
  if (hf && args.data != "tokens" && !indexed) {
    throw UsageError("--model " + args.model + " is a Hugging Face language model: train it on " +
                     "--data tokens --token-file PATH --seq-len T or --data indexed --data-path "
                     "PREFIX --seq-len T (got --data " +
                     args.data + ")");
  }
  if (args.data != "tokens" && !indexed) return;
  if (!hf) {
    throw UsageError("--data " + args.data +
                     " trains a Hugging Face model: give --model DIR (config.json and "
                     "safetensors), got --model " +
                     args.model);
  }
  if (!indexed && args.token_file.empty()) {
    throw UsageError("--data tokens needs --token-file PATH");
  }
  if (indexed && args.data_path.empty()) {
    throw UsageError(
        "--data indexed needs --data-path PREFIX (PREFIX.idx and PREFIX.bin, "
        "Megatron's indexed dataset)");
  }
  if (args.seq_len < 1) {
    throw UsageError("--data " + args.data + " needs --seq-len T (ids per sample, >= 1), got " +
                     std::to_string(args.seq_len));
  }
  if (indexed) {
    parse_data_path(args.data_path);  // the shape of a blend, before any file is read
    as_bad_input("--pack", [&] { return data::parse_packing(args.packing); });
    if (args.group_by_length && args.packing != "none") {
      throw UsageError(
          "--group-by-length orders rows of one document by length: it needs --pack "
          "none (got --pack " +
          args.packing + ")");
    }
    if (args.pad_multiple < 0) {
      throw UsageError("--pad-multiple must be >= 0 (0: automatic), got " +
                       std::to_string(args.pad_multiple));
    }
    return;  // the dataset's index says its ids' width
  }
  if (args.token_bytes != 2 && args.token_bytes != 4) {
    throw UsageError("--token-bytes must be 2 (uint16 ids) or 4 (uint32), got " +
                     std::to_string(args.token_bytes));
  }
}

}  // namespace

PlanningModel load_planning_model(const std::string& model,
                                  const std::vector<int64_t>& sample_shape) {
  PlanningModel loaded;
  torch::manual_seed(0);
  if (is_hf_model(model)) {
    loaded.llama =
        as_bad_input("--model " + model, [&] { return models::read_llama_config(model); });
    if (sample_shape.size() != 2) {
      throw UsageError("--sample-shape of a language model is B,T (token ids)");
    }
    loaded.sample = torch::randint(loaded.llama->vocab_size, sample_shape, torch::kInt64);
    loaded.description = std::string(to_string(loaded.llama->architecture)) + " " + model;
    return loaded;
  }
  if (is_torchscript_path(model)) {  // as `train --model` tells them apart
    loaded.sequential =
        as_bad_input("--model " + model, [&] { return load_torchscript_sequential(model); });
    loaded.description = "TorchScript " + model;
  } else {
    loaded.sequential = make_model(model).sequential;  // ModelOptionError is a BadInput
    loaded.description = model;
  }
  loaded.sample = torch::randn(sample_shape);
  return loaded;
}

void check_batch_size(const BuiltData& data, int64_t batch_size) {
  if (data.corpus || !data.train_inputs.defined()) return;
  const int64_t rows = data.train_inputs.size(0);
  if (batch_size > rows) {
    throw UsageError("--batch-size " + std::to_string(batch_size) +
                     " is larger than the training set (" + std::to_string(rows) + " rows of " +
                     (data.name == "tensors" ? "--inputs" : "--data " + data.name) +
                     "); use --batch-size " + std::to_string(rows) + " or less");
  }
}

void check_model_data_spec(const ModelDataSpec& args) {
  const bool torchscript = is_torchscript_path(args.model);
  if (!torchscript && !is_hf_model(args.model) && !contains(model_names(), args.model)) {
    throw UsageError("unknown --model '" + args.model + "'; valid: " + join_names(model_names()) +
                     ", the path of a TorchScript file, or a Hugging Face checkpoint directory");
  }
  if (!contains(data_names(), args.data)) {
    throw UsageError("unknown --data '" + args.data + "'; valid: " + join_names(data_names()));
  }
  const bool tensors = args.data == "tensors" || !args.inputs_path.empty();
  check_hf_spec(args);
  if (torchscript && !tensors) {
    throw UsageError("--model " + args.model +
                     " is a TorchScript file: give its data with --inputs X.pt --targets Y.pt");
  }
  if (tensors && (args.inputs_path.empty() || args.targets_path.empty())) {
    throw UsageError("tensor data needs both --inputs and --targets (files written by torch.save)");
  }
  if (torchscript && args.loss.empty()) {
    throw UsageError("a TorchScript --model needs --loss mse or --loss cross-entropy");
  }
  if (!args.loss.empty() && args.loss != "mse" && args.loss != "cross-entropy") {
    throw UsageError("unknown --loss '" + args.loss + "'; valid: mse, cross-entropy");
  }
  if (args.data == "text" && args.model != "gpt") {
    throw UsageError("--data text trains a language model: use --model gpt (got --model " +
                     args.model + ")");
  }
  if (args.model == "gpt" && args.data != "text" && !tensors) {
    throw UsageError("--model gpt reads tokens: use --data text (got --data " + args.data + ")");
  }
  if (args.synthetic_samples < 1) {
    throw UsageError("--synthetic-samples must be at least 1, got " +
                     std::to_string(args.synthetic_samples));
  }
}

std::vector<std::pair<double, std::string>> parse_data_path(const std::vector<std::string>& path) {
  if (path.size() == 1) return {{1.0, path.front()}};
  const std::string usage =
      "--data-path takes one PREFIX, or a blend of weights and prefixes: W1 PREFIX1 W2 PREFIX2 "
      "... (each weight a number > 0)";
  if (path.empty() || path.size() % 2 != 0) {
    throw UsageError(usage + "; got " + std::to_string(path.size()) + " values");
  }
  std::vector<std::pair<double, std::string>> blend;
  for (size_t i = 0; i < path.size(); i += 2) {
    double weight = 0;
    size_t used = 0;
    try {
      weight = std::stod(path[i], &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != path[i].size() || !(weight > 0) || !std::isfinite(weight)) {
      throw UsageError(usage + "; '" + path[i] + "' is not such a weight");
    }
    blend.emplace_back(weight, path[i + 1]);
  }
  return blend;
}

SampleCost sample_cost(const BuiltModel& model, const BuiltData& data) {
  SampleCost cost;
  if (data.tokens && data.seq_len > 0) cost.tokens = data.seq_len;
  if (model.llama && data.seq_len > 0) {
    cost.flops_per_token = model.llama->training_flops_per_token(data.seq_len);
  }
  return cost;
}

BuiltData build_data(const ModelDataSpec& args) {
  BuiltData data;
  const bool tensors = args.data == "tensors" || !args.inputs_path.empty();
  data.name = tensors ? "tensors" : args.data;
  try {
    if (tensors) {
      data.train_inputs = load_flag_tensor("--inputs", args.inputs_path);
      data.train_targets = load_flag_tensor("--targets", args.targets_path);
      std::ostringstream problem;
      if (data.train_inputs.dim() < 1 || data.train_inputs.size(0) < 1) {
        problem << "--inputs " << args.inputs_path << " has shape " << data.train_inputs.sizes()
                << "; it needs at least one row on dim 0";
      } else if (data.train_targets.dim() < 1 ||
                 data.train_targets.size(0) != data.train_inputs.size(0)) {
        problem << "--inputs has " << data.train_inputs.size(0) << " rows but --targets has "
                << (data.train_targets.dim() < 1 ? 0 : data.train_targets.size(0)) << " (shape "
                << data.train_targets.sizes() << "); they must pair row by row";
      }
      if (!problem.str().empty()) throw UsageError(problem.str());
    } else if (args.data == "fashion-mnist") {
      const std::string dir = args.data_dir.empty() ? kFashionMnistDirectory : args.data_dir;
      LabeledImages train = read_fashion_mnist(Split::kTrain, dir);
      LabeledImages test = read_fashion_mnist(Split::kTest, dir);
      data.train_inputs = train.images;
      data.train_targets = train.labels;
      data.test_inputs = test.images;
      data.test_targets = test.labels;
      data.classification = true;
    } else if (args.data == "synthetic") {
      SyntheticData train = make_synthetic_classification(args.synthetic_samples, {1, 28, 28},
                                                          kFashionMnistClasses, args.seed);
      SyntheticData test =
          make_synthetic_classification(std::max<int64_t>(1, args.synthetic_samples / 4),
                                        {1, 28, 28}, kFashionMnistClasses, args.seed + 1);
      data.train_inputs = train.inputs;
      data.train_targets = train.targets;
      data.test_inputs = test.inputs;
      data.test_targets = test.targets;
      data.classification = true;
    } else if (args.data == "indexed") {
      const auto parts = parse_data_path(args.data_path);
      if (!args.loss_mask_path.empty() && args.loss_mask_path.size() != parts.size()) {
        throw UsageError("--loss-mask-path takes one PREFIX per dataset of --data-path (" +
                         std::to_string(parts.size()) + "), got " +
                         std::to_string(args.loss_mask_path.size()));
      }
      for (size_t d = 0; d < parts.size(); ++d) {
        const std::string mask = args.loss_mask_path.empty() ? "" : args.loss_mask_path[d];
        auto dataset = as_bad_input(
            mask.empty() ? "--data-path" : "--data-path/--loss-mask-path",
            [&] { return std::make_shared<const data::DocumentDataset>(parts[d].second, mask); });
        data.documents += dataset->documents();
        data.document_sources.push_back({parts[d].first, std::move(dataset)});
      }
      data.seq_len = args.seq_len;
    } else if (args.data == "tokens") {
      data.tokens = as_bad_input("--token-file", [&] {
        return std::make_shared<const io::TokenFile>(args.token_file, args.token_bytes);
      });
      data.seq_len = args.seq_len;
      if ((data.tokens->tokens() - 1) / args.seq_len < 1) {
        throw UsageError("--token-file " + args.token_file + " holds " +
                         std::to_string(data.tokens->tokens()) + " ids, fewer than one sample of " +
                         "--seq-len " + std::to_string(args.seq_len) + " needs (" +
                         std::to_string(args.seq_len + 1) + ")");
      }
    } else {  // text
      data.corpus =
          CharCorpus::from_file(args.text_file.empty() ? kDefaultCorpusPath : args.text_file);
    }
  } catch (const DataError& error) {
    throw UsageError("--data " + args.data + ": " + error.what());
  }
  return data;
}

namespace {

// A Hugging Face model: config.json read and checked against the sequence length, the entries
// this process holds built, their weights loaded (or drawn with --init random).
BuiltModel build_hf_model(const ModelDataSpec& args, const BuiltData& data,
                          const std::optional<std::vector<int64_t>>& entries,
                          const parallel::TensorParallel& tp, const std::vector<int64_t>& on_demand,
                          const parallel::ExpertParallel& ep, const parallel::ContextParallel& cp) {
  const models::LlamaConfig config = hf_config(args);
  if (data.seq_len > 0) {
    as_bad_input("--seq-len " + std::to_string(data.seq_len),
                 [&] { models::check_sequence_length(config, data.seq_len); });
  }
  if (tp.split()) {
    as_bad_input("--model " + args.model,
                 [&] { models::check_llama_tensor_parallel(config, tp.size()); });
  }
  models::LlamaModel llama = models::make_llama(config, models::LlamaBuildOptions()
                                                            .entries(entries)
                                                            .tensor_parallel(tp)
                                                            .expert_parallel(ep)
                                                            .context_parallel(cp));
  // The entries whose values wait (ZeRO-3 takes them a layer at a time), and the others'.
  auto deferred = std::make_shared<std::set<int64_t>>(on_demand.begin(), on_demand.end());
  const int64_t head = config.num_hidden_layers + 2;
  if (config.tie_word_embeddings && deferred->count(head)) deferred->insert(0);  // its table
  const models::LlamaEntryFilter now = [deferred](int64_t e) { return !deferred->count(e); };
  std::shared_ptr<const io::SafetensorsCheckpoint> checkpoint;
  if (args.init == "random") {
    models::init_llama_random(llama, args.seed, now);
  } else {
    checkpoint = as_bad_input("--model " + args.model, [&] {
      auto opened = std::make_shared<const io::SafetensorsCheckpoint>(
          io::SafetensorsCheckpoint::open(args.model));
      models::load_llama_weights(llama, *opened, now);
      return opened;
    });
  }
  BuiltModel model;
  if (!deferred->empty()) {
    // Each parameter's entry: the first that holds it (a tied table is the embedding's).
    auto entry_of = std::make_shared<std::map<const void*, int64_t>>();
    for (size_t e = 0; e < llama.sequential->size(); ++e) {
      for (const torch::Tensor& p : llama.sequential->ptr(e)->parameters()) {
        entry_of->emplace(p.unsafeGetTensorImpl(), static_cast<int64_t>(e));
      }
    }
    auto filled = std::make_shared<std::set<int64_t>>();
    model.fill_values = [llama, deferred, entry_of, filled, checkpoint,
                         seed = args.seed](const torch::Tensor& p) mutable {
      const auto found = entry_of->find(p.unsafeGetTensorImpl());
      if (found == entry_of->end()) return;
      const int64_t e = found->second;
      if (!deferred->count(e) || !filled->insert(e).second) return;
      const models::LlamaEntryFilter one = [e](int64_t entry) { return entry == e; };
      if (checkpoint) {
        models::load_llama_weights(llama, *checkpoint, one);
      } else {
        models::init_llama_random(llama, seed, one);
      }
    };
  }
  model.name = args.model;
  model.sequential = llama.sequential;
  model.tied_parameters = llama.tied_parameters;
  model.llama = llama.config;
  model.loss = models::causal_lm_loss;
  model.loss_name = "causal-lm-cross-entropy";
  if (tp.split()) {
    model.loss = [tp](const torch::Tensor& logits, const torch::Tensor& targets) {
      return models::vocab_parallel_causal_lm_loss(logits, targets, tp);
    };
    model.tensor_parallel_split = [config = llama.config,
                                   size = tp.size()](const std::string& name) {
      return models::tensor_parallel_split(name, *config, size);
    };
  }
  // What a checkpoint needs to rebuild the model anywhere (eval, export-hf): the config itself.
  model.options = {{"init", args.init},
                   {"hf_config", models::llama_config_json(config, "float32")}};
  return model;
}

}  // namespace

BuiltModel build_mirror_model(const ModelDataSpec& spec, const BuiltData& data, int tensor_parallel,
                              bool sequence_parallel, int expert_parallel, int context_parallel,
                              bool ulysses) {
  ModelDataSpec random = spec;
  random.init = "random";
  parallel::TensorParallel tp;
  if (tensor_parallel > 1) {
    tp = parallel::TensorParallel{C10dGroup::mirror(tensor_parallel), sequence_parallel};
  }
  parallel::ExpertParallel ep;
  if (expert_parallel > 1)
    ep = parallel::ExpertParallel{C10dGroup::mirror(expert_parallel), nullptr};
  parallel::ContextParallel cp;
  if (context_parallel > 1)
    cp = parallel::ContextParallel{C10dGroup::mirror(context_parallel), ulysses};
  return build_model(random, data, std::nullopt, tp, {}, ep, cp);
}

BuiltModel build_model(const ModelDataSpec& args, const BuiltData& data,
                       const std::optional<std::vector<int64_t>>& entries,
                       const parallel::TensorParallel& tp, const std::vector<int64_t>& on_demand,
                       const parallel::ExpertParallel& ep, const parallel::ContextParallel& cp) {
  if (is_hf_model(args.model)) return build_hf_model(args, data, entries, tp, on_demand, ep, cp);
  if (cp.split()) {
    throw UsageError(
        "--cp splits the attention of a Llama-family model (--model DIR with "
        "config.json); '" +
        args.model + "' has no context-parallel form");
  }
  if (tp.split()) {
    throw UsageError(
        "--tp splits the layers of a Llama-family model (--model DIR with "
        "config.json); '" +
        args.model + "' has no tensor-parallel form");
  }
  BuiltModel model;
  model.name = args.model;
  if (is_torchscript_path(args.model)) {
    model.torchscript = true;
    model.sequential =
        as_bad_input("--model", [&] { return load_torchscript_sequential(args.model); });
  } else {
    nlohmann::json options;
    try {
      options = nlohmann::json::parse(args.model_options);
    } catch (const nlohmann::json::exception& error) {
      throw UsageError("--model-options is not JSON: " + std::string(error.what()));
    }
    if (args.model == "gpt" && data.corpus && options.is_object() &&
        !options.contains("vocab_size")) {
      options["vocab_size"] = data.corpus->vocab_size();
    }
    try {
      ExampleModel example = make_model(args.model, options);
      model.sequential = example.sequential;
      model.tied_parameters = example.tied_parameters;
      model.options = example.options;
      if (args.model == "gpt") {
        model.loss = example.loss;
        model.loss_name = "gpt-cross-entropy";
      }
    } catch (const pipetrain::Error& error) {  // ModelOptionError among them
      throw UsageError("--model-options: " + std::string(error.what()));
    } catch (const c10::Error& error) {
      throw UsageError("--model-options: " + message_of(error));
    }
  }
  if (!model.loss) {
    const std::string name = args.loss.empty() ? "cross-entropy" : args.loss;
    model.loss_name = name;
    if (name == "mse") {
      model.loss = [](const torch::Tensor& output, const torch::Tensor& target) {
        return torch::mse_loss(output, target);
      };
    } else {
      model.loss = [](const torch::Tensor& output, const torch::Tensor& target) {
        return torch::nn::functional::cross_entropy(output, target);
      };
    }
  }
  return model;
}

void check_data_against_model(const BuiltModel& model, const BuiltData& data) {
  if (data.tokens) {
    as_bad_input("--token-file", [&] { data.tokens->check_vocabulary(model.llama->vocab_size); });
    return;
  }
  if (!data.document_sources.empty()) {
    for (const train::DocumentSource& source : data.document_sources) {
      as_bad_input("--data-path",
                   [&] { source.dataset->check_vocabulary(model.llama->vocab_size); });
    }
    return;
  }
  if (data.corpus) {
    const int64_t context = model.options.value("context", int64_t{0});
    if (context >= static_cast<int64_t>(data.corpus->text().size())) {
      throw UsageError("the corpus " + data.corpus->source() + " has " +
                       std::to_string(data.corpus->text().size()) +
                       " bytes, too few for windows of context " + std::to_string(context));
    }
    const int64_t vocab = model.options.value("vocab_size", int64_t{0});
    if (vocab < data.corpus->vocab_size()) {
      throw UsageError("--model-options vocab_size " + std::to_string(vocab) + " but the corpus " +
                       data.corpus->source() + " has " + std::to_string(data.corpus->vocab_size()) +
                       " distinct bytes");
    }
    return;
  }
  const torch::Tensor& targets = data.train_targets;
  const bool cross_entropy = model.loss_name == "cross-entropy";
  if (cross_entropy) {
    if (targets.scalar_type() != torch::kLong || targets.dim() != 1) {
      throw UsageError(
          "--loss cross-entropy needs --targets as class indices: a 1-D int64 tensor, got " +
          c10::str(targets.scalar_type(), " of shape ", targets.sizes()) +
          " (in Python: torch.save(labels.long(), path))");
    }
    if (targets.min().item<int64_t>() < 0) {
      throw UsageError("--targets holds the class index " +
                       std::to_string(targets.min().item<int64_t>()) +
                       "; class indices must be >= 0");
    }
  } else if (model.loss_name == "mse" && !torch::isFloatingType(targets.scalar_type())) {
    throw UsageError("--loss mse needs floating-point --targets, got " +
                     c10::str(targets.scalar_type()));
  }
  torch::Tensor output;
  torch::nn::Sequential layers = model.sequential;  // a handle: the holder's -> is const here
  const bool was_training = layers->is_training();
  try {
    torch::NoGradGuard no_grad;
    layers->eval();
    output = layers->forward(
        data.train_inputs.slice(0, 0, std::min<int64_t>(2, data.train_inputs.size(0))));
    layers->train(was_training);
  } catch (const std::exception& error) {
    layers->train(was_training);
    throw UsageError("the model's forward failed on the first rows of the data (shape " +
                     c10::str(data.train_inputs.sizes()) + ", dtype " +
                     c10::str(data.train_inputs.scalar_type()) + ")" +
                     where_forward_fails(layers, data.train_inputs) +
                     "; check that the inputs match the model's input: " + message_of(error));
  }
  if (cross_entropy) {
    const int64_t classes = output.dim() == 2 ? output.size(1) : -1;
    if (classes < 1) {
      throw UsageError("--loss cross-entropy needs model outputs of shape (rows, classes), got " +
                       c10::str(output.sizes()));
    }
    const int64_t largest = targets.max().item<int64_t>();
    if (largest >= classes) {
      throw UsageError("--targets holds the class index " + std::to_string(largest) +
                       " but the model outputs " + std::to_string(classes) +
                       " classes (valid indices 0.." + std::to_string(classes - 1) + ")");
    }
  } else if (model.loss_name == "mse") {
    if (output.sizes().slice(1) != targets.sizes().slice(1)) {
      throw UsageError("--loss mse: a model output row has shape " +
                       c10::str(output.sizes().slice(1)) + " but a --targets row has shape " +
                       c10::str(targets.sizes().slice(1)) + "; they must be equal");
    }
    if (output.scalar_type() != targets.scalar_type()) {
      throw UsageError("--loss mse: the model outputs " + c10::str(output.scalar_type()) +
                       " but --targets is " + c10::str(targets.scalar_type()) +
                       "; save the targets in the model's dtype");
    }
  }
}

train::DocumentBatchOptions document_batch_options(const ModelDataSpec& spec,
                                                   const BuiltModel& model, const BuiltData& data,
                                                   int64_t batch_size) {
  train::DocumentBatchOptions options(data.seq_len, batch_size);
  options.packing(as_bad_input("--pack", [&] { return data::parse_packing(spec.packing); }))
      .shuffle(spec.shuffle)
      .seed(spec.seed)
      .by_document(!spec.cross_document_attention)
      .pad_multiple(std::max<int64_t>(1, spec.pad_multiple))
      .group_by_length(spec.group_by_length);
  if (model.llama && model.llama->pad_token_id >= 0) options.pad_id(model.llama->pad_token_id);
  return options;
}

std::unique_ptr<train::BatchSource> make_batches(const ModelDataSpec& spec, const BuiltModel& model,
                                                 const BuiltData& data, int64_t batch_size) {
  if (!data.document_sources.empty()) {
    return std::make_unique<train::DocumentBatches>(
        data.document_sources, document_batch_options(spec, model, data, batch_size));
  }
  if (data.tokens) {
    return std::make_unique<train::TokenBatches>(data.tokens, data.seq_len, batch_size,
                                                 spec.shuffle, spec.seed);
  }
  if (data.corpus) {
    return std::make_unique<WindowBatches>(*data.corpus, batch_size,
                                           model.options.value("context", int64_t{64}), spec.seed);
  }
  if (data.name == "tensors") {
    return std::make_unique<train::TensorBatches>(data.train_inputs, data.train_targets,
                                                  batch_size);
  }
  return std::make_unique<LoaderBatches>(DataLoader(data.train_inputs, data.train_targets,
                                                    DataLoaderOptions(batch_size).seed(spec.seed)));
}

std::string describe_evaluation(const Evaluation& e, const BuiltData& data) {
  char text[160];
  if (data.corpus) {
    std::snprintf(text, sizeof text, "eval loss %.4f nats (%lld windows; unigram entropy %.4f)",
                  e.loss, static_cast<long long>(e.samples), data.corpus->unigram_entropy());
  } else if (e.accuracy >= 0) {
    std::snprintf(text, sizeof text, "test loss %.4f, test accuracy %.2f%% (%lld images)", e.loss,
                  100.0 * e.accuracy, static_cast<long long>(e.samples));
  } else {
    std::snprintf(text, sizeof text, "test loss %.4f", e.loss);
  }
  return text;
}

InferenceModel::InferenceModel(const ModelDataSpec& spec, const BuiltData& data,
                               const InferenceSpec& inference) {
  model = build_model(spec, data);
  if (!inference.checkpoint.empty()) {
    const std::string flag = "--checkpoint " + inference.checkpoint;
    const train::Checkpoint checkpoint =
        as_bad_input(flag, [&] { return train::load_checkpoint(inference.checkpoint); });
    as_bad_input(flag, [&] {
      train::restore_model(checkpoint, *model.sequential, train::NameMatch::kExact);
    });
  }
  model.sequential->eval();
  if (inference.stages < 1) throw UsageError("--stages must be at least 1");
  const std::vector<torch::Device> devices = as_bad_input("--device", [&] {
    return rank_devices(inference.device, {}, static_cast<int>(inference.stages));
  });
  if (inference.stages == 1) {
    model.sequential->to(devices[0]);
    device_ = devices[0];
    return;
  }
  pipe_ = as_bad_input("--stages", [&] {
    return Pipe(model.sequential,
                PipeOptions().stages(inference.stages).chunks(1).devices(devices));
  });
}

torch::Tensor InferenceModel::forward(const torch::Tensor& inputs,
                                      std::shared_ptr<const data::SequenceLayout> layout) {
  torch::NoGradGuard no_grad;
  if (pipe_) return (*pipe_)->forward(inputs, std::move(layout)).to(torch::kCPU);
  const data::LayoutScope scope(layout.get());
  return model.sequential->forward(inputs.to(device_)).to(torch::kCPU);
}

torch::Tensor evaluation_batch(const BuiltModel& model, const BuiltData& data, int64_t batch) {
  if (data.tokens || !data.document_sources.empty()) return {};
  if (data.corpus) {
    const TokenWindows windows = data.corpus->sample_windows(
        kTextEvalWindows, model.options.value("context", int64_t{64}), kTextEvalSeed, 0);
    return windows.inputs.narrow(0, 0, std::min<int64_t>(64, windows.inputs.size(0)));
  }
  if (!data.test_inputs.defined()) return {};
  return data.test_inputs.narrow(0, 0, std::min(batch, data.test_inputs.size(0)));
}

std::optional<Evaluation> evaluate(const BuiltModel& model, const BuiltData& data, int64_t batch) {
  // Evaluated by the library's evaluate_tokens and evaluate_documents.
  if (data.tokens || !data.document_sources.empty()) return std::nullopt;
  if (data.corpus) {
    const TokenWindows windows = data.corpus->sample_windows(
        kTextEvalWindows, model.options.value("context", int64_t{64}), kTextEvalSeed, 0);
    return train::evaluate(model.sequential, model.loss, windows.inputs, windows.targets,
                           train::EvaluateOptions().batch(64));
  }
  if (!data.test_inputs.defined()) return std::nullopt;
  return train::evaluate(model.sequential, model.loss, data.test_inputs, data.test_targets,
                         train::EvaluateOptions().batch(batch).classification(data.classification));
}

}  // namespace pipetrain::job
